"""Where a served step's time goes under load: `gptport serve` on the serving benchmarks' random-weight model
directories, loaded by `gptport bench-serve` at one concurrency level, with the scheduler's phase
counters (gptport_scheduler_seconds_total: prefill, decode, sample, emit) and the server process's
CPU time read before and after; then onnxruntime's profiler on decode steps of that many busy slots
(rows of the static cache, 64-token prompts), per operator type. One round per shape.

    python -m benchmarks.serve.profile_phases [--shapes small,gpt2-124m] [--concurrency 16]
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.harness import cli, results
from benchmarks.harness.loads import MAX_TOKENS, bench_serve, phases
from benchmarks.harness.models import WORK
from benchmarks.harness.ort_profile import model_runs, summarize
from benchmarks.harness.run import Run
from benchmarks.harness.servers import gptport_serve, served
from gptport import contract
from gptport.runtime.onnx_engine import graph_config, session_options
from gptport.runtime.slots import StaticSlots

TICK = os.sysconf("SC_CLK_TCK")
TOP_OPS = 8


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
    return summarize(model_runs(events)[-steps:], events)


def profile(shape: str, concurrency: int, threads: int) -> dict[str, Any]:
    d = WORK / "serve" / shape
    if not (d / "model.static.onnx").exists():
        raise SystemExit(f"{d}: missing; run python -m benchmarks.serve.throughput --shapes {shape} first")

    def run(url: str, proc: Any) -> dict[str, Any]:
        before, cpu0, t0 = phases(url), cpu_seconds(proc.pid), time.perf_counter()
        load = bench_serve(url, "--concurrency", str(concurrency), "--num-prompts", str(4 * concurrency),
                           "--prompt-len", "64", "--max-tokens", str(MAX_TOKENS[shape]), "--temperature", "0.8")[0]
        wall, cpu = time.perf_counter() - t0, cpu_seconds(proc.pid) - cpu0
        spent = {k: v - before.get(k, 0.0) for k, v in phases(url).items()}
        return {"load": load, "wall_s": wall, "server_cpu_s": cpu, "scheduler_s": spent}

    got = served(gptport_serve(d, "--threads", str(threads)),
                 WORK / "serve" / f"{shape}-profile.log", run)
    got["decode_step"] = step_profile(d, concurrency, threads)
    return got


def table_rows(shape: str, concurrency: int, got: dict[str, Any]) -> list[dict[str, Any]]:
    busy = sum(got["scheduler_s"].values())
    step = got["decode_step"]
    rows = [{"shape": shape, "concurrency": concurrency, "output_throughput": got["load"]["output_throughput"],
             "median_tpot_ms": got["load"]["median_tpot_ms"], "scheduler_busy_fraction": busy / got["wall_s"],
             "server_cores": got["server_cpu_s"] / got["wall_s"],
             **{f"{k}_share": v / busy for k, v in sorted(got["scheduler_s"].items(), key=lambda kv: -kv[1])},
             "decode_step_ms": step["us_per_step"] / 1e3}]
    rows += [{"table": f"a decode step of {concurrency} rows, by operator", "shape": shape, **op}
             for op in step["by_op_type"][:TOP_OPS]]
    return rows


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    run, rows = Run(), []
    for shape in args.shapes.split(","):
        with run.round(shape=shape) as rnd:
            rnd.data.update(profile(shape, args.concurrency, args.threads))
        rows += table_rows(shape, args.concurrency, rnd.data)
        r = rows[-1 - min(TOP_OPS, len(rnd.data["decode_step"]["by_op_type"]))]
        print(f"{shape} at concurrency {args.concurrency}: {r['output_throughput']:.1f} tok/s; scheduler busy "
              f"{100 * r['scheduler_busy_fraction']:.0f}% of the wall time; server CPU {r['server_cores']:.2f} cores; "
              f"a decode step of {args.concurrency} rows {r['decode_step_ms']:.2f} ms")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, cli.settings(args),
                                   label=args.label), args.results)


if __name__ == "__main__":
    main()
