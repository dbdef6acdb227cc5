"""Where one decode step's time goes, node by node: onnxruntime's profiler on batch-1 decoding.

Runs a prefill of 64 tokens and --steps decode steps with profiling on (2 threads) through the step
function `gptport generate` uses (static-cache graph by default, --kv-cache concat for model.onnx), keeps the decode
steps' events, and summarises them per operator type (time per step, node count) with the heaviest
nodes and the time outside nodes (the executor's per-run overhead); the prefill's the same way
("prefill_64"). Writes
benchmarks/results/profile-decode-<dir>-<precision>[-static].json.

    python benchmarks/profile_decode.py [MODEL_DIR] [--precision fp32] [--kv-cache static|concat] [--steps 32]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from gptport import contract
from gptport.config import model_config_to_dict
from gptport.runtime.engine import positions
from gptport.runtime.onnx_engine import OnnxModel, graph_config, session_options

HERE = Path(__file__).resolve().parent


def summarize(runs: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-operator time (µs per run), the heaviest nodes and the time outside nodes of these runs."""
    spans = [(r["ts"], r["ts"] + r["dur"]) for r in runs]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
             and any(a <= e["ts"] <= b for a, b in spans)]
    per_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    per_node: dict[str, float] = defaultdict(float)
    for e in nodes:
        op = e["args"].get("op_name", "?")
        per_op[op][0] += e["dur"]
        per_op[op][1] += 1
        per_node[f"{e['name'].removesuffix('_kernel_time')} ({op})"] += e["dur"]
    n = len(runs)
    run_us = sum(r["dur"] for r in runs) / n
    node_us = sum(e["dur"] for e in nodes) / n
    ops = sorted(({"op": k, "us_per_step": v[0] / n, "nodes": v[1] // n, "share": v[0] / n / run_us}
                  for k, v in per_op.items()), key=lambda r: -r["us_per_step"])
    top = sorted(({"node": k, "us_per_step": v / n} for k, v in per_node.items()), key=lambda r: -r["us_per_step"])
    return {"us_per_step": run_us, "us_in_nodes_per_step": node_us, "us_outside_nodes_per_step": run_us - node_us,
            "nodes_per_step": len(nodes) // n, "by_op_type": ops, "top_nodes": top[:15]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path, nargs="?", default=HERE / "work" / "decode" / "small")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--kv-cache", choices=[contract.CACHE_STATIC, contract.CACHE_CONCAT], default=contract.CACHE_STATIC)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    path = args.model_dir / contract.onnx_file(args.precision, args.kv_cache)
    with tempfile.TemporaryDirectory() as tmp:
        opts = session_options(args.threads)
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tmp, "decode")
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        config = graph_config(path, session.get_modelmeta().custom_metadata_map)
        model = OnnxModel(session, config, args.precision, "", cache=args.kv_cache)  # the step fn generate uses
        step = model.step(last_only=True)
        ids = np.random.default_rng(0).integers(0, config.vocab_size, (1, 64), dtype=np.int64)
        mask = np.ones_like(ids)
        step(ids, mask, positions(mask), model.empty_past(1))  # warm-up: the profiled prefill is the second
        logits, past = step(ids, mask, positions(mask), model.empty_past(1))
        for i in range(args.steps):
            nxt = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
            mask = np.ones((1, 65 + i), dtype=np.int64)
            logits, past = step(nxt, mask, np.array([[64 + i]], dtype=np.int64), past)
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    decode = summarize(runs[-args.steps:], events)
    prefill = summarize(runs[-args.steps - 1:-args.steps], events)
    result = {"model": str(path.relative_to(HERE.parent)) if path.is_relative_to(HERE.parent) else path.name,
              "config": model_config_to_dict(config), "precision": args.precision, "threads": args.threads,
              "decode_steps": args.steps,
              "onnxruntime": ort.__version__, **decode, "prefill_64": prefill}
    for label, r in (("decode step", decode), ("prefill of 64 tokens", prefill)):
        print(f"{path}: {r['us_per_step']:.0f} µs per {label}, {r['us_in_nodes_per_step']:.0f} in "
              f"{r['nodes_per_step']} nodes, {r['us_outside_nodes_per_step']:.0f} outside them")
        for row in r["by_op_type"][:12]:
            print(f"  {row['op']:<28}{row['us_per_step']:>9.1f} µs {row['share']:>6.1%}  ({row['nodes']} nodes)")
    name = f"{args.model_dir.name}-{args.precision}" + ("-static" if args.kv_cache == contract.CACHE_STATIC else "")
    out = HERE / "results" / f"profile-decode-{name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
