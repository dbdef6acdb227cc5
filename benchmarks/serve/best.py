"""Each engine's fastest configuration, side by side: `gptport serve` with fp32 or int8
weights and a float32 or int8 KV cache against llama.cpp's `llama-server` with F32 or Q8_0 weights and
an f16 (its default) or q8_0 cache, under benchmarks.serve.throughput's load at 16 users (~64-token prompts, 128 new
tokens, 64 at gpt2-124m, temperature 0.8, ignore_eos; 16 slots, 2 threads), in rounds that alternate
who goes first. Then benchmarks.serve.ceiling's in-process figures for gptport's configurations (what the
engine's step times allow without HTTP, the same machine minutes later), so the HTTP figure's share of
its ceiling is read from one run.

Weights: the serving benchmarks' random weights of each shape (speed does not depend on their values), the
int8 graphs written with --no-gate (random weights' flat distributions cannot pass a top-1 gate). The
accuracy of the int8 weights and cache is gated on a trained model of `small`'s shape instead
(benchmarks.decode.speculative's target, scored on its validation text), recorded in the details.
llama.cpp has no gate of its own; Q8_0 is its near-lossless type.

    python -m benchmarks.serve.best [--shapes small,gpt2-124m] [--rounds 3] [--llama-server PATH]
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.loads import KEYS, MAX_TOKENS, bench_serve, median_of
from benchmarks.harness.models import WORK, n_ctx, serve_model
from benchmarks.harness.models import cli as gptport
from benchmarks.harness.run import Round, Run
from benchmarks.harness.servers import each_server, gptport_serve, llama_server, log_name
from benchmarks.serve import ceiling

BEST = WORK / "best"
USERS = 16
COPIED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "tokenizer_meta.json",
          "vocab.json", "merges.txt")
GPTPORT = [("fp32", "float32"), ("fp32", "int8"), ("int8", "float32"), ("int8", "int8")]
LLAMA = [("f32", "f16"), ("f32", "q8_0"), ("q8_0", "f16"), ("q8_0", "q8_0")]


def prepare(shape: str, gguf: bool) -> Path:
    """The serving benchmarks' random weights of `shape`, exported with int8 weights and the int8-cache twins
    (--no-gate), and as F32 and Q8_0 GGUFs."""
    src, d = serve_model(shape), BEST / shape
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
    """The int8 weights' and int8 cache's gate rows on a trained `small` (benchmarks.decode.speculative's
    target and its validation text), or None when that model has not been trained here."""
    target = WORK / "speculative" / "target"
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
    return {"model": "benchmarks.decode.speculative's target (small shape, n_ctx 512, trained on tinyshakespeare)",
            "heldout": report.heldout, "weights": [dataclasses.asdict(g) for g in report.gates],
            "kv_cache": [dataclasses.asdict(g) for g in report.kv_gates]}


def load(url: str, shape: str, seed: int) -> dict[str, Any]:
    """benchmarks.serve.throughput's load at 16 users: 64 requests."""
    return bench_serve(url, "--concurrency", str(USERS), "--num-prompts", str(4 * USERS), "--prompt-len", "64",
                       "--max-tokens", str(MAX_TOKENS[shape]), "--temperature", "0.8", "--seed", str(seed))[0]


def name_of(engine: str, weights: str, cache: str) -> str:
    return f"{engine} {weights} weights, {cache} cache"


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ceiling-rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-server", type=Path, default=os.environ.get("GPTPORT_LLAMA_SERVER"))
    ap.add_argument("--no-trained-gate", action="store_true", help="skip gating on the trained small")
    args = ap.parse_args()
    gate = None if args.no_trained_gate else trained_gate()
    run, rows = Run(), []
    shapes = args.shapes.split(",")
    servers: dict[str, dict[str, list[str]]] = {}
    for shape in shapes:
        d = prepare(shape, args.llama_server is not None)
        servers[shape] = {name_of("gptport", p, kv): gptport_serve(d, "--slots", str(USERS), "--threads",
                                                                   str(args.threads), "--precision", p,
                                                                   "--kv-dtype", kv) for p, kv in GPTPORT}
        if args.llama_server is not None:
            for w, c in LLAMA:
                servers[shape][name_of("llama.cpp", w.upper(), c)] = llama_server(args.llama_server, d, USERS,
                                                                                  args.threads, n_ctx(d), w, c)

        def measure(url: str, rnd: Round, shape: str = shape) -> dict[str, Any]:
            return load(url, shape, seed=rnd.index)

        for rnd in run.series(args.rounds, shape=shape, part="http"):
            each_server(rnd, servers[shape], lambda name, s=shape: WORK / "serve" / f"best-{s}-{log_name(name)}.log",
                        measure)
        for p, kv in GPTPORT:
            print(f"== {shape} ceiling: {p} weights, {kv} cache", file=sys.stderr)
            ceiling.measure(run, shape, args.ceiling_rounds, args.threads, d, p, kv, part="in-process")
    for shape in shapes:  # once every round is judged
        ceilings = {name_of("gptport", p, kv): ceiling.row(run, shape, p, kv, part="in-process") for p, kv in GPTPORT}
        for name in servers[shape]:
            m = median_of(run.values(name, shape=shape, part="http"), KEYS)
            c = ceilings.get(name)
            rows.append({"shape": shape, "server": name, **m, "p99_over_median_ttft": m["p99_ttft_ms"] /
                         m["median_ttft_ms"], "in_process_tok_s": c["users_16_tok_s"] if c else None,
                         "share_of_in_process": m["output_throughput"] / c["users_16_tok_s"] if c else None})
    rows += [summary(shape, [r for r in rows if r["shape"] == shape]) for shape in shapes]
    settings = cli.settings(args, users=USERS, slots=USERS, prompt_len=64, max_tokens=MAX_TOKENS, temperature=0.8,
                            requests=4 * USERS, weights="random (the serving benchmarks'); int8 graphs --no-gate")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label,
                                   details={"trained_gate": gate}), args.results)
    print_table(rows)


def summary(shape: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each engine's fastest configuration, their ratio, and gptport's share of its ceiling."""

    def fastest(engine: str) -> dict[str, Any] | None:
        named = [r for r in rows if r["server"].startswith(engine)]
        return max(named, key=lambda r: r["output_throughput"]) if named else None

    ours, peer = fastest("gptport"), fastest("llama.cpp")
    assert ours is not None
    out = {"table": "fastest", "shape": shape, "gptport_fastest": ours["server"],
           "gptport_tok_s": ours["output_throughput"], "share_of_in_process": ours["share_of_in_process"]}
    if peer is not None:
        out |= {"llama_fastest": peer["server"], "llama_tok_s": peer["output_throughput"],
                "vs_llama": ours["output_throughput"] / peer["output_throughput"]}
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| shape | server | out tok/s | TTFT med ms | TTFT p99 ms | p99/med | TPOT med ms | in-process tok/s "
          "| share |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if r.get("table") == "fastest":
            if "vs_llama" in r:
                print(f"{r['shape']} fastest: {r['gptport_fastest']} {r['gptport_tok_s']:,.1f} tok/s against "
                      f"{r['llama_fastest']} {r['llama_tok_s']:,.1f}: {r['vs_llama']:.2f}x")
            continue
        inproc = (f"{r['in_process_tok_s']:,.0f} | {r['share_of_in_process']:.0%}" if r["in_process_tok_s"]
                  else "– | –")
        print(f"| {r['shape']} | {r['server']} | {r['output_throughput']:,.1f} | {r['median_ttft_ms']:.1f} | "
              f"{r['p99_ttft_ms']:.1f} | {r['p99_over_median_ttft']:.2f}x | {r['median_tpot_ms']:.2f} | {inproc} |")


if __name__ == "__main__":
    main()
