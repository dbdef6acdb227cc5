"""gptport against llama.cpp on the same weights: `gptport bench --kv-cache static` and llama.cpp's
`llama-bench`, interleaved, for the README's per-machine comparison table.

Random weights of the `small` and `gpt2-124m` shapes (seeded: the same every run) are exported to
gptport's fp32 and int8 graphs (`gptport export --no-gate`: random weights cannot pass the accuracy gate)
and to F32 and Q8_0 GGUFs (`gptport export-gguf`). Each round runs, per shape, both
engines one after the other (the order alternates between rounds): llama-bench (-p 64 -n GEN -t
THREADS, its own warm-up, -r REPEAT) and gptport bench (batch 1, prompt 64, GEN new tokens, 1 warm-up,
REPEAT runs, THREADS threads). Each engine's figure in a round is the mean of its runs (llama-bench's
avg_ts, bench's mean); the table gives the median over the kept rounds and the ratio of the medians (and
each round's ratio). Decode rows also give each engine's weight bytes per token (gptport's
graph, llama.cpp's GGUF tensors) and the share of the memory bandwidth probed around gptport's row
that its tokens/s read: where both sit at the same wall, that is the figure that shows it.

    python -m benchmarks.decode.vs_llamacpp --llama-bench PATH [--shapes small,gpt2-124m] [--rounds 3]
        [--repeat 3] [--gen-len 128] [--threads 2]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.models import cli as gptport
from benchmarks.harness.models import llamacpp_model
from benchmarks.harness.run import Run

PROMPT = 64
ROWS = (("fp32", "f32", "F32"), ("int8", "q8_0", "Q8_0"))  # gptport precision, export-gguf outtype, GGUF name


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


def summarize(rounds: list[dict[str, Any]], d: Path, kinds: tuple[tuple[str, str, str], ...] = ROWS,
              files: dict[str, Path] | None = None) -> list[dict[str, Any]]:
    """Per (precision, phase) of `kinds` ((gptport precision, GGUF type, its name)): the median of each engine
    over rounds, their ratio, each round's ratio; decode rows also give each engine's weight bytes per token
    and the share of the bandwidth probed around gptport's run in the same round that its tokens/s read
    (median over rounds). The GGUFs are `files` by type, else d/model.TYPE.gguf."""
    rows = []
    for phase in ("decode", "prefill"):
        for precision, outtype, gguf in kinds:
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
                theirs_bytes = gguf_bytes_per_token((files or {}).get(outtype, d / f"model.{outtype}.gguf"))
                row |= {"probe_gb_s": statistics.median(probes) / 1e9,
                        "gptport_bytes_per_token": ours_bytes, "llama_cpp_bytes_per_token": theirs_bytes,
                        "gptport_bandwidth_fraction": statistics.median(
                            t * ours_bytes / b for t, b in zip(ours, probes, strict=True)),
                        "llama_cpp_bandwidth_fraction": statistics.median(
                            t * theirs_bytes / b for t, b in zip(theirs, probes, strict=True))}
            rows.append(row)
    return rows


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--llama-bench", type=Path, required=True, help="llama.cpp's llama-bench binary")
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3, help="measured runs per engine, row and round")
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not args.llama_bench.is_file():
        raise SystemExit(f"--llama-bench {args.llama_bench}: no such file")
    shapes = args.shapes.split(",")
    dirs = {shape: llamacpp_model(shape) for shape in shapes}
    run = Run()
    for _ in range(args.rounds):
        for shape, d in dirs.items():
            measure = {"gptport": lambda d=d: gptport_round(d, args.gen_len, args.repeat, args.threads),
                       "llama_cpp": lambda d=d: llama_round(args.llama_bench, d, args.gen_len, args.repeat,
                                                            args.threads)}
            with run.round(shape=shape) as rnd:
                for engine in rnd.order(list(measure)):
                    rnd.data[engine] = measure[engine]()
    rows = [{"shape": shape, **row} for shape in shapes
            for row in summarize([r.data for r in run.kept(shape=shape)], dirs[shape])]
    first = run.rounds[0].data["llama_cpp"]["fp32"]
    settings = cli.settings(args, batch=1, prompt=PROMPT, gptport_graph="model*.static.onnx",
                            gptport_variants="export --no-gate (int8: MatMulNBits 8-bit block 128)",
                            weights="random, seeded (the same every run)")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label,
                                   extra_versions={"llama.cpp": first["build_commit"]},
                                   details={"llama_bench_cpu_info": first["cpu_info"]}), args.results)
    print(f"{args.threads} threads, batch 1, prompt {PROMPT}, {args.gen_len} new tokens, {args.rounds} rounds x "
          f"{args.repeat} runs (medians of the kept rounds)")
    print(f"{'shape':<11}{'row':<24}{'gptport tok/s':>15}{'llama.cpp tok/s':>17}{'ratio':>8}  "
          f"{'of probed bandwidth':>22}  rounds")
    for r in rows:
        share = (f"{r['gptport_bandwidth_fraction']:.0%} / {r['llama_cpp_bandwidth_fraction']:.0%}"
                 if "probe_gb_s" in r else "")
        print(f"{r['shape']:<11}{r['row']:<24}{r['gptport_tok_s']:>15,.1f}{r['llama_cpp_tok_s']:>17,.1f}"
              f"{r['ratio']:>7.2f}x  {share:>22}  {', '.join(f'{x:.2f}' for x in r['round_ratios'])}")


if __name__ == "__main__":
    main()
