"""Serving throughput and latency: `gptport bench-serve` against `gptport serve` (and, given a build,
llama.cpp's `llama-server` on the same random weights as an F32 GGUF) for the `small` and `gpt2-124m`
shapes, at concurrency 1, 4 and 16, in rounds that alternate the servers. Also `gptport bench`'s batch-1
decode latency of the same graph in each round, for the concurrency-1 cost of serving.

Load: /v1/completions, streamed, prompts of ~64 tokens (bench-serve calibrates its word count), 128 new
tokens (64 for gpt2-124m), temperature 0.8 (and one user once more at temperature 0, greedy as
`gptport bench` decodes), ignore_eos, usage from `stream_options.include_usage`; 16 slots, 2 threads,
`--spin step` (serve's default). With several `--spin` modes, one gptport server per mode in the same
rounds (label spin); with several `--kv-dtype`s, one per cache type (label kv). Each engine's fastest
configuration side by side is benchmarks.serve.best; the shared-prefix load is benchmarks.serve.prefix.

    python -m benchmarks.serve.throughput [--shapes small,gpt2-124m] [--rounds 3] [--llama-server PATH]
    python -m benchmarks.serve.throughput --shapes small --spin step,never,always
    python -m benchmarks.serve.throughput --kv-dtype float32,int8 --concurrency 16   # the int8 KV cache
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.loads import MAX_TOKENS, bench_serve, median_of
from benchmarks.harness.models import WORK, n_ctx, serve_model
from benchmarks.harness.models import cli as gptport
from benchmarks.harness.run import Round, Run
from benchmarks.harness.servers import each_server, gptport_serve, llama_server, log_name

LOGS = WORK / "serve"
CLI = "gptport bench (CLI)"


def load(url: str, shape: str, levels: list[int], seed: int) -> list[dict[str, Any]]:
    """One bench-serve run per concurrency level (more prompts for more users) at temperature 0.8, then
    one user greedy (what `gptport bench` decodes: the like-for-like row for one user's cost over the
    CLI); `seed` differs per round, so that no prompt repeats in a server's life (llama-server caches
    prompt prefixes)."""
    rows = []
    for c, temperature, run_seed in [*((c, 0.8, seed) for c in levels), (1, 0.0, seed + 1000)]:
        got = bench_serve(url, "--concurrency", str(c), "--num-prompts", str(max(8, 4 * c)), "--prompt-len", "64",
                          "--max-tokens", str(MAX_TOKENS[shape]), "--temperature", str(temperature), "--seed",
                          str(run_seed))
        rows += [{**r, "temperature": temperature} for r in got]
    return rows


def decode_latency_ms(d: Path, shape: str, threads: int) -> float:
    """`gptport bench`'s batch-1 decode ms per token of the static graph, as served."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.json"
        gptport("bench", str(d), "--precisions", "fp32", "--kv-cache", "static", "--batch", "1", "--prompt-len",
                "64", "--gen-len", str(MAX_TOKENS[shape]), "--repeat", "5", "--threads", str(threads),
                "--no-torch-baseline", "--json", str(path))
        rows = [r for r in json.loads(path.read_text())["rows"] if r.get("engine") == "onnx"]
    return 1000.0 / float(rows[0]["decode_tok_s"])


def servers_of(d: Path, args: Any) -> dict[str, list[str]]:
    modes, kvs = args.spin.split(","), args.kv_dtype.split(",")
    servers = {"gptport" + (f" --spin {mode}" if len(modes) > 1 else "") + (f" --kv-dtype {kv}" if len(kvs) > 1
                                                                             else ""):
               gptport_serve(d, "--slots", str(args.slots), "--threads", str(args.threads), "--spin", mode,
                             "--kv-dtype", kv) for mode in modes for kv in kvs}
    if args.llama_server is not None:
        servers["llama.cpp"] = llama_server(args.llama_server, d, args.slots, args.threads, n_ctx(d))
    return servers


def table_rows(run: Run, shape: str, servers: list[str]) -> list[dict[str, Any]]:
    """Per server and load level, the medians over the kept rounds; the CLI's latency beside them."""
    rows = []
    for name in servers:
        rounds = run.values(name, shape=shape)
        for level in zip(*rounds, strict=True):
            row = {"shape": shape, "server": name, "concurrency": level[0]["concurrency"],
                   "temperature": level[0]["temperature"], **median_of(level)}
            row["failed"] = sum(r["failed"] for r in level)
            rows.append(row)
    latencies = run.values(CLI, shape=shape)
    if latencies:
        rows.append({"shape": shape, "server": CLI, "concurrency": 1, "temperature": 0.0,
                     "median_tpot_ms": statistics.median(latencies)})
    return rows


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--spin", default="step", help="gptport serve's --spin; several (step,never,always) compare "
                    "them in the same rounds (label spin)")
    ap.add_argument("--kv-dtype", default="float32", help="gptport serve's --kv-dtype; several (float32,int8) "
                    "compare them in the same rounds (label kv; the model directory needs "
                    "`gptport export --kv-dtype int8`)")
    ap.add_argument("--llama-server", type=Path, default=os.environ.get("GPTPORT_LLAMA_SERVER"),
                    help="a llama-server binary (README: building one from the llama-cpp-python sdist)")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    run, rows = Run(), []
    names: dict[str, list[str]] = {}
    for shape in args.shapes.split(","):
        d = serve_model(shape, gguf=args.llama_server is not None)
        servers = servers_of(d, args)
        names[shape] = list(servers)

        def measure(url: str, rnd: Round, shape: str = shape) -> list[dict[str, Any]]:
            return load(url, shape, levels, seed=rnd.index)

        for rnd in run.series(args.rounds, shape=shape):
            each_server(rnd, servers, lambda name, s=shape: LOGS / f"{s}-{log_name(name)}.log", measure)
            rnd.data[CLI] = decode_latency_ms(d, shape, args.threads)  # beside the server's TPOT: the host drifts
    for shape, servers in names.items():
        rows += table_rows(run, shape, servers)
    label = args.label or ("spin" if "," in args.spin else "kv" if "," in args.kv_dtype else "")
    settings = cli.settings(args, prompt_len=64, max_tokens=MAX_TOKENS, temperature=[0.8, "0 (one user)"])
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=label),
                  args.results)
    print_table(rows)


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'shape':<10} {'server':<22} {'conc':>4} {'temp':>4} {'out tok/s':>10} {'TTFT med':>9} {'TTFT p99':>9} "
          f"{'TPOT med':>9} {'ITL p99':>8}")
    for row in rows:
        cells = [row.get(k) for k in ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
                                      "p99_itl_ms")]
        print(f"{row['shape']:<10} {row['server']:<22} {row['concurrency']:>4} {row['temperature']:>4} "
              + " ".join("         -" if v is None else f"{v:>9.2f}" for v in cells))


if __name__ == "__main__":
    main()
