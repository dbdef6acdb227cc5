"""gptport against llama.cpp on the same weights: `gptport bench --kv-cache static` and llama.cpp's
`llama-bench`, interleaved, for the README's per-machine comparison table.

The random-weight model directories of bench_decode.py (`small` and `gpt2-124m` shapes, seeded) are
exported to gptport's fp32 and int8 graphs (`gptport export --no-gate`: random weights cannot pass the
accuracy gate) and to F32 and Q8_0 GGUFs (`gptport export-gguf`). Each round runs, per shape, both
engines one after the other (the order alternates between rounds): llama-bench (-p 64 -n GEN -t
THREADS, its own warm-up, -r REPEAT) and gptport bench (batch 1, prompt 64, GEN new tokens, 1 warm-up,
REPEAT runs, THREADS threads). Each engine's figure in a round is the mean of its runs (llama-bench's
avg_ts, bench's mean); the table gives the median over rounds and the ratio of the medians (and
each round's ratio in the JSON). Decode rows also give each engine's weight bytes per token (gptport's
graph, llama.cpp's GGUF tensors) and the share of the memory bandwidth probed around gptport's row
that its tokens/s read: where both sit at the same wall, that is the figure that shows it. Writes
benchmarks/results/vs-llamacpp-<cpu>-<avx2|avx512|amx>.json naming the CPU and its vector extensions.

    python benchmarks/bench_llamacpp.py --llama-bench PATH [--shapes small,gpt2-124m] [--rounds 3]
        [--repeat 3] [--gen-len 128] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_decode import random_weights
from bench_tokenizer import big_corpus

from gptport.machine import describe, slug, vector_class

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "llamacpp"
PROMPT = 64
ROWS = (("fp32", "f32", "F32"), ("int8", "q8_0", "Q8_0"))  # gptport precision, export-gguf outtype, GGUF name


def gptport(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "gptport.cli.main", *args], check=True)


def model_dir(shape: str, corpus: Path) -> Path:
    """bench_decode.py's random weights of the shape, as gptport graphs (fp32, int8; static cache) and
    F32 / Q8_0 GGUFs; kept when all are there (the weights are seeded: the same every time)."""
    d = WORK / shape
    wanted = [d / "model.static.onnx", d / "model.int8.static.onnx", *(d / f"model.{t}.gguf" for _, t, _ in ROWS)]
    if not all(p.exists() for p in wanted):
        random_weights(d, shape, corpus)
        gptport("export", str(d), "--precision", "fp32,int8", "--no-gate", "--force")
        for _, outtype, _ in ROWS:
            gptport("export-gguf", str(d), "--outtype", outtype, "--force")
    return d


def llama_round(bench: Path, d: Path, gen: int, repeat: int, threads: int) -> dict[str, dict[str, float]]:
    """llama-bench's mean prefill (pp64) and decode (tg GEN) tokens/s per GGUF type."""
    out: dict[str, dict[str, float]] = {}
    for precision, outtype, _ in ROWS:
        r = subprocess.run([str(bench), "-m", str(d / f"model.{outtype}.gguf"), "-t", str(threads), "-p", str(PROMPT),
                            "-n", str(gen), "-r", str(repeat), "-o", "json"], check=True, capture_output=True,
                           text=True)
        tests = json.loads(r.stdout)
        pp = next(t for t in tests if t["n_prompt"] == PROMPT and t["n_gen"] == 0)
        tg = next(t for t in tests if t["n_gen"] == gen and t["n_prompt"] == 0)
        out[precision] = {"prefill_tok_s": pp["avg_ts"], "decode_tok_s": tg["avg_ts"],
                          "build_commit": pp["build_commit"], "cpu_info": pp["cpu_info"]}
    return out


def gptport_round(d: Path, gen: int, repeat: int, threads: int) -> dict[str, dict[str, float]]:
    """`gptport bench`'s mean prefill and decode tokens/s of the static-cache graphs, with the
    bandwidth probed around each row."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.json"
        gptport("bench", str(d), "--precisions", ",".join(p for p, _, _ in ROWS), "--kv-cache", "static", "--batch",
                "1", "--prompt-len", str(PROMPT), "--gen-len", str(gen), "--repeat", str(repeat), "--threads",
                str(threads), "--no-torch-baseline", "--json", str(path))
        rows = json.loads(path.read_text())["rows"]
    keys = ("prefill_tok_s", "decode_tok_s", "bandwidth_gb_s", "bandwidth_fraction", "weight_bytes_per_token")
    return {r["precision"]: {k: r[k] for k in keys} for r in rows if not r["error"]}


def gguf_bytes_per_token(path: Path) -> int:
    """Bytes of weights one llama.cpp decode step reads from a GGUF: every tensor but the position table
    (one row read), and the token table unless a separate output matrix is the head."""
    from gguf import GGUFReader

    sizes = {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}
    skip = {"position_embd.weight"} | ({"token_embd.weight"} if "output.weight" in sizes else set())
    return sum(n for name, n in sizes.items() if name not in skip)


def summarize(rounds: list[dict[str, Any]], d: Path) -> list[dict[str, Any]]:
    """Per (precision, phase): the median of each engine over rounds, their ratio, each round's ratio;
    decode rows also give each engine's weight bytes per token and the share of the bandwidth probed
    around gptport's run in the same round that its tokens/s read (median over rounds)."""
    rows = []
    for phase in ("decode", "prefill"):
        for precision, outtype, gguf in ROWS:
            key = f"{phase}_tok_s"
            ours = [r["gptport"][precision][key] for r in rounds]
            theirs = [r["llama_cpp"][precision][key] for r in rounds]
            row = {"row": f"{precision} / {gguf} {phase}", "gptport_tok_s": statistics.median(ours),
                   "llama_cpp_tok_s": statistics.median(theirs),
                   "ratio": statistics.median(ours) / statistics.median(theirs),
                   "round_ratios": [round(a / b, 3) for a, b in zip(ours, theirs, strict=True)]}
            if phase == "decode":
                probes = [r["gptport"][precision]["bandwidth_gb_s"] * 1e9 for r in rounds]
                ours_bytes = rounds[0]["gptport"][precision]["weight_bytes_per_token"]
                theirs_bytes = gguf_bytes_per_token(d / f"model.{outtype}.gguf")
                row |= {"probe_gb_s": statistics.median(probes) / 1e9,
                        "gptport_bytes_per_token": ours_bytes, "llama_cpp_bytes_per_token": theirs_bytes,
                        "gptport_bandwidth_fraction": statistics.median(
                            t * ours_bytes / b for t, b in zip(ours, probes, strict=True)),
                        "llama_cpp_bandwidth_fraction": statistics.median(
                            t * theirs_bytes / b for t, b in zip(theirs, probes, strict=True))}
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bench", type=Path, required=True, help="llama.cpp's llama-bench binary")
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3, help="measured runs per engine, row and round")
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--corpus", type=Path, default=None, help="text for the tokenizers (default: bench_tokenizer's)")
    args = ap.parse_args()
    if not args.llama_bench.is_file():
        raise SystemExit(f"--llama-bench {args.llama_bench}: no such file")
    corpus = args.corpus or big_corpus()
    machine = describe()
    shapes = args.shapes.split(",")
    dirs = {shape: model_dir(shape, corpus) for shape in shapes}
    rounds: dict[str, list[dict[str, Any]]] = {shape: [] for shape in shapes}
    for i in range(args.rounds):
        for shape, d in dirs.items():
            run = {"gptport": lambda d=d: gptport_round(d, args.gen_len, args.repeat, args.threads),
                   "llama_cpp": lambda d=d: llama_round(args.llama_bench, d, args.gen_len, args.repeat, args.threads)}
            order = list(run) if i % 2 == 0 else list(reversed(run))
            rounds[shape].append({"order": order, **{engine: run[engine]() for engine in order}})
    first = rounds[shapes[0]][0]["llama_cpp"]["fp32"]
    result = {"benchmark": "gptport bench --kv-cache static against llama.cpp's llama-bench on the same random "
                           "weights (bench_decode.py's), interleaved rounds; medians over rounds of each engine's mean",
              "machine": {**machine, "llama_bench_cpu_info": first["cpu_info"]},
              "llama_cpp_commit": first["build_commit"],
              "settings": {"batch": 1, "prompt": PROMPT, "gen": args.gen_len, "threads": args.threads,
                           "rounds": args.rounds, "repeat": args.repeat, "gptport_graph": "model*.static.onnx",
                           "gptport_variants": "export --no-gate (int8: MatMulNBits 8-bit block 128)"},
              "shapes": {shape: {"rows": summarize(rounds[shape], dirs[shape]), "rounds": rounds[shape]}
                         for shape in shapes}}
    out = HERE / "results" / f"vs-llamacpp-{slug(machine['cpu'])}-{vector_class(machine['isa'])}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{machine['cpu']}, {machine['cores']} cores, {' '.join(machine['isa'])}; {args.threads} threads, batch 1, "
          f"prompt {PROMPT}, {args.gen_len} new tokens, {args.rounds} rounds x {args.repeat} runs (medians)")
    print(f"{'shape':<11}{'row':<24}{'gptport tok/s':>15}{'llama.cpp tok/s':>17}{'ratio':>8}  "
          f"{'of probed bandwidth':>22}  rounds")
    for shape in shapes:
        for r in result["shapes"][shape]["rows"]:
            share = (f"{r['gptport_bandwidth_fraction']:.0%} / {r['llama_cpp_bandwidth_fraction']:.0%}"
                     if "probe_gb_s" in r else "")
            print(f"{shape:<11}{r['row']:<24}{r['gptport_tok_s']:>15,.1f}{r['llama_cpp_tok_s']:>17,.1f}"
                  f"{r['ratio']:>7.2f}x  {share:>22}  {', '.join(f'{x:.2f}' for x in r['round_ratios'])}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
