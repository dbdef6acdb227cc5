"""Each engine's fastest configuration, side by side (issue 25): `gptport serve` with fp32 or int8
weights and a float32 or int8 KV cache against llama.cpp's `llama-server` with F32 or Q8_0 weights and
an f16 (its default) or q8_0 cache, under bench_serve.py's load at 16 users (~64-token prompts, 128 new
tokens, 64 at gpt2-124m, temperature 0.8, ignore_eos; 16 slots, 2 threads), in rounds that alternate
who goes first. Then serve_ceiling.py's in-process figures for gptport's configurations (what the
engine's step times allow without HTTP, the same machine minutes later), so the HTTP figure's share of
its ceiling is read from one run.

Weights: bench_serve.py's random weights of each shape (speed does not depend on their values), the
int8 graphs written with --no-gate (random weights' flat distributions cannot pass a top-1 gate). The
accuracy of the int8 weights and cache is gated on a trained model of `small`'s shape instead
(bench_speculative.py's target, scored on its validation text), and those gate rows are recorded here.
llama.cpp has no gate of its own; Q8_0 is its near-lossless type.

Writes benchmarks/results/best-<shape>.json naming the CPU.

    python benchmarks/bench_best.py [--shapes small,gpt2-124m] [--rounds 3] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import serve_ceiling
from bench_serve import KEYS, MAX_TOKENS, WORK, gptport, interleaved, llama_server, model_dir
from bench_tokenizer import big_corpus

from gptport.machine import describe

HERE = Path(__file__).resolve().parent
BEST = WORK.parent / "best"
USERS = 16
COPIED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "tokenizer_meta.json",
          "vocab.json", "merges.txt")
GPTPORT = [("fp32", "float32"), ("fp32", "int8"), ("int8", "float32"), ("int8", "int8")]
LLAMA = [("f32", "f16"), ("f32", "q8_0"), ("q8_0", "f16"), ("q8_0", "q8_0")]


def prepare(shape: str, gguf: bool) -> Path:
    """bench_serve's random weights of `shape`, exported with int8 weights and the int8-cache twins
    (--no-gate), and as F32 and Q8_0 GGUFs."""
    src, d = model_dir(shape, big_corpus(), gguf=False), BEST / shape
    if not (d / "model.int8.static.kv8.onnx").exists():
        d.mkdir(parents=True, exist_ok=True)
        for name in COPIED:
            shutil.copy2(src / name, d / name)
        gptport("export", str(d), "--precision", "fp32,int8", "--kv-dtype", "int8", "--no-gate", "--force")
    for outtype in ("f32", "q8_0") if gguf else ():
        if not (d / f"model.{outtype}.gguf").exists():
            gptport("export-gguf", str(d), "--outtype", outtype)
    return d


def trained_gate() -> dict[str, Any] | None:
    """The int8 weights' and int8 cache's gate rows on a trained `small` (bench_speculative's target and
    its validation text), or None when that model has not been trained here."""
    target = WORK.parent / "speculative" / "target"
    if not (target / "data" / "val.bin").exists():
        return None
    from gptport.export import exporter  # torch: only for this gate

    d = BEST / "trained-small"
    (d / "data").mkdir(parents=True, exist_ok=True)
    for name in (*COPIED, "trainer.json"):
        shutil.copy2(target / name, d / name)
    for name in ("meta.json", "val.bin"):
        shutil.copy2(target / "data" / name, d / "data" / name)
    print("== gating int8 weights and the int8 cache on the trained small", file=sys.stderr)
    report = exporter.export(d, ("fp32", "int8"), force=True, kv_dtype="int8")
    return {"model": "bench_speculative.py's target (small shape, n_ctx 512, trained on tinyshakespeare)",
            "heldout": report.heldout, "weights": [dataclasses.asdict(g) for g in report.gates],
            "kv_cache": [dataclasses.asdict(g) for g in report.kv_gates]}


def load(url: str, shape: str, seed: int) -> dict[str, Any]:
    """bench_serve's load at 16 users: 64 requests."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        gptport("bench-serve", url, "--concurrency", str(USERS), "--num-prompts", str(4 * USERS), "--prompt-len",
                "64", "--max-tokens", str(MAX_TOKENS[shape]), "--temperature", "0.8", "--seed", str(seed),
                "--json", f.name)
        return json.loads(Path(f.name).read_text())["results"][0]


def name_of(engine: str, weights: str, cache: str) -> str:
    return f"{engine} {weights} weights, {cache} cache"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ceiling-rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-server", type=Path, default=os.environ.get("GPTPORT_LLAMA_SERVER"))
    ap.add_argument("--no-trained-gate", action="store_true", help="skip gating on the trained small")
    args = ap.parse_args()
    machine = describe()
    gate = None if args.no_trained_gate else trained_gate()
    for shape in args.shapes.split(","):
        d = prepare(shape, args.llama_server is not None)
        n_ctx = json.loads((d / "config.json").read_text())["model"]["n_ctx"]
        servers = {name_of("gptport", p, kv): [
            sys.executable, "-m", "gptport.cli.main", "serve", str(d), "--port", "PORT", "--slots", str(USERS),
            "--threads", str(args.threads), "--precision", p, "--kv-dtype", kv] for p, kv in GPTPORT}
        if args.llama_server is not None:
            for w, c in LLAMA:
                servers[name_of("llama.cpp", w.upper(), c)] = llama_server(args.llama_server, d, USERS,
                                                                          args.threads, n_ctx, w, c)
        rounds = interleaved(servers, args.rounds, shape,
                             lambda name, shape=shape: WORK / f"best-{shape}-{name.replace(' ', '_')}.log",
                             lambda url, r, shape=shape: load(url, shape, seed=r))
        ceilings = {}
        for p, kv in GPTPORT:
            print(f"== {shape} ceiling: {p} weights, {kv} cache", file=sys.stderr)
            ceilings[name_of("gptport", p, kv)] = serve_ceiling.measure(shape, args.ceiling_rounds, args.threads,
                                                                        d, p, kv)
        result = {"shape": shape, "machine": machine,
                  "settings": {"users": USERS, "slots": USERS, "threads": args.threads, "prompt_len": 64,
                               "max_tokens": MAX_TOKENS[shape], "temperature": 0.8, "requests": 4 * USERS,
                               "rounds": args.rounds, "weights": "random (bench_serve.py's); int8 graphs --no-gate"},
                  "trained_gate": gate,
                  "servers": {name: {"median": median(rs), "rounds": rs} for name, rs in rounds.items()},
                  "ceilings": ceilings}
        result["summary"] = summary(result)
        out = HERE / "results" / f"best-{shape}.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print_table(result)
        print(f"wrote {out}")


def median(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: statistics.median(r[k] for r in rows) for k in KEYS if all(r.get(k) is not None for r in rows)}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Each engine's fastest configuration, their ratio, and gptport's share of its ceiling."""
    servers = result["servers"]

    def fastest(engine: str) -> str | None:
        names = [n for n in servers if n.startswith(engine)]
        return max(names, key=lambda n: servers[n]["median"]["output_throughput"]) if names else None

    ours, peer = fastest("gptport"), fastest("llama.cpp")
    assert ours is not None
    tok_s = servers[ours]["median"]["output_throughput"]
    ceiling = result["ceilings"][ours]
    out = {"gptport_fastest": ours, "gptport_tok_s": tok_s,
           "in_process_tok_s": ceiling["users_16_tok_s"], "share_of_in_process": tok_s / ceiling["users_16_tok_s"],
           "p99_over_median_ttft": servers[ours]["median"]["p99_ttft_ms"] / servers[ours]["median"]["median_ttft_ms"]}
    if peer is not None:
        peer_tok_s = servers[peer]["median"]["output_throughput"]
        out |= {"llama_fastest": peer, "llama_tok_s": peer_tok_s, "vs_llama": tok_s / peer_tok_s}
    return out


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['shape']} on {result['machine']['cpu']}, {result['machine']['cores']} cores; 16 users, medians "
          f"of {result['settings']['rounds']} rounds")
    print("| server | out tok/s | TTFT med ms | TTFT p99 ms | p99/med | TPOT med ms | in-process tok/s | share |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, data in result["servers"].items():
        m, c = data["median"], result["ceilings"].get(name)
        inproc = f"{c['users_16_tok_s']:,.0f} | {m['output_throughput'] / c['users_16_tok_s']:.0%}" if c else "– | –"
        print(f"| {name} | {m['output_throughput']:,.1f} | {m['median_ttft_ms']:.1f} | {m['p99_ttft_ms']:.1f} | "
              f"{m['p99_ttft_ms'] / m['median_ttft_ms']:.2f}x | {m['median_tpot_ms']:.2f} | {inproc} |")
    s = result["summary"]
    if "vs_llama" in s:
        print(f"fastest: {s['gptport_fastest']} {s['gptport_tok_s']:,.1f} tok/s against {s['llama_fastest']} "
              f"{s['llama_tok_s']:,.1f}: {s['vs_llama']:.2f}x")


if __name__ == "__main__":
    main()
