"""The README's Ray Serve table: `gptport bench-serve` against `gptport serve --ray` with 2 replicas x 1
thread, beside plain `gptport serve` with 1 x 2 threads and 1 x 1 thread, at concurrency 1, 4 and 16 on
the `small` shape (random weights). It shows what Ray's proxy hop costs in TTFT and ITL (Ray 2x1 against
plain 1x1 at concurrency 1: one engine of one thread either way) and what two replicas give against one
engine (throughput at 16 users).

Load as bench_serve.py's: /v1/completions, streamed, ~64-token prompts, 128 new tokens, temperature 0.8,
16 slots per engine; max(8, 4 x concurrency) prompts per level, one round per server (the servers run
one after the other, each alone on the machine).
Writes benchmarks/results/ray-<shape>.json.

    python benchmarks/bench_ray.py [--shape small] [--concurrency 1,4,16]
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import version
from typing import Any

from bench_serve import HERE, KEYS, MAX_TOKENS, WORK, free_port, model_dir, served
from bench_tokenizer import big_corpus

from gptport.machine import describe

SERVERS = {  # name: (extra arguments of gptport serve, threads per engine)
    "ray 2x1": (["--ray", "--replicas", "2", "--threads", "1"], 1),
    "serve 1x2": (["--threads", "2"], 2),
    "serve 1x1": (["--threads", "1"], 1),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="small")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--slots", type=int, default=16)
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    WORK.mkdir(parents=True, exist_ok=True)
    d = model_dir(args.shape, big_corpus(), False)
    results: dict[str, list[dict[str, Any]]] = {}
    for name, (extra, _) in SERVERS.items():
        port = str(free_port())
        print(f"== {args.shape}: {name}", file=sys.stderr)
        cmd = [sys.executable, "-m", "gptport.cli.main", "serve", str(d), "--port", port, "--slots", str(args.slots),
               *extra]
        rows = served(cmd, f"http://127.0.0.1:{port}", args.shape, levels, WORK / f"{args.shape}-ray-bench.log", 0)
        results[name] = [{k: r.get(k) for k in ("concurrency", *KEYS)} for r in rows]
    result = {"shape": args.shape, "machine": describe(),
              "ray_version": version("ray"),
              "settings": {"slots_per_engine": args.slots, "prompt_len": 64, "max_tokens": MAX_TOKENS[args.shape],
                           "temperature": 0.8, "concurrency": levels,
                           "prompts_per_level": {c: max(8, 4 * c) for c in levels}, "rounds": 1,
                           "servers": {n: {"args": " ".join(a), "threads_per_engine": t}
                                       for n, (a, t) in SERVERS.items()}},
              "servers": results, "ratios": ratios(results)}
    out = HERE / "results" / f"ray-{args.shape}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)


def ratios(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Ray's proxy hop at concurrency 1 (ray 2x1 / serve 1x1: one engine of one thread either way), and
    output throughput of two replicas against one engine, per level."""
    by = {name: {r["concurrency"]: r for r in rows} for name, rows in results.items()}
    ray, one, two = by["ray 2x1"], by["serve 1x1"], by["serve 1x2"]
    low = min(ray)
    return {
        "proxy_hop_at_concurrency": low,
        "ttft_ms_added": ray[low]["median_ttft_ms"] - one[low]["median_ttft_ms"],
        "itl_ms_added": ray[low]["median_itl_ms"] - one[low]["median_itl_ms"],
        "ttft_ratio": ray[low]["median_ttft_ms"] / one[low]["median_ttft_ms"],
        "itl_ratio": ray[low]["median_itl_ms"] / one[low]["median_itl_ms"],
        "throughput_ray_2x1_over_serve_1x1": {c: ray[c]["output_throughput"] / one[c]["output_throughput"]
                                              for c in ray},
        "throughput_ray_2x1_over_serve_1x2": {c: ray[c]["output_throughput"] / two[c]["output_throughput"]
                                              for c in ray},
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['shape']} on {result['machine']['cpu']}, {result['machine']['cores']} cores; Ray "
          f"{result['ray_version']}")
    print(f"{'server':<10} {'conc':>4} {'ok/fail':>8} {'out tok/s':>10} {'TTFT med':>9} {'TTFT p99':>9} "
          f"{'ITL med':>8} {'ITL p99':>8}")
    for name, rows in result["servers"].items():
        for row in rows:
            print(f"{name:<10} {row['concurrency']:>4} {row['completed']:>5}/{row['failed']:<2} "
                  f"{row['output_throughput']:>10.1f} {row['median_ttft_ms']:>9.1f} {row['p99_ttft_ms']:>9.1f} "
                  f"{row['median_itl_ms']:>8.2f} {row['p99_itl_ms']:>8.2f}")
    r = result["ratios"]
    print(f"proxy hop at concurrency {r['proxy_hop_at_concurrency']}: TTFT {r['ttft_ms_added']:+.1f} ms "
          f"({r['ttft_ratio']:.2f}x), ITL {r['itl_ms_added']:+.2f} ms ({r['itl_ratio']:.2f}x)")
    print("output throughput, ray 2x1 / serve 1x1: " + ", ".join(
        f"c{c} {v:.2f}x" for c, v in r["throughput_ray_2x1_over_serve_1x1"].items()))
    print("output throughput, ray 2x1 / serve 1x2: " + ", ".join(
        f"c{c} {v:.2f}x" for c, v in r["throughput_ray_2x1_over_serve_1x2"].items()))


if __name__ == "__main__":
    main()
