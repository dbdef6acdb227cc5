"""Where a served step's time goes under load: `gptport serve` on bench_serve.py's random-weight model
directories, loaded by `gptport bench-serve` at one concurrency level, with the scheduler's phase
counters (gptport_scheduler_seconds_total: prefill, decode, sample, emit) and the server process's
CPU time read before and after; then onnxruntime's profiler on decode steps of that many busy slots
(rows of the static cache, 64-token prompts), per operator type. Writes
benchmarks/results/profile-serve-<shape>.json.

    python benchmarks/profile_serve.py [--shapes small,gpt2-124m] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from bench_serve import MAX_TOKENS, WORK, free_port, wait_healthy
from profile_decode import summarize

from gptport import contract
from gptport.machine import describe
from gptport.runtime.onnx_engine import graph_config, session_options
from gptport.runtime.slots import StaticSlots

HERE = Path(__file__).resolve().parent
TICK = os.sysconf("SC_CLK_TCK")


def metrics(url: str) -> dict[str, float]:
    """Every sample of the server's /metrics now, by its name with labels (`name{label="value"}`)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def phases(url: str) -> dict[str, float]:
    """The scheduler's seconds per phase, from /metrics."""
    prefix = 'gptport_scheduler_seconds_total{phase="'
    return {k[len(prefix):-2]: v for k, v in metrics(url).items() if k.startswith(prefix)}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def step_profile(d: Path, rows: int, threads: int, steps: int = 20) -> dict[str, Any]:
    """onnxruntime's profile of `steps` decode steps over `rows` slots, each filled with 64 tokens."""
    with tempfile.TemporaryDirectory() as tmp:
        opts = session_options(threads)
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tmp, "step")
        path = d / contract.onnx_file("fp32", contract.CACHE_STATIC)
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        config = graph_config(path, session.get_modelmeta().custom_metadata_map)
        slots = StaticSlots(session, config, rows)
        rng = np.random.default_rng(0)
        for s in range(rows):
            slots.append(s, rng.integers(1, config.vocab_size, 64))
        for _ in range(steps):
            slots.decode(list(range(rows)), rng.integers(1, config.vocab_size, rows))
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    return summarize(runs[-steps:], events)


def profile(shape: str, concurrency: int, threads: int) -> dict[str, Any]:
    d = WORK / shape
    if not (d / "model.static.onnx").exists():
        raise SystemExit(f"{d}: missing; run benchmarks/bench_serve.py first")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(WORK / f"{shape}-profile.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gptport.cli.main", "serve", str(d), "--port", str(port),
                                 "--threads", str(threads)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, proc)
        before, cpu0, t0 = phases(url), cpu_seconds(proc.pid), time.perf_counter()
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            subprocess.run([sys.executable, "-m", "gptport.cli.main", "bench-serve", url, "--concurrency",
                            str(concurrency), "--num-prompts", str(4 * concurrency), "--prompt-len", "64",
                            "--max-tokens", str(MAX_TOKENS[shape]), "--temperature", "0.8", "--json", f.name],
                           check=True)
            load = json.loads(Path(f.name).read_text())["results"][0]
        wall, cpu = time.perf_counter() - t0, cpu_seconds(proc.pid) - cpu0
        spent = {k: v - before.get(k, 0.0) for k, v in phases(url).items()}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    busy = sum(spent.values())
    return {"shape": shape, "concurrency": concurrency, "threads": threads,
            "machine": describe(), "wall_s": wall,
            "server_cpu_s": cpu, "scheduler_s": spent, "scheduler_busy_fraction": busy / wall,
            "phase_share": {k: v / busy for k, v in spent.items()},
            "output_tokens": load["total_output_tokens"], "output_throughput": load["output_throughput"],
            "median_tpot_ms": load["median_tpot_ms"],
            f"decode_step_{concurrency}_rows": step_profile(d, concurrency, threads)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    for shape in args.shapes.split(","):
        result = profile(shape, args.concurrency, args.threads)
        out = HERE / "results" / f"profile-serve-{shape}.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        share = ", ".join(f"{k} {100 * v:.1f}%" for k, v in sorted(result["phase_share"].items(),
                                                                       key=lambda kv: -kv[1]))
        print(f"{shape} at concurrency {args.concurrency}: {result['output_throughput']:.1f} tok/s; scheduler busy "
              f"{100 * result['scheduler_busy_fraction']:.0f}% of the wall time: {share}; server CPU "
              f"{result['server_cpu_s'] / result['wall_s']:.2f} cores")
        step = result[f"decode_step_{args.concurrency}_rows"]
        ops = ", ".join(f"{r['op']} {100 * r['share']:.0f}%" for r in step["by_op_type"][:3])
        print(f"  a decode step of {args.concurrency} rows: {step['us_per_step'] / 1000:.2f} ms: {ops}")


if __name__ == "__main__":
    main()
