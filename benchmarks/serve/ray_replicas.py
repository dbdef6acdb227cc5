"""Ray Serve's replicas: `gptport bench-serve` against `gptport serve --ray` with 2 replicas x 1
thread, beside plain `gptport serve` with 1 x 2 threads and 1 x 1 thread, at concurrency 1, 4 and 16 on
the `small` shape (random weights). It shows what Ray's proxy hop costs in TTFT and ITL (Ray 2x1 against
plain 1x1 at concurrency 1: one engine of one thread either way) and what two replicas give against one
engine (throughput at 16 users).

Load as benchmarks.serve.throughput's: /v1/completions, streamed, ~64-token prompts, 128 new tokens,
temperature 0.8, 16 slots per engine; max(8, 4 x concurrency) prompts per level; the servers run one after
the other, each alone on the machine, in --rounds rounds (1 by default) that alternate their order.

    python -m benchmarks.serve.ray_replicas [--shape small] [--concurrency 1,4,16] [--rounds 1]
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.loads import KEYS, MAX_TOKENS, bench_serve, median_of
from benchmarks.harness.models import WORK, serve_model
from benchmarks.harness.run import Round, Run
from benchmarks.harness.servers import each_server, gptport_serve, log_name

SERVERS = {  # name: (extra arguments of gptport serve, threads per engine)
    "ray 2x1": (["--ray", "--replicas", "2", "--threads", "1"], 1),
    "serve 1x2": (["--threads", "2"], 2),
    "serve 1x1": (["--threads", "1"], 1),
}


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shape", default="small")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    d = serve_model(args.shape)
    servers = {name: gptport_serve(d, "--slots", str(args.slots), *extra) for name, (extra, _) in SERVERS.items()}

    def measure(url: str, rnd: Round) -> list[dict[str, Any]]:
        """One bench-serve run per level, temperature 0.8, the round's seed."""
        return [r for c in levels for r in bench_serve(url, "--concurrency", str(c), "--num-prompts",
                                                       str(max(8, 4 * c)), "--prompt-len", "64", "--max-tokens",
                                                       str(MAX_TOKENS[args.shape]), "--temperature", "0.8",
                                                       "--seed", str(rnd.index))]

    run = Run()
    for rnd in run.series(args.rounds, shape=args.shape):
        each_server(rnd, servers, lambda name: WORK / "serve" / f"{args.shape}-{log_name(name)}.log", measure)
    got = {name: [{"concurrency": level[0]["concurrency"], **median_of(level, KEYS)}
                  for level in zip(*run.values(name), strict=True)] for name in servers}
    rows = [{"server": name, **r} for name, rs in got.items() for r in rs]
    rows.append({"table": "ratios", **flatten(ratios(got))})
    settings = cli.settings(args, prompt_len=64, max_tokens=MAX_TOKENS[args.shape], temperature=0.8,
                            prompts_per_level={c: max(8, 4 * c) for c in levels},
                            servers={n: {"args": " ".join(a), "threads_per_engine": t}
                                     for n, (a, t) in SERVERS.items()})
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label,
                                   extra_versions={"ray": version("ray")}), args.results)
    print_table(got, ratios(got))


def flatten(r: dict[str, Any]) -> dict[str, Any]:
    """ratios() as one row: the per-level dicts spread into keys."""
    out = {k: v for k, v in r.items() if not isinstance(v, dict)}
    for k, v in r.items():
        if isinstance(v, dict):
            out |= {f"{k}_c{c}": x for c, x in v.items()}
    return out


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


def print_table(got: dict[str, list[dict[str, Any]]], r: dict[str, Any]) -> None:
    print(f"{'server':<10} {'conc':>4} {'ok/fail':>8} {'out tok/s':>10} {'TTFT med':>9} {'TTFT p99':>9} "
          f"{'ITL med':>8} {'ITL p99':>8}")
    for name, rows in got.items():
        for row in rows:
            print(f"{name:<10} {row['concurrency']:>4} {row['completed']:>5}/{row['failed']:<2} "
                  f"{row['output_throughput']:>10.1f} {row['median_ttft_ms']:>9.1f} {row['p99_ttft_ms']:>9.1f} "
                  f"{row['median_itl_ms']:>8.2f} {row['p99_itl_ms']:>8.2f}")
    print(f"proxy hop at concurrency {r['proxy_hop_at_concurrency']}: TTFT {r['ttft_ms_added']:+.1f} ms "
          f"({r['ttft_ratio']:.2f}x), ITL {r['itl_ms_added']:+.2f} ms ({r['itl_ratio']:.2f}x)")
    print("output throughput, ray 2x1 / serve 1x1: " + ", ".join(
        f"c{c} {v:.2f}x" for c, v in r["throughput_ray_2x1_over_serve_1x1"].items()))
    print("output throughput, ray 2x1 / serve 1x2: " + ", ".join(
        f"c{c} {v:.2f}x" for c, v in r["throughput_ray_2x1_over_serve_1x2"].items()))


if __name__ == "__main__":
    main()
