"""The README's serving table: `gptport bench-serve` against `gptport serve` (and, given a build,
llama.cpp's `llama-server` on the same random weights as an F32 GGUF) for the `small` and `gpt2-124m`
shapes, at concurrency 1, 4 and 16, in rounds that alternate the two servers. Also `gptport bench`'s
batch-1 decode latency of the same graph in each round, for the concurrency-1 cost of serving.

Load: /v1/completions, streamed, prompts of ~64 tokens (bench-serve calibrates its word count), 128
new tokens (64 for gpt2-124m), temperature 0.8 (and one user once more at temperature 0, greedy as
`gptport bench` decodes), ignore_eos, usage from `stream_options.include_usage`;
16 slots, 2 threads, `--spin step` (serve's default).
Writes benchmarks/results/serve-<shape>.json (medians over rounds, and every round). With several
`--spin` modes, one gptport server per mode in the same rounds (serve-spin-<shape>.json); with several
`--kv-dtype`s, one per cache type (serve-kv-<shape>.json). Each engine's fastest configuration side by
side (gptport with int8 weights and the int8 cache, llama-server with Q8_0 weights and its cache types)
is bench_best.py, which runs these servers with these helpers; the shared-prefix load is bench_prefix.py.

    python benchmarks/bench_serve.py [--shapes small,gpt2-124m] [--rounds 3] [--llama-server PATH]
    python benchmarks/bench_serve.py --shapes small --spin step,never,always
    python benchmarks/bench_serve.py --kv-dtype float32,int8 --concurrency 16   # the int8 KV cache
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_decode import random_weights
from bench_tokenizer import big_corpus

from gptport.machine import describe

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "serve"
MAX_TOKENS = {"small": 128, "gpt2-124m": 64}
KEYS = ("completed", "failed", "request_throughput", "output_throughput", "total_token_throughput",
        "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms", "p99_itl_ms", "median_e2el_ms")


def gptport(*args: str, capture: bool = False) -> str:
    r = subprocess.run([sys.executable, "-m", "gptport.cli.main", *args], check=True, text=True,
                       stdout=subprocess.PIPE if capture else None)
    return r.stdout or ""


def model_dir(shape: str, corpus: Path, gguf: bool) -> Path:
    """Random weights of the preset's shape (bench_decode's), exported to fp32 ONNX (and an F32 GGUF
    for llama.cpp)."""
    d = WORK / shape
    if not (d / "model.static.onnx").exists():
        random_weights(d, shape, corpus)
        gptport("export", str(d), "--force")
    if gguf and not (d / "model.f32.gguf").exists():
        gptport("export-gguf", str(d), "--outtype", "f32")
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], limit: float = 300) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not become healthy in {limit} s")


def load(url: str, shape: str, levels: list[int], seed: int) -> list[dict[str, Any]]:
    """One bench-serve run per concurrency level (more prompts for more users) at temperature 0.8, then
    one user greedy (what `gptport bench` decodes: the like-for-like row for one user's cost over the
    CLI); `seed` differs per round, so that no prompt repeats in a server's life (llama-server caches
    prompt prefixes)."""
    rows = []
    for c, temperature, run_seed in [*((c, 0.8, seed) for c in levels), (1, 0.0, seed + 1000)]:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            gptport("bench-serve", url, "--concurrency", str(c), "--num-prompts", str(max(8, 4 * c)),
                    "--prompt-len", "64", "--max-tokens", str(MAX_TOKENS[shape]), "--temperature",
                    str(temperature), "--seed", str(run_seed), "--json", f.name)
            rows += [{**r, "temperature": temperature} for r in json.loads(Path(f.name).read_text())["results"]]
    return rows


def served(cmd: list[str], url: str, shape: str, levels: list[int], log: Path, seed: int) -> list[dict[str, Any]]:
    """Start a server, load it, stop it by its pid."""
    return served_with(cmd, url, log, lambda u: load(u, shape, levels, seed))


def served_with(cmd: list[str], url: str, log: Path, run: Any) -> Any:
    """Start a server, wait until it is healthy, `run(url)`, stop it by its pid."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, proc)
        return run(url)
    finally:
        stop_server(proc)


def llama_server(binary: Path, d: Path, slots: int, threads: int, n_ctx: int, weights: str = "f32",
                 cache: str = "f16") -> list[str]:
    """llama-server on the directory's GGUF of `weights` (f32, q8_0), `slots` slots of n_ctx each, its
    keys and values in `cache` (f16, its default, or q8_0); PORT is filled in later."""
    return [str(binary), "-m", str(d / f"model.{weights}.gguf"), "--host", "127.0.0.1", "--port", "PORT",
            "-np", str(slots), "-t", str(threads), "-c", str(slots * n_ctx), "--no-webui", "-ctk", cache, "-ctv", cache]


def interleaved(servers: dict[str, list[str]], rounds: int, shape: str, log: Callable[[str], Path],
                run: Callable[[str, int], Any]) -> dict[str, list[Any]]:
    """Each server started, `run(url, round)`, stopped, in rounds that alternate who goes first: each
    server's results by round."""
    out: dict[str, list[Any]] = {name: [] for name in servers}
    for r in range(rounds):
        for name in (list(servers) if r % 2 == 0 else list(servers)[::-1]):
            port = str(free_port())
            print(f"== {shape} round {r + 1}/{rounds}: {name}", file=sys.stderr)
            cmd = [port if a == "PORT" else a for a in servers[name]]
            out[name].append(served_with(cmd, f"http://127.0.0.1:{port}", log(name),
                                         lambda url, r=r: run(url, r)))  # type: ignore[misc]
    return out


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a graceful shutdown), then SIGKILL after 60 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def decode_latency_ms(d: Path, shape: str, threads: int) -> float:
    """`gptport bench`'s batch-1 decode ms per token of the static graph, as served."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        gptport("bench", str(d), "--precisions", "fp32", "--kv-cache", "static", "--batch", "1", "--prompt-len",
                "64", "--gen-len", str(MAX_TOKENS[shape]), "--repeat", "5", "--threads", str(threads),
                "--no-torch-baseline", "--json", f.name)
        rows = [r for r in json.loads(Path(f.name).read_text())["rows"] if r.get("engine") == "onnx"]
    return 1000.0 / rows[0]["decode_tok_s"]


def median_rows(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for level in zip(*rounds, strict=True):
        row = {"concurrency": level[0]["concurrency"], "temperature": level[0]["temperature"]}
        for key in KEYS:
            values = [r[key] for r in level if r.get(key) is not None]
            row[key] = statistics.median(values) if values else None
        row["failed"] = sum(r["failed"] for r in level)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--spin", default="step", help="gptport serve's --spin; several (step,never,always) compare "
                    "them in the same rounds and write serve-spin-<shape>.json")
    ap.add_argument("--kv-dtype", default="float32", help="gptport serve's --kv-dtype; several (float32,int8) "
                    "compare them in the same rounds and write serve-kv-<shape>.json (the model directory needs "
                    "`gptport export --kv-dtype int8`)")
    ap.add_argument("--llama-server", type=Path, default=os.environ.get("GPTPORT_LLAMA_SERVER"),
                    help="a llama-server binary (README: building one from the llama-cpp-python sdist)")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    corpus = big_corpus()
    WORK.mkdir(parents=True, exist_ok=True)
    for shape in args.shapes.split(","):
        d = model_dir(shape, corpus, args.llama_server is not None)
        n_ctx = json.loads((d / "config.json").read_text())["model"]["n_ctx"]
        modes, kvs = args.spin.split(","), args.kv_dtype.split(",")
        servers = {"gptport" + (f" --spin {mode}" if len(modes) > 1 else "") + (f" --kv-dtype {kv}" if len(kvs) > 1
                                                                                 else ""): [
            sys.executable, "-m", "gptport.cli.main", "serve", str(d), "--port", "PORT", "--slots", str(args.slots),
            "--threads", str(args.threads), "--spin", mode, "--kv-dtype", kv] for mode in modes for kv in kvs}
        if args.llama_server is not None:
            servers["llama.cpp"] = llama_server(args.llama_server, d, args.slots, args.threads, n_ctx)
        rounds: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in servers}
        latencies: list[float] = []
        for r in range(args.rounds):
            for name in (list(servers) if r % 2 == 0 else list(servers)[::-1]):  # alternate who goes first
                port = str(free_port())
                print(f"== {shape} round {r + 1}/{args.rounds}: {name}", file=sys.stderr)
                cmd = [port if a == "PORT" else a for a in servers[name]]
                log = WORK / f"{shape}-{name.replace(' ', '')}.log"
                rounds[name].append(served(cmd, f"http://127.0.0.1:{port}", shape, levels, log, seed=r))
                if name == list(servers)[0]:  # the CLI's decode latency beside the server's TPOT (the host drifts)
                    latencies.append(decode_latency_ms(d, shape, args.threads))
        latency = statistics.median(latencies)
        result = {"shape": shape, "machine": describe(),
                  "settings": {"slots": args.slots, "threads": args.threads, "prompt_len": 64,
                               "max_tokens": MAX_TOKENS[shape], "temperature": [0.8, "0 (one user)"],
                               "rounds": args.rounds,
                               "concurrency": levels, "spin": modes, "kv_dtype": kvs},
                  "bench_decode_ms_per_token": latency, "bench_decode_ms_per_token_rounds": latencies,
                  "servers": {name: {"median": median_rows(rs), "rounds": rs} for name, rs in rounds.items()}}
        name = "serve" if len(modes) == 1 and len(kvs) == 1 else "serve-spin" if len(kvs) == 1 else "serve-kv"
        out = HERE / "results" / f"{name}-{shape}.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print_table(result)


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['shape']} on {result['machine']['cpu']}, {result['machine']['cores']} cores; "
          f"gptport bench decode {result['bench_decode_ms_per_token']:.2f} ms/token")
    print(f"{'server':<22} {'conc':>4} {'temp':>4} {'ok/fail':>8} {'out tok/s':>10} {'TTFT med':>9} {'TTFT p99':>9} "
          f"{'TPOT med':>9} {'ITL p99':>8}")
    for name, data in result["servers"].items():
        for row in data["median"]:
            print(f"{name:<22} {row['concurrency']:>4} {row['temperature']:>4} "
                  f"{row['completed']:>5}/{row['failed']:<2} "
                  f"{row['output_throughput']:>10.1f} {row['median_ttft_ms']:>9.1f} {row['p99_ttft_ms']:>9.1f} "
                  f"{row['median_tpot_ms']:>9.2f} {row['p99_itl_ms']:>8.2f}")


if __name__ == "__main__":
    main()
