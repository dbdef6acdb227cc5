"""Prefix caching under a chat load: every request starts with the same system prompt of ~60% of the
context (`bench-serve --shared-prefix`: 150 tokens at `small`, 600 at `gpt2-124m`), then ~24 tokens of
its own, and asks for 64 new tokens (temperature 0.8, ignore_eos), 16 users. Three servers on the same
random weights (the serving benchmarks'), in rounds that alternate who goes first: gptport serve (prefix
caching on, its default), gptport serve --no-prefix-cache, and llama.cpp's llama-server (its prompt
cache on, as by default; F32 GGUF, -np 16). 16 slots, 2 threads each.

Goals: median TTFT with reuse <= 1/4 of --no-prefix-cache's, output throughput >= 1.3x, and
>= 1.5x llama-server's. For gptport, also the server's own mean time to first token and its parts over
each load (from /metrics: the queue, arrival to slot; the prefill phase per request), beside the
client's mean: the difference is HTTP and the load generator.

    python -m benchmarks.serve.prefix [--shapes small,gpt2-124m] [--rounds 2] [--llama-server PATH]
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.loads import SHARED_PREFIX, bench_serve, median_of, metrics
from benchmarks.harness.models import WORK, n_ctx, serve_model
from benchmarks.harness.run import Round, Run
from benchmarks.harness.servers import each_server, gptport_serve, llama_server, log_name

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
    row = bench_serve(url, "--concurrency", str(USERS), "--num-prompts", str(requests), "--shared-prefix",
                      str(SHARED_PREFIX[shape]), "--prompt-len", str(OWN), "--max-tokens", str(NEW), "--temperature",
                      "0.8", "--seed", str(seed))[0]
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
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=64, help="requests per load (16 in flight)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-server", type=Path, default=os.environ.get("GPTPORT_LLAMA_SERVER"))
    args = ap.parse_args()
    run, rows = Run(), []
    names: dict[str, list[str]] = {}
    for shape in args.shapes.split(","):
        d = serve_model(shape, gguf=args.llama_server is not None)
        serve = gptport_serve(d, "--slots", str(USERS), "--threads", str(args.threads))
        servers = {"gptport": serve, "gptport --no-prefix-cache": [*serve, "--no-prefix-cache"]}
        if args.llama_server is not None:
            servers["llama.cpp"] = llama_server(args.llama_server, d, USERS, args.threads, n_ctx(d))
        names[shape] = list(servers)

        def measure(url: str, rnd: Round, shape: str = shape) -> dict[str, Any]:
            return load(url, shape, args.requests, rnd.index)

        for rnd in run.series(args.rounds, shape=shape):
            each_server(rnd, servers, lambda name, s=shape: WORK / "serve" / f"prefix-{s}-{log_name(name)}.log",
                        measure)
    for shape, servers in names.items():  # once every round is judged
        medians = {name: median_of(run.values(name, shape=shape), KEYS) for name in servers}
        rows += [{"shape": shape, "server": name, **m} for name, m in medians.items()]
        rows.append({"table": "ratios", "shape": shape, **ratios(medians)})
    settings = cli.settings(args, users=USERS, slots=USERS, shared_prefix=SHARED_PREFIX, own_words=OWN,
                            max_tokens=NEW, temperature=0.8)
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label),
                  args.results)
    print_table(rows)


def ratios(m: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    on, off, peer = m["gptport"], m["gptport --no-prefix-cache"], m.get("llama.cpp")
    return {"ttft_on_over_off": on["median_ttft_ms"] / off["median_ttft_ms"],
            "throughput_on_over_off": on["output_throughput"] / off["output_throughput"],
            "throughput_vs_llama_server": on["output_throughput"] / peer["output_throughput"] if peer else None}


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'shape':<10} {'server':<26} {'ok/fail':>8} {'out tok/s':>10} {'TTFT med':>9} {'TTFT p99':>9} "
          f"{'TTFT mean':>9} {'server: TTFT / queue / prefill mean':>36} {'TPOT med':>9} {'prompt':>7} {'cached':>8}")
    for m in rows:
        if m.get("table") == "ratios":
            print(f"{m['shape']} ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in m.items()
                                                       if isinstance(v, float)))
            continue
        cached = "-" if m["cached_prompt_tokens"] is None else f"{m['cached_prompt_tokens']:.0f}"
        own = ("-" if m["server_mean_ttft_ms"] is None else f"{m['server_mean_ttft_ms']:.1f} / "
               f"{m['server_mean_queue_ms']:.1f} / {m['server_prefill_ms_per_request']:.1f}")
        print(f"{m['shape']:<10} {m['server']:<26} {m['completed']:>5.0f}/{m['failed']:<2.0f} "
              f"{m['output_throughput']:>10.1f} {m['median_ttft_ms']:>9.1f} {m['p99_ttft_ms']:>9.1f} "
              f"{m['mean_ttft_ms']:>9.1f} {own:>36} {m['median_tpot_ms']:>9.2f} {m['mean_prompt_tokens'] or 0:>7.1f} "
              f"{cached:>8}")


if __name__ == "__main__":
    main()
