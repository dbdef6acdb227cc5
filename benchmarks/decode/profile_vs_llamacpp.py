"""Where gptport's time per decode token goes, beside llama.cpp's time per token on the same weights.

For bench_llamacpp.py's `small` model directory (random weights; its fp32 static-cache graph and F32
GGUF), in rounds that alternate the order: llama-bench's decode (-p 0 -n STEPS, 2 threads) as ms per
token; gptport's decode step as `gptport generate` runs it (the static graph's step function, last
position only, argmax in numpy) timed by the wall clock with onnxruntime's thread pool spinning (what
generate and bench do), spinning only while a step runs (what serve does), not spinning, and with 1
thread; and a profiled run (onnxruntime's profiler, spinning) per round that splits a step into its
operators and the executor's time outside them (the least disturbed round's profile, its shares
applied to the median session.run time); the Python side is the wall time outside session.run.
Writes benchmarks/results/profile-vs-llamacpp-<shape>.json.

    python benchmarks/profile_vs_llamacpp.py --llama-bench PATH [--shape small] [--steps 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
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
from bench_llamacpp import WORK
from profile_decode import summarize

from gptport import contract
from gptport.machine import describe
from gptport.runtime.engine import positions
from gptport.runtime.onnx_engine import OnnxModel, graph_config, session_options

HERE = Path(__file__).resolve().parent
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
        runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
        out["profile"] = summarize(runs[-steps:], events)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bench", type=Path, required=True)
    ap.add_argument("--shape", default="small")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3, help="llama-bench's runs per round")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    d = WORK / args.shape
    graph, gguf = d / contract.onnx_file("fp32", contract.CACHE_STATIC), d / "model.f32.gguf"
    if not graph.exists() or not gguf.exists():
        raise SystemExit(f"{d}: run benchmarks/bench_llamacpp.py --shapes {args.shape} first")
    t = args.threads
    variants = {"spin": (t, "always"), "spin_step": (t, "step"), "no_spin": (t, "never"), "one_thread": (1, "always")}
    rounds = []
    for i in range(args.rounds):
        runs: dict[str, Any] = {}
        order = ["llama_cpp", *variants] if i % 2 == 0 else [*variants, "llama_cpp"]
        for name in order:
            if name == "llama_cpp":
                runs[name] = {"ms_per_token": llama_ms(args.llama_bench, gguf, args.steps, args.repeat, t)}
            else:
                runs[name] = decode(graph, *variants[name], args.steps)
        with tempfile.TemporaryDirectory() as tmp:
            runs["profiled"] = decode(graph, t, "always", args.steps, tmp)
        rounds.append({"order": order, **runs})
    profiled = min((r["profiled"] for r in rounds), key=lambda p: p["profile"]["us_per_step"])
    med = {name: statistics.median(r[name]["wall_ms"] for r in rounds) for name in variants}
    llama = statistics.median(r["llama_cpp"]["ms_per_token"] for r in rounds)
    run_ms = statistics.median(r["spin"]["session_run_ms"] for r in rounds)
    prof = profiled["profile"]
    scale = run_ms / (prof["us_per_step"] / 1e3)  # the profiler's own cost taken out of its shares
    breakdown = {"gptport_ms_per_token": med["spin"], "llama_cpp_ms_per_token": llama,
                 "extra_ms_per_token": med["spin"] - llama,
                 "python_outside_session_run_ms": med["spin"] - run_ms, "session_run_ms": run_ms,
                 "executor_outside_nodes_ms": prof["us_outside_nodes_per_step"] / 1e3 * scale,
                 "in_nodes_ms": prof["us_in_nodes_per_step"] / 1e3 * scale,
                 "by_op_type_ms": {r["op"]: r["us_per_step"] / 1e3 * scale for r in prof["by_op_type"]},
                 "nodes_per_step": prof["nodes_per_step"], "no_spin_ms_per_token": med["no_spin"],
                 "spin_step_ms_per_token": med["spin_step"],
                 "one_thread_ms_per_token": med["one_thread"]}
    result = {"benchmark": "time per decode token, gptport's static-cache fp32 step against llama-bench's F32",
              "machine": describe(), "shape": args.shape, "threads": t, "steps": args.steps, "rounds": rounds,
              "breakdown": breakdown, "onnxruntime": ort.__version__}
    out = HERE / "results" / f"profile-vs-llamacpp-{args.shape}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{result['machine']['cpu']}, {t} threads, {args.shape} fp32 decode, {args.rounds} rounds (medians), "
          "ms per token:")
    print(f"  llama.cpp {llama:.3f}; gptport {med['spin']:.3f} (spinning within a step only {med['spin_step']:.3f}, "
          f"no spinning {med['no_spin']:.3f}, "
          f"1 thread {med['one_thread']:.3f}); extra {med['spin'] - llama:+.3f}")
    print(f"  gptport: session.run {run_ms:.3f} = nodes {breakdown['in_nodes_ms']:.3f} + executor "
          f"{breakdown['executor_outside_nodes_ms']:.3f}; outside session.run (Python, binding, argmax) "
          f"{breakdown['python_outside_session_run_ms']:.3f}")
    for op, ms in list(breakdown["by_op_type_ms"].items())[:8]:
        print(f"    {op:<28}{ms:>7.3f} ms")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
