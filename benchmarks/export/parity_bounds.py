"""The export gate's error model, measured: how far healthy graphs lie from torch, and how far broken ones.

For each trained model directory, every quantity the parity gate compares (the logits, each layer's keys and
values) on the gate's cases, for
- the healthy graphs export writes: the plain contract graph, the one fused by onnxruntime's optimizer, the
  static-cache graph;
- torch float32 against torch float64 (the reference's own rounding, the gate's second term);
- deliberately broken graphs: one weight of a key channel in layer 0 moved by 10% of its matrix's largest
  |w|, the mask off by one (each row's first real position masked), the positions off by one.
Each row gives the quantity nearest the default bound (gptport.export.tolerance), its |Δ|, magnitude, torch's
float32 error and |Δ| / bound: the healthy graphs must sit well below 1 on every machine class, the broken
ones far above it. The vector class recorded is the one the CPU reports to programs (numpy's cpuid), so a
run under `qemu-x86_64 -cpu EPYC-Milan` (AVX2 kernels on an AVX-512 host) is named avx2 with a note.

    python -m benchmarks.export.parity_bounds MODEL_DIR [MODEL_DIR ...] [--graphs DIR]
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import cli, results
from benchmarks.harness.run import Run


def perturbed(src: Path, dst: Path, d_model: int, layer: int = 0) -> None:
    """A copy of the graph at `src` in which one weight of a key channel in layer `layer`'s query/key/value
    matrix (the `layer`-th initializer of shape (d_model, 3 d_model): the contract and the static-cache
    graphs store them in layer order) moved by 10% of that matrix's largest |w|."""
    import onnx

    proto = onnx.load(str(src))
    init = [i for i in proto.graph.initializer if list(i.dims) == [d_model, 3 * d_model]][layer]
    arr = onnx.numpy_helper.to_array(init).copy()  # (d_model, 3 d_model): q | k | v
    arr[d_model // 2, d_model + d_model // 3] += 0.1 * float(np.abs(arr).max())
    init.CopyFrom(onnx.numpy_helper.from_array(arr, init.name))
    onnx.save(proto, str(dst))


def mask_off_by_one(step: Callable) -> Callable:
    """A graph whose attention sees one position fewer: each row's first real position masked."""
    def run(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, past: Any) -> Any:
        m = mask.copy()
        if m.shape[1] > 1:
            m[np.arange(len(m)), m.argmax(axis=1)] = 0
        return step(ids, m, pos, past)
    return run


def positions_off_by_one(step: Callable) -> Callable:
    """A graph that places every token one position early (learned positions' counterpart of a wrong rotation)."""
    return lambda ids, mask, pos, past: step(ids, mask, np.maximum(pos - 1, 0), past)


def graphs(model_dir: Path, work: Path) -> dict[str, Path]:
    """The plain, optimized, static and broken graphs of the model, made once under `work`."""
    from gptport import tokenizer as bpe
    from gptport.export import contract_graph, exporter, variants
    from gptport.training.checkpoint import load_model

    out = {n: work / f"{n}.onnx" for n in ("plain", "optimized", "static", "broken")}
    if all(p.exists() for p in out.values()):
        return out
    model, card = load_model(model_dir, bpe.load(model_dir))
    meta = exporter.metadata(card, "fp32")
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    exporter.save(contract_graph.build(model.cfg, weights), out["plain"], meta)
    made, _ = variants.optimize(out["plain"], card.model)
    made.replace(out["optimized"])
    exporter.set_metadata(out["optimized"], meta)
    exporter.save_static(model, card, out["static"])
    perturbed(out["plain"], out["broken"], card.model.d_model)
    return out


def measure(model_dir: Path, work: Path) -> list[dict[str, Any]]:
    from gptport import tokenizer as bpe
    from gptport.export import validate
    from gptport.export.tolerance import Tolerance
    from gptport.runtime.onnx_engine import load_cpu
    from gptport.training.checkpoint import load_model

    paths = graphs(model_dir, work)
    model, _ = load_model(model_dir, bpe.load(model_dir))
    tol = Tolerance()
    plain = load_cpu(paths["plain"]).step
    runs = {("healthy", "plain"): validate.parity(model, plain(), tol),
            ("healthy", "optimized"): validate.parity(model, load_cpu(paths["optimized"]).step(), tol),
            ("healthy", "static"): validate.static_parity(model, load_cpu(paths["static"]), tol),
            ("healthy", "torch float64"): validate.parity(model, validate.exact_step(model), tol),
            ("broken", "a key weight +10%"): validate.parity(model, load_cpu(paths["broken"]).step(), tol),
            ("broken", "mask off by one"): validate.parity(model, mask_off_by_one(plain()), tol),
            ("broken", "positions off by one"): validate.parity(model, positions_off_by_one(plain()), tol)}
    rows = []
    for (kind, graph), parity_rows in runs.items():
        for r in parity_rows:
            w = r.worst
            rows.append({"table": kind, "model": model_dir.name, "graph": graph, "case": r.case, "quantity": w.quantity,
                         "diff": w.diff, "magnitude": w.magnitude, "torch_fp32_error": w.ref_error,
                         "relative": w.diff / w.magnitude if w.magnitude else 0.0, "of_bound": w.ratio})
    return rows


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """A healthy graph's case nearest its bound (over every model); a broken graph is refused when any case
    fails, so for it each model's case furthest past the bound, and the least of those over the models."""
    lines = []
    for kind in ("healthy", "broken"):
        for graph in dict.fromkeys(r["graph"] for r in rows if r["table"] == kind):
            sel = [r for r in rows if r["table"] == kind and r["graph"] == graph]
            per_model = [max((r for r in sel if r["model"] == m), key=lambda r: r["of_bound"])
                         for m in dict.fromkeys(r["model"] for r in sel)]
            near = max(per_model, key=lambda r: r["of_bound"]) if kind == "healthy" else \
                min(per_model, key=lambda r: r["of_bound"])
            lines.append(f"{kind:8} {graph:22} |Δ|/bound {near['of_bound']:9.3f} ({near['model']}, {near['case']}, "
                         f"{near['quantity']}: |Δ| {near['diff']:.2e}, magnitude {near['magnitude']:.3g})")
    return lines


def dispatched_vector_class() -> str:
    """The vector class the CPU reports to programs (cpuid, as numpy reads it): under an emulator it is the
    emulated CPU's, whatever /proc/cpuinfo says of the host."""
    from numpy._core._multiarray_umath import __cpu_features__ as features

    if features.get("AMX_TILE"):
        return "amx"
    return "avx512" if features.get("AVX512F") else "avx2" if features.get("AVX2") else "sse"


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("model_dirs", type=Path, nargs="+", help="trained model directories")
    ap.add_argument("--graphs", type=Path, help="keep each model's graphs under this folder and reuse them "
                    "(a run under an emulator then exports nothing itself)")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for d in args.model_dirs:
        if not (d / "model.safetensors").is_file():
            raise SystemExit(f"{d}: no model.safetensors; train one with `gptport train`")
        if args.graphs:
            (args.graphs / d.name).mkdir(parents=True, exist_ok=True)
            rows += measure(d, args.graphs / d.name)
        else:
            with tempfile.TemporaryDirectory() as work:
                rows += measure(d, Path(work))
    for line in summary(rows):
        print(line)
    from gptport.export.tolerance import ATOL, REF_FACTOR, RTOL

    doc = results.document(results.benchmark_name(__spec__), Run(), rows,
                           {"models": [d.name for d in args.model_dirs], "rtol": RTOL,
                            "ref_factor": REF_FACTOR, "atol": ATOL}, label=args.label)
    seen = dispatched_vector_class()
    if seen != doc["machine"]["vector_class"]:
        doc["notes"] = [*doc.get("notes", []), f"the CPU reported {seen} to programs (cpuid) while /proc/cpuinfo "
                        f"names the host's {doc['machine']['vector_class']}: an emulated CPU"]
        doc["machine"]["vector_class"] = seen
    print(f"wrote {results.write(doc, args.results)}")


if __name__ == "__main__":
    main()
