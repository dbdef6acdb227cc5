"""Prefix caching under a chat load: every request starts with the same system prompt of ~60% of the
context (`bench-serve --shared-prefix`: 150 tokens at `small`, 600 at `gpt2-124m`), then ~24 tokens of
its own, and asks for 64 new tokens (temperature 0.8, ignore_eos), 16 users. Three servers on the same
random weights (bench_serve.py's), in rounds that alternate who goes first: gptport serve (prefix
caching on, its default), gptport serve --no-prefix-cache, and llama.cpp's llama-server (its prompt
cache on, as by default; F32 GGUF, -np 16). 16 slots, 2 threads each.

Goals (issue 25): median TTFT with reuse <= 1/4 of --no-prefix-cache's, output throughput >= 1.3x, and
>= 1.5x llama-server's. For gptport, also the server's own mean time to first token and its parts over
each load (from /metrics: the queue, arrival to slot; the prefill phase per request), beside the
client's mean: the difference is HTTP and the load generator. Writes
benchmarks/results/prefix-<shape>.json naming the CPU.

    python benchmarks/bench_prefix.py [--shapes small,gpt2-124m] [--rounds 2] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_serve import WORK, interleaved, llama_server, model_dir
from bench_tokenizer import big_corpus
from profile_serve import metrics

from gptport.machine import describe

HERE = Path(__file__).resolve().parent
PREFIX = {"small": 150, "gpt2-124m": 600}
OWN, NEW, USERS = 24, 64, 16
KEYS = ("completed", "failed", "output_throughput", "median_ttft_ms", "p99_ttft_ms", "mean_ttft_ms",
        "median_tpot_ms", "mean_prompt_tokens", "cached_prompt_tokens", "server_mean_ttft_ms",
        "server_mean_queue_ms", "server_prefill_ms_per_request")
# gptport's /metrics: sums and counts whose differences over a load give the server's own means
SERVER = ("gptport_time_to_first_token_seconds_sum", "gptport_time_to_first_token_seconds_count",
          "gptport_queue_time_seconds_sum", "gptport_queue_time_seconds_count",
          'gptport_scheduler_seconds_total{phase="prefill"}')


def server_totals(url: str) -> dict[str, float]:
    """SERVER's values from gptport's /metrics now; {} from a server without them (llama-server)."""
    try:
        got = metrics(url)
    except OSError:
        return {}
    return {k: got[k] for k in SERVER if k in got}


def load(url: str, shape: str, requests: int, seed: int) -> dict[str, Any]:
    """One bench-serve run: `requests` chat-like completions at USERS in flight; for gptport, the server's
    own mean time to first token, its queue part, and prefill ms per request over the same load (the client's
    figures include HTTP and the load generator, which share the machine's cores)."""
    before = server_totals(url)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([sys.executable, "-m", "gptport.cli.main", "bench-serve", url, "--concurrency", str(USERS),
                        "--num-prompts", str(requests), "--shared-prefix", str(PREFIX[shape]), "--prompt-len",
                        str(OWN), "--max-tokens", str(NEW), "--temperature", "0.8", "--seed", str(seed),
                        "--json", f.name], check=True)
        row: dict[str, Any] = json.loads(Path(f.name).read_text())["results"][0]
    after = server_totals(url)
    if len(after) == len(SERVER):  # a fresh server has no phase counter before its first prefill: 0
        grew = {k: after[k] - before.get(k, 0.0) for k in SERVER}
        n = grew["gptport_time_to_first_token_seconds_count"]
        admitted = grew["gptport_queue_time_seconds_count"]
        if n and admitted:
            row["server_mean_ttft_ms"] = 1e3 * grew["gptport_time_to_first_token_seconds_sum"] / n
            row["server_mean_queue_ms"] = 1e3 * grew["gptport_queue_time_seconds_sum"] / admitted
            row["server_prefill_ms_per_request"] = 1e3 * grew['gptport_scheduler_seconds_total{phase="prefill"}'] / n
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=64, help="requests per load (16 in flight)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-server", type=Path, default=os.environ.get("GPTPORT_LLAMA_SERVER"))
    args = ap.parse_args()
    for shape in args.shapes.split(","):
        d = model_dir(shape, big_corpus(), args.llama_server is not None)
        n_ctx = json.loads((d / "config.json").read_text())["model"]["n_ctx"]
        serve = [sys.executable, "-m", "gptport.cli.main", "serve", str(d), "--port", "PORT", "--slots", str(USERS),
                 "--threads", str(args.threads)]
        servers = {"gptport": serve, "gptport --no-prefix-cache": [*serve, "--no-prefix-cache"]}
        if args.llama_server is not None:
            servers["llama.cpp"] = llama_server(args.llama_server, d, USERS, args.threads, n_ctx)
        rounds = interleaved(servers, args.rounds, shape,
                             lambda name, s=shape: WORK / f"prefix-{s}-{name.replace(' ', '')}.log",
                             lambda url, r, s=shape: load(url, s, args.requests, r))
        medians = {name: {k: statistics.median(x[k] for x in rs) if all(x.get(k) is not None for x in rs) else None
                          for k in KEYS} for name, rs in rounds.items()}
        result = {"shape": shape, "machine": describe(),
                  "settings": {"users": USERS, "slots": USERS, "threads": args.threads, "shared_prefix": PREFIX[shape],
                               "own_words": OWN, "max_tokens": NEW, "temperature": 0.8, "requests": args.requests,
                               "rounds": args.rounds, "n_ctx": n_ctx},
                  "servers": {name: {"median": medians[name], "rounds": rs} for name, rs in rounds.items()},
                  "ratios": ratios(medians)}
        out = HERE / "results" / f"prefix-{shape}.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print_table(result)


def ratios(m: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    on, off, peer = m["gptport"], m["gptport --no-prefix-cache"], m.get("llama.cpp")
    return {"ttft_on_over_off": on["median_ttft_ms"] / off["median_ttft_ms"],
            "throughput_on_over_off": on["output_throughput"] / off["output_throughput"],
            "throughput_vs_llama_server": on["output_throughput"] / peer["output_throughput"] if peer else None}


def print_table(result: dict[str, Any]) -> None:
    s = result["settings"]
    print(f"\n{result['shape']} on {result['machine']['cpu']}, {result['machine']['cores']} cores; "
          f"{s['users']} users, shared prefix ~{s['shared_prefix']} tokens + ~{s['own_words']} own, "
          f"{s['max_tokens']} new")
    print(f"{'server':<26} {'ok/fail':>8} {'out tok/s':>10} {'TTFT med':>9} {'TTFT p99':>9} {'TTFT mean':>9} "
          f"{'server: TTFT / queue / prefill mean':>36} {'TPOT med':>9} {'prompt':>7} {'cached':>8}")
    for name, data in result["servers"].items():
        m = data["median"]
        cached = "-" if m["cached_prompt_tokens"] is None else f"{m['cached_prompt_tokens']:.0f}"
        own = ("-" if m["server_mean_ttft_ms"] is None else f"{m['server_mean_ttft_ms']:.1f} / "
               f"{m['server_mean_queue_ms']:.1f} / {m['server_prefill_ms_per_request']:.1f}")
        print(f"{name:<26} {m['completed']:>5.0f}/{m['failed']:<2.0f} {m['output_throughput']:>10.1f} "
              f"{m['median_ttft_ms']:>9.1f} {m['p99_ttft_ms']:>9.1f} {m['mean_ttft_ms']:>9.1f} {own:>36} "
              f"{m['median_tpot_ms']:>9.2f} {m['mean_prompt_tokens'] or 0:>7.1f} {cached:>8}")
    print("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in result["ratios"].items() if v is not None))


if __name__ == "__main__":
    main()
