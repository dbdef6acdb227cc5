"""Where one decode step's time goes, node by node: onnxruntime's profiler on batch-1 decoding.

For each model directory, precision and cache kind (static-cache graph, or the contract graph model.onnx
with concat): a prefill of 64 tokens and --steps decode steps with profiling on (2 threads) through the
step function `gptport generate` uses, one round per graph; the decode steps' events summarised per
operator type (time per step, node count) with the heaviest nodes and the time outside nodes (the
executor's per-run overhead); the prefill's the same way. `--batch B` steps B rows of equal length at once
(a serving step's shape). Defaults: the random-weight `small` and
`gpt2-124m` directories of benchmarks.decode.precisions (run it first).

    python -m benchmarks.decode.profile_ops [MODEL_DIR ...] [--precisions fp32] [--kv-caches static,concat]
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import cli, results
from benchmarks.harness.models import WORK
from benchmarks.harness.ort_profile import model_runs, summarize
from benchmarks.harness.run import Run

TOP_OPS = 12


def profile(path: Path, precision: str, cache: str, steps: int, threads: int, batch: int = 1) -> dict[str, Any]:
    """The decode steps' and the prefill's summaries of the graph at `path`."""
    import onnxruntime as ort

    from gptport.config import model_config_to_dict
    from gptport.runtime.engine import positions
    from gptport.runtime.onnx_engine import OnnxModel, graph_config, session_options

    with tempfile.TemporaryDirectory() as tmp:
        opts = session_options(threads)
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tmp, "decode")
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        config = graph_config(path, session.get_modelmeta().custom_metadata_map)
        model = OnnxModel(session, config, precision, "", cache=cache)  # the step fn generate uses
        step = model.step(last_only=True)
        ids = np.random.default_rng(0).integers(0, config.vocab_size, (batch, 64), dtype=np.int64)  # (B, 64)
        mask = np.ones_like(ids)
        step(ids, mask, positions(mask), model.empty_past(batch))  # warm-up: the profiled prefill is the second
        logits, past = step(ids, mask, positions(mask), model.empty_past(batch))
        for i in range(steps):
            nxt = logits[:, -1].argmax(-1)[:, None].astype(np.int64)  # (B, 1)
            mask = np.ones((batch, 65 + i), dtype=np.int64)
            logits, past = step(nxt, mask, np.full((batch, 1), 64 + i, dtype=np.int64), past)
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = model_runs(events)
    return {"config": model_config_to_dict(config), "decode": summarize(runs[-steps:], events),
            "prefill_64": summarize(runs[-steps - 1:-steps], events)}


def table_rows(graph: str, got: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for phase in ("decode", "prefill_64"):
        r = got[phase]
        rows.append({"table": "steps", "graph": graph, "phase": phase, "us_per_step": r["us_per_step"],
                     "us_in_nodes": r["us_in_nodes_per_step"], "us_outside_nodes": r["us_outside_nodes_per_step"],
                     "nodes": r["nodes_per_step"]})
        rows += [{"table": f"operators, {phase}", "graph": graph, **op} for op in r["by_op_type"][:TOP_OPS]]
    return rows


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("model_dirs", type=Path, nargs="*",
                    default=[WORK / "decode" / "small", WORK / "decode" / "gpt2-124m"])
    ap.add_argument("--precisions", default="fp32")
    ap.add_argument("--kv-caches", default="static,concat")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    from gptport import contract

    run, rows = Run(), []
    for d in args.model_dirs:
        for precision in args.precisions.split(","):
            for cache in args.kv_caches.split(","):
                path = d / contract.onnx_file(precision, cache)
                if not path.is_file():
                    raise SystemExit(f"{path}: missing; run python -m benchmarks.decode.precisions first")
                graph = f"{d.name} {path.name}"
                with run.round(graph=graph) as rnd:
                    rnd.data["profile"] = profile(path, precision, cache, args.steps, args.threads, args.batch)
                rows += table_rows(graph, rnd.data["profile"])
                for phase in ("decode", "prefill_64"):
                    r = rnd.data["profile"][phase]
                    print(f"{graph} {phase}: {r['us_per_step']:.0f} µs, {r['us_in_nodes_per_step']:.0f} in "
                          f"{r['nodes_per_step']} nodes, {r['us_outside_nodes_per_step']:.0f} outside them")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, cli.settings(args),
                                   label=args.label), args.results)


if __name__ == "__main__":
    main()
