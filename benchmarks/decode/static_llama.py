"""The Llama family's static-cache graph on the CPU, at two shapes with seeded random weights (speed does not
depend on what weights learned): `llama-tiny` (the preset, vocabulary 4096) and `smollm2` (SmolLM2-135M's:
30 layers, d_model 576, 9 query heads over 3 key/value heads of 64, SwiGLU 1536 wide, vocabulary 49152, tied,
rope theta 100000; n_ctx 2048 here, which a decode at a few hundred positions does not feel).

- `forms`: the operators that write RMSNorm and SwiGLU (graph_body.Forms): Add + RMSNormalization (onnx,
  opset 23), SkipSimplifiedLayerNormalization (com.microsoft) or Add + SimplifiedLayerNormalization
  (onnxruntime's, which onnx's checker refuses); SwiGLU's gate and up as one MatMul of [gate | up] then
  Split, or two MatMuls. A decode step of 1 and of 16 rows (StaticSlots, as serve steps them) holding
  `--held` positions under onnxruntime's profiler: the median step, and the median µs per step of the
  norms' nodes (with the residual Adds a fused norm absorbs) and of the MLP's (MatMul, Split, SiLU; every
  MatMul counted, those outside the MLP being the same in each form), each form in each round, the forms'
  order rotating. The nodes' sums resolve differences of a few percent that a shared host's noise hides
  in the whole step.
- `graphs`: the static-cache graph (the default forms) against the contract graph (model.onnx as export
  writes it: torch.export, then onnxruntime's transformer optimizer), both through the step function
  `gptport generate` uses: a prompt of `--held` tokens in 1 and in 16 rows, then `--steps` greedy decode
  steps, each timed; decode tok/s = rows / the median step. Interleaved: each round runs both graphs,
  alternating which goes first.

    python -m benchmarks.decode.static_llama [--parts forms,graphs] [--shapes llama-tiny,smollm2] [--rounds 3]
        [--held 128] [--rows 1,16]
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import cli, results
from benchmarks.harness.ort_profile import model_runs
from benchmarks.harness.run import Run, say

LLAMA = {"norm": "rmsnorm", "mlp": "swiglu", "pos_encoding": "rope", "bias": False, "dropout": 0.0}
SHAPES: dict[str, dict[str, Any]] = {
    "llama-tiny": {"vocab_size": 4096, "n_ctx": 256, "d_model": 192, "n_layer": 4, "n_head": 4, "n_kv_head": 2,
                   "tie_embeddings": False, **LLAMA},
    "smollm2": {"vocab_size": 49152, "n_ctx": 2048, "d_model": 576, "n_layer": 30, "n_head": 9, "n_kv_head": 3,
                "head_dim": 64, "d_ff": 1536, "rope_theta": 100000.0, "tie_embeddings": True, **LLAMA},
}
FORMS = [("onnx", "fused"), ("onnx", "apart"), ("skip", "fused"), ("simplified", "fused")]
ROWS = [1, 16]  # --rows


def random_model(shape: str) -> Any:
    """The torch GPT of `shape` with seeded random weights (GPT's own initialisation), in eval mode."""
    import torch

    from gptport.config import ModelConfig
    from gptport.training.model import GPT

    torch.manual_seed(0)
    return GPT(ModelConfig(**SHAPES[shape])).eval()


def save(proto: Any, path: Path, config: Any, cache: str) -> Path:
    """`proto` with the metadata the runtime reads (its config, its cache kind), at `path`."""
    import json

    import onnx

    from gptport import contract
    from gptport.config import model_config_to_dict

    onnx.helper.set_model_props(proto, {contract.META_CONFIG: json.dumps(model_config_to_dict(config)),
                                        contract.META_CACHE: cache})
    onnx.save_model(proto, str(path))
    return path


def open_graph(path: Path, config: Any, cache: str, threads: int) -> Any:
    import onnxruntime as ort

    from gptport.runtime.onnx_engine import OnnxModel, session_options

    session = ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
    return OnnxModel(session, config, "fp32", "", cache=cache)


NORM_OPS = {"RMSNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "Add"}
MLP_OPS = {"MatMul", "Split", "Sigmoid", "Mul", "QuickGelu"}  # every MatMul: the others are the same in each form


def profiled_steps(path: Path, config: Any, rows: int, held: int, repeat: int, threads: int) -> dict[str, float]:
    """Median µs per decode step of `rows` rows holding `held` positions (StaticSlots, serve's step) under
    onnxruntime's profiler: the whole run, the norms' nodes (with the Adds of the residual sums they may
    absorb) and the MLP's (with every MatMul, which the forms leave alike but the MLP's)."""
    import json
    import os

    import onnxruntime as ort

    from gptport.runtime.onnx_engine import session_options
    from gptport.runtime.slots import StaticSlots

    with tempfile.TemporaryDirectory() as tmp:
        opts = session_options(threads)
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tmp, "forms")
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        slots = StaticSlots(session, config, rows)
        ids = np.arange(1, held + 1, dtype=np.int64) % config.vocab_size
        for r in range(rows):
            slots.append(r, ids)
        for _ in range(repeat + 3):
            slots.lengths[:] = held
            slots.decode(list(range(rows)), np.ones(rows, dtype=np.int64))
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = model_runs(events)[-repeat:]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    per: dict[str, list[float]] = {"step": [], "norms": [], "mlp": []}
    for run in runs:
        inside = [e for e in nodes if run["ts"] <= e["ts"] <= run["ts"] + run["dur"]]
        per["step"].append(run["dur"])
        per["norms"].append(sum(e["dur"] for e in inside if e["args"].get("op_name") in NORM_OPS))
        per["mlp"].append(sum(e["dur"] for e in inside if e["args"].get("op_name") in MLP_OPS))
    return {k: float(np.median(v)) for k, v in per.items()}


def decode_tok_s(model: Any, rows: int, held: int, steps: int) -> float:
    """Decode tok/s through the graph's step function (generate's): a prompt of `held` tokens per row, then
    `steps` greedy steps timed."""
    from gptport.runtime.engine import positions

    step = model.step(last_only=True)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (rows, held), dtype=np.int64)
    mask = np.ones_like(ids)
    logits, past = step(ids, mask, positions(mask), model.empty_past(rows))
    times = []
    for i in range(steps):
        nxt = logits[:, -1].argmax(-1)[:, None].astype(np.int64)  # (rows, 1)
        mask = np.ones((rows, held + i + 1), dtype=np.int64)
        t0 = time.perf_counter()
        logits, past = step(nxt, mask, np.full((rows, 1), held + i, dtype=np.int64), past)
        times.append(time.perf_counter() - t0)
    return rows / float(np.median(times))  # the median step: a neighbour's burst on a shared host skews the mean


def forms(run: Run, shape: str, tmp: Path, args: Any) -> None:
    from gptport.export import gqa_graph
    from gptport.export.graph_body import Forms

    model = random_model(shape)
    weights = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    paths = {}
    for rms, swiglu in FORMS:
        name = f"{rms}/{swiglu}"
        proto = gqa_graph.build(model.cfg, weights, Forms(rms, swiglu))
        paths[name] = save(proto, tmp / f"{shape}-{rms}-{swiglu}.onnx", model.cfg, "static")
    del model, weights
    for rnd in run.series(args.rounds, part="forms", shape=shape):
        for name in rnd.rotation(list(paths)):
            rnd.data[name] = {str(r): profiled_steps(paths[name], SHAPE_CFG[shape], r, args.held, args.repeat,
                                                     args.threads) for r in ROWS}
            say(f"{shape} {name}: " + ", ".join(f"{r} rows {v['step'] / 1e3:.2f} ms (norms {v['norms']:.0f} µs, mlp "
                                                f"{v['mlp']:.0f} µs)" for r, v in rnd.data[name].items()))


def forms_rows(run: Run, shape: str) -> list[dict[str, Any]]:
    """Each form's medians over the kept rounds: the step, the norms' µs, the MLP's µs."""
    rows = []
    for rms, swiglu in FORMS:
        for r in ROWS:
            got = run.values(f"{rms}/{swiglu}", part="forms", shape=shape)
            med = {k: statistics.median(v[str(r)][k] for v in got) for k in ("step", "norms", "mlp")}
            rows.append({"table": "forms", "shape": shape, "rms": rms, "swiglu": swiglu, "rows": r,
                         "step_ms": med["step"] / 1e3, "norms_us": med["norms"], "mlp_us": med["mlp"],
                         "decode_tok_s": r / med["step"] * 1e6})
    return rows


def graphs(run: Run, shape: str, tmp: Path, args: Any) -> None:
    from gptport import contract
    from gptport.errors import GptportError
    from gptport.export import contract_graph, gqa_graph, variants

    model = random_model(shape)
    weights = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    paths = {"static": save(gqa_graph.build(model.cfg, weights), tmp / f"{shape}-static.onnx", model.cfg,
                            contract.CACHE_STATIC)}
    plain = save(contract_graph.build(model.cfg, weights), tmp / f"{shape}-plain.onnx", model.cfg,
                 contract.CACHE_CONCAT)
    try:  # what export writes as model.onnx by default
        optimized, _ = variants.optimize(plain, model.cfg)
        paths["contract"] = optimized
    except (GptportError, ValueError, IndexError, KeyError) as e:
        say(f"{shape}: the transformer optimizer failed ({e}); the contract graph is the builder's plain one")
        paths["contract"] = plain
    del model, weights
    held = held_positions(shape, args)
    for rnd in run.series(args.rounds, part="graphs", shape=shape):
        for name in rnd.order(list(paths)):
            graph = open_graph(paths[name], SHAPE_CFG[shape], contract.CACHE_STATIC if name == "static"
                               else contract.CACHE_CONCAT, args.threads)
            rnd.data[name] = {str(r): decode_tok_s(graph, r, held, args.steps) for r in ROWS}
            say(f"{shape} {name}: " + ", ".join(f"{r} rows {v:.1f} tok/s" for r, v in rnd.data[name].items()))


def graphs_rows(run: Run, shape: str, held: int) -> list[dict[str, Any]]:
    """Each graph's median decode tok/s over the kept rounds, and their ratio."""
    rows = []
    for r in ROWS:
        tok_s = {name: statistics.median(v[str(r)] for v in run.values(name, part="graphs", shape=shape))
                 for name in ("static", "contract")}
        rows.append({"table": "graphs", "shape": shape, "rows": r, "held": held, "static_tok_s": tok_s["static"],
                     "contract_tok_s": tok_s["contract"], "static_over_contract": tok_s["static"] / tok_s["contract"]})
    return rows


SHAPE_CFG: dict[str, Any] = {}


def held_positions(shape: str, args: Any) -> int:
    return min(args.held, SHAPE_CFG[shape].n_ctx - args.steps - 1)


def main() -> None:
    from gptport.config import ModelConfig

    ap = cli.parser(__doc__)
    ap.add_argument("--parts", default="forms,graphs")
    ap.add_argument("--shapes", default="llama-tiny,smollm2")
    ap.add_argument("--forms-shapes", default="smollm2", help="the shapes the forms are compared at")
    ap.add_argument("--held", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--rows", default="1,16", help="the decode batches, comma-separated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    SHAPE_CFG.update({s: ModelConfig(**c) for s, c in SHAPES.items()})
    ROWS[:] = [int(r) for r in args.rows.split(",")]
    run, rows = Run(), []
    parts = args.parts.split(",")
    forms_shapes = args.forms_shapes.split(",") if "forms" in parts else []
    graphs_shapes = args.shapes.split(",") if "graphs" in parts else []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in forms_shapes:
            forms(run, shape, Path(tmp), args)
        for shape in graphs_shapes:
            graphs(run, shape, Path(tmp), args)
    for shape in forms_shapes:  # once every round is judged
        rows += forms_rows(run, shape)
    for shape in graphs_shapes:
        rows += graphs_rows(run, shape, held_positions(shape, args))
    for row in rows:
        print(row, flush=True)
    results.write(results.document(results.benchmark_name(__spec__), run, rows, cli.settings(args), label=args.label),
                  args.results)


if __name__ == "__main__":
    main()
