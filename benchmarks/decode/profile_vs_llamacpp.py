"""Where gptport's time per decode token goes, beside llama.cpp's time per token on the same weights.

For benchmarks.decode.vs_llamacpp's `small` model directory (random weights; its fp32 static-cache graph
and F32 GGUF), in rounds that alternate the order: llama-bench's decode (-p 0 -n STEPS, 2 threads) as ms per
token; gptport's decode step as `gptport generate` runs it (the static graph's step function, last
position only, argmax in numpy) timed by the wall clock with onnxruntime's thread pool spinning (what
generate and bench do), spinning only while a step runs (what serve does), not spinning, and with 1
thread; and a profiled run (onnxruntime's profiler, spinning) per round that splits a step into its
operators and the executor's time outside them (the least disturbed round's profile, its shares
applied to the median session.run time); the Python side is the wall time outside session.run.

    python -m benchmarks.decode.profile_vs_llamacpp --llama-bench PATH [--shape small] [--steps 128] [--rounds 3]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.harness import cli, results
from benchmarks.harness.models import WORK
from benchmarks.harness.ort_profile import model_runs, summarize
from benchmarks.harness.run import Run
from gptport import contract
from gptport.runtime.engine import positions
from gptport.runtime.onnx_engine import OnnxModel, graph_config, session_options

PROMPT = 64


def llama_ms(bench: Path, gguf: Path, steps: int, repeat: int, threads: int) -> float:
    """llama-bench's mean decode time per token (ms), tg STEPS after its warm-up."""
    r = subprocess.run([str(bench), "-m", str(gguf), "-t", str(threads), "-p", "0", "-n", str(steps), "-r", str(repeat),
                        "-o", "json"], check=True, capture_output=True, text=True)
    return 1e3 / json.loads(r.stdout)[0]["avg_ts"]


def decode(path: Path, threads: int, spin: str, steps: int, profile_dir: str | None = None) -> dict[str, Any]:
    """Mean wall ms per decode step after a 64-token prefill (a warm-up prefill first), and the share of
    it spent in session.run; with `profile_dir`, onnxruntime's profile of the decode steps."""
    opts = session_options(threads, spin)
    if profile_dir:
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(profile_dir, "decode")
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    config = graph_config(path, session.get_modelmeta().custom_metadata_map)
    model = OnnxModel(session, config, "fp32", "", cache=contract.CACHE_STATIC)
    step = model.step(last_only=True)
    run_s = [0.0]
    real_run = session.run_with_iobinding

    def timed_run(*args: Any, **kwargs: Any) -> Any:  # session.run's own share of a step
        t = time.perf_counter()
        out = real_run(*args, **kwargs)
        run_s[0] += time.perf_counter() - t
        return out

    session.run_with_iobinding = timed_run  # type: ignore[method-assign]
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (1, PROMPT), dtype=np.int64)
    mask = np.ones_like(ids)
    step(ids, mask, positions(mask), model.empty_past(1))
    logits, past = step(ids, mask, positions(mask), model.empty_past(1))
    run_s[0], walls = 0.0, []
    for i in range(steps):
        t = time.perf_counter()
        nxt = logits[:, -1].argmax(-1)[:, None].astype(np.int64)  # (1, 1): the loop's greedy choice
        logits, past = step(nxt, np.ones((1, PROMPT + 1 + i), dtype=np.int64), np.array([[PROMPT + i]]), past)
        walls.append(time.perf_counter() - t)
    out: dict[str, Any] = {"wall_ms": 1e3 * statistics.mean(walls), "wall_ms_median": 1e3 * statistics.median(walls),
                           "session_run_ms": 1e3 * run_s[0] / steps}
    if profile_dir:
        events = json.loads(Path(session.end_profiling()).read_text())
        out["profile"] = summarize(model_runs(events)[-steps:], events)
    return out


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--llama-bench", type=Path, required=True)
    ap.add_argument("--shape", default="small")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3, help="llama-bench's runs per round")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    d = WORK / "llamacpp" / args.shape
    graph, gguf = d / contract.onnx_file("fp32", contract.CACHE_STATIC), d / "model.f32.gguf"
    if not graph.exists() or not gguf.exists():
        raise SystemExit(f"{d}: run python -m benchmarks.decode.vs_llamacpp --shapes {args.shape} first")
    t = args.threads
    variants = {"spin": (t, "always"), "spin_step": (t, "step"), "no_spin": (t, "never"), "one_thread": (1, "always")}
    run = Run()
    for rnd in run.series(args.rounds):
        for name in rnd.order(["llama_cpp", *variants]):
            if name == "llama_cpp":
                rnd.data[name] = {"ms_per_token": llama_ms(args.llama_bench, gguf, args.steps, args.repeat, t)}
            else:
                rnd.data[name] = decode(graph, *variants[name], args.steps)
        with tempfile.TemporaryDirectory() as tmp:
            rnd.data["profiled"] = decode(graph, t, "always", args.steps, tmp)
    kept = [r.data for r in run.kept()]
    profiled = min((r["profiled"] for r in kept), key=lambda p: p["profile"]["us_per_step"])
    med = {name: statistics.median(r[name]["wall_ms"] for r in kept) for name in variants}
    llama = statistics.median(r["llama_cpp"]["ms_per_token"] for r in kept)
    run_ms = statistics.median(r["spin"]["session_run_ms"] for r in kept)
    prof = profiled["profile"]
    scale = run_ms / (prof["us_per_step"] / 1e3)  # the profiler's own cost taken out of its shares
    parts = {"llama.cpp": llama, "gptport (spinning)": med["spin"], "gptport, spinning within a step only":
             med["spin_step"], "gptport, not spinning": med["no_spin"], "gptport, 1 thread": med["one_thread"],
             "gptport's extra over llama.cpp": med["spin"] - llama,
             "gptport: session.run": run_ms,
             "gptport: outside session.run (Python, binding, argmax)": med["spin"] - run_ms,
             "gptport: in nodes": prof["us_in_nodes_per_step"] / 1e3 * scale,
             "gptport: executor outside nodes": prof["us_outside_nodes_per_step"] / 1e3 * scale}
    rows = [{"table": "ms per decode token", "part": k, "ms": v} for k, v in parts.items()]
    rows += [{"table": "gptport's nodes by operator", "op": r["op"], "ms": r["us_per_step"] / 1e3 * scale,
              "nodes": r["nodes"]} for r in prof["by_op_type"]]
    settings = cli.settings(args, graph="model.static.onnx fp32", gguf="F32",
                            nodes_per_step=prof["nodes_per_step"])
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label),
                  args.results)
    print(f"{t} threads, {args.shape} fp32 decode, medians of the kept rounds, ms per token:")
    for r in rows:
        print(f"  {r.get('part') or r['op']:<58}{r['ms']:>8.3f}")


if __name__ == "__main__":
    main()
