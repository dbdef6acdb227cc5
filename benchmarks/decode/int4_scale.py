"""int4 decode where the weights dominate: gptport's int4 graphs at the Qwen2.5-0.5B and Llama-3.2-1B shapes
(random bf16 weights, benchmarks.export.scale's directories) against llama.cpp's Q4_0 and Q4_K_M of the same
weights and onnxruntime-genai's int4 build of the same directory, batch 1, interleaved in one run, with the
weight bytes each reads per token and the share of the probed memory bandwidth that its tokens/s read.

What is measured is made once and kept (benchmarks.harness.int4_models): gptport's `import-hf` + `export
--precision int4 --no-gate` (the builder's MatMulNBits graphs: blocks of 128, int8 compute, the head at 8 bits);
gptport's F32 GGUF (`export-gguf --outtype f32`) quantized by llama-quantize to Q4_0 and Q4_K_M; genai's builder
(`-p int4 -e cpu`, in its own venv). --levers adds gptport's int4 static-cache graph built with other
MatMulNBits settings (int4_models.LEVERS: block 32/64, accuracy level 0, the head at 4 bits); --caches concat
adds the contract graph (model.int4.onnx); --thread-levers 1 adds the export's graph on that many threads.

Each round (probed; judged by probe.RULE) runs every configuration of a shape once, the order rotating between
rounds: `gptport bench` (--kv-cache static or concat, batch 1, PROMPT tokens then GEN new ones, 1 warm-up,
REPEAT runs; its own read-bandwidth probe around each run, whose median in the round is the round's bandwidth
for every engine), llama-bench (prefill: -p PROMPT -n 0; decode: -p 0 -n GEN -d PROMPT, i.e. GEN tokens after a
PROMPT-token cache, as gptport's; its warm-up, -r REPEAT) and genai's generator (benchmarks.harness.genai_decode:
the same prompt and new tokens, 1 warm-up, REPEAT runs, on THREADS threads). Figures: medians over the kept
rounds; ratios of gptport's configurations to each reference; the goals of issue 59 (decode >= 1.2x Q4_0,
>= 1.0x Q4_K_M, >= 1.2x genai; >= 70% of the probed bandwidth at 1B) judged on the export's graph and on the
fastest configuration.

    python -m benchmarks.decode.int4_scale --llama-bench PATH --llama-quantize PATH
        [--shapes qwen2.5-0.5b,llama-3.2-1b] [--rounds 3] [--repeat 2] [--prompt-len 64] [--gen-len 64]
        [--threads 2] [--levers b128,head4,...] [--caches static,concat] [--thread-levers 1] [--no-genai]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.decode.vs_llamacpp import gguf_bytes_per_token
from benchmarks.export.scale import GENAI_VENV, genai_venv, genai_versions
from benchmarks.harness import cli, int4_models, results, tables
from benchmarks.harness.models import ROOT
from benchmarks.harness.models import cli as gptport
from benchmarks.harness.run import Run

SHAPES = ("qwen2.5-0.5b", "llama-3.2-1b")
EXPORTED = "gptport int4"
REFERENCES = {"llama.cpp Q4_0": "vs_q4_0", "llama.cpp Q4_K_M": "vs_q4_k_m", "genai int4": "vs_genai"}
GOALS = {"vs_q4_0": 1.2, "vs_q4_k_m": 1.0, "vs_genai": 1.2}
BANDWIDTH_GOAL = {"llama-3.2-1b": 0.70}
Measure = Callable[[], dict[str, Any]]


def bench_row(d: Path, cache: str, prompt: int, gen: int, repeat: int, threads: int) -> dict[str, Any]:
    """`gptport bench`'s int4 row of the model directory `d` (its `cache` graph)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.json"
        gptport("bench", str(d), "--precisions", "int4", "--kv-cache", cache, "--batch", "1", "--prompt-len",
                str(prompt), "--gen-len", str(gen), "--repeat", str(repeat), "--threads", str(threads),
                "--no-torch-baseline", "--json", str(path), capture=True)
        row = json.loads(path.read_text())["rows"][0]
    if row["error"]:
        raise SystemExit(f"gptport bench {d}: {row['error']}")
    return {"prefill_tok_s": row["prefill_tok_s"], "decode_tok_s": row["decode_tok_s"],
            "probe_gb_s": row["bandwidth_gb_s"], "bytes_per_token": row["weight_bytes_per_token"]}


def llama_row(bench: Path, gguf: Path, prompt: int, gen: int, repeat: int, threads: int) -> dict[str, Any]:
    """llama-bench's prefill (pp PROMPT) and decode (tg GEN after a PROMPT-token cache) tokens/s of `gguf`."""
    def run(*args: str) -> dict[str, Any]:
        out = subprocess.run([str(bench), "-m", str(gguf), "-t", str(threads), "-r", str(repeat), "-o", "json",
                              *args], check=True, capture_output=True, text=True).stdout
        return json.loads(out)[0]

    pp = run("-p", str(prompt), "-n", "0")
    tg = run("-p", "0", "-n", str(gen), "-d", str(prompt))
    return {"prefill_tok_s": pp["avg_ts"], "decode_tok_s": tg["avg_ts"], "build_commit": pp["build_commit"],
            "cpu_info": pp["cpu_info"], "bytes_per_token": gguf_bytes_per_token(gguf)}


def genai_row(python: Path, folder: Path, prompt: int, gen: int, repeat: int, threads: int) -> dict[str, Any]:
    """onnxruntime-genai's generator on `folder` (benchmarks.harness.genai_decode, in the builder's venv)."""
    from gptport.runtime.host_measures import weight_bytes_per_token

    out = subprocess.run([str(python), "-m", "benchmarks.harness.genai_decode", str(folder), "--prompt-len",
                          str(prompt), "--gen-len", str(gen), "--repeat", str(repeat), "--threads", str(threads)],
                         check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out) | {"bytes_per_token": weight_bytes_per_token(folder / "model.onnx")}


def configurations(shape: str, args: Any, python: Path | None) -> dict[str, Measure]:
    """Every configuration of `shape` measured in a round, by name, its files made first where missing."""
    work = int4_models.shape_dir(shape)
    hf = args.hf_root / shape / "hf"
    if not (hf / "config.json").is_file():
        raise SystemExit(f"{hf}: missing; make it with python -m benchmarks.export.scale --shapes {shape} --make-only")
    m = int4_models.gptport_dir(hf, work)
    p, g, r, t = args.prompt_len, args.gen_len, args.repeat, args.threads
    out: dict[str, Measure] = {EXPORTED: lambda: bench_row(m, "static", p, g, r, t)}
    if "concat" in args.caches.split(","):
        out[f"{EXPORTED} concat"] = lambda: bench_row(m, "concat", p, g, r, t)
    for n in [int(x) for x in args.thread_levers.split(",") if x]:
        out[f"{EXPORTED} {n} thread{'s' if n > 1 else ''}"] = lambda n=n: bench_row(m, "static", p, g, r, n)
    for lever in [x for x in args.levers.split(",") if x]:
        d = int4_models.lever_dir(m, work, lever)
        out[f"{EXPORTED} {lever}"] = lambda d=d: bench_row(d, "static", p, g, r, t)
    for kind, gguf in int4_models.ggufs(m, work, args.llama_quantize).items():
        name = f"llama.cpp {int4_models.GGUF_TYPES[kind]}"
        out[name] = lambda gguf=gguf: llama_row(args.llama_bench, gguf, p, g, r, t)
    if python is not None:
        folder = int4_models.genai_folder(python, hf, work)
        out["genai int4"] = lambda: genai_row(python, folder, p, g, r, t)
    return out


def summarize(shape: str, rounds: list[dict[str, Any]], names: list[str] | None = None) -> list[dict[str, Any]]:
    """Per configuration (`names`, in that order; default: the first round's): median decode and prefill
    tokens/s over `rounds`, bytes per token, the median share of each round's bandwidth (the median of gptport's
    probes in it) its decode reads, and for gptport's configurations the ratio of its median decode to each
    reference's (with each round's)."""
    probes = [statistics.median(c["probe_gb_s"] for c in r.values() if "probe_gb_s" in c) * 1e9 for r in rounds]
    names = names or list(rounds[0])
    med = {name: statistics.median(r[name]["decode_tok_s"] for r in rounds) for name in names}
    rows = []
    for name in names:
        figs = [r[name] for r in rounds]
        nbytes = figs[0]["bytes_per_token"]
        row = {"table": "int4 decode and prefill, batch 1", "shape": shape, "configuration": name,
               "decode_tok_s": med[name], "prefill_tok_s": statistics.median(f["prefill_tok_s"] for f in figs),
               "weight_mb_per_token": nbytes / 1e6,
               "bandwidth_share": statistics.median(f["decode_tok_s"] * nbytes / b
                                                    for f, b in zip(figs, probes, strict=True)),
               "probe_gb_s": statistics.median(probes) / 1e9}
        if name.startswith("gptport"):
            for ref, key in REFERENCES.items():
                if ref in med:
                    row[key] = med[name] / med[ref]
                    row[f"{key}_rounds"] = [round(r[name]["decode_tok_s"] / r[ref]["decode_tok_s"], 3) for r in rounds]
        rows.append(row)
    return rows


def goal_rows(shape: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 59's goals on the export's graph and on gptport's fastest configuration of `shape`."""
    ours = [r for r in rows if r["shape"] == shape and r["configuration"].startswith("gptport")]
    if not ours:
        return []
    fastest = max(ours, key=lambda r: r["decode_tok_s"])
    out = []
    for r in dict.fromkeys([EXPORTED, fastest["configuration"]]):
        row = next((x for x in ours if x["configuration"] == r), None)
        if row is None:
            continue
        goal = {"table": "goals (issue 59)", "shape": shape, "configuration": r}
        for key, want in GOALS.items():
            if key in row:
                goal[key] = row[key]
                goal[f"{key}_met"] = row[key] >= want
        if shape in BANDWIDTH_GOAL:
            goal["bandwidth_share"] = row["bandwidth_share"]
            goal["bandwidth_met"] = row["bandwidth_share"] >= BANDWIDTH_GOAL[shape]
        out.append(goal)
    return out


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--llama-bench", type=Path, required=True, help="llama.cpp's llama-bench binary")
    ap.add_argument("--llama-quantize", type=Path, required=True, help="llama.cpp's llama-quantize binary")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2, help="measured runs per configuration and round")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--levers", default="", help="gptport graphs of other settings, of "
                    f"{', '.join(int4_models.LEVERS)}")
    ap.add_argument("--caches", default="static", help="gptport's export graphs: static, and concat (model.int4.onnx)")
    ap.add_argument("--thread-levers", default="", help="the export's static graph also on these thread counts")
    ap.add_argument("--no-genai", action="store_true", help="leave onnxruntime-genai out")
    ap.add_argument("--hf-root", type=Path, default=int4_models.WORK / "scale", help="benchmarks.export.scale's work")
    ap.add_argument("--genai-venv", type=Path, default=GENAI_VENV, help="onnxruntime-genai's builder's venv")
    args = ap.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    bad = [s for s in shapes if s not in SHAPES] + [x for x in args.levers.split(",") if x and x not in
                                                   int4_models.LEVERS]
    for tool in (args.llama_bench, args.llama_quantize):
        if not tool.is_file():
            raise SystemExit(f"{tool}: no such file")
    if bad:
        raise SystemExit(f"--shapes / --levers: {', '.join(bad)} unknown")
    python = None if args.no_genai else genai_venv(args.genai_venv)
    configs = {shape: configurations(shape, args, python) for shape in shapes}
    run = Run()
    for shape, measure in configs.items():
        for rnd in run.series(args.rounds, shape=shape):
            for name in rnd.rotation(list(measure)):
                rnd.data[name] = measure[name]()
    rows = [row for shape in shapes
            for row in summarize(shape, [r.data for r in run.kept(shape=shape)], list(configs[shape]))]
    rows += [g for shape in shapes for g in goal_rows(shape, rows)]
    print("\n".join(tables.tables(rows)))
    first = next(v for v in run.rounds[0].data.values() if "build_commit" in v)
    extra = {"llama.cpp": first["build_commit"]} | (genai_versions(python) if python else {})
    settings = cli.settings(args, batch=1, gptport_export="import-hf + export --precision int4 --no-gate",
                            levers={k: str(v) for k, v in int4_models.LEVERS.items() if k in args.levers.split(",")},
                            weights="random bf16 of the real shapes (benchmarks.harness.hf_shapes)")
    notes = ["bandwidth_share: decode tok/s x weight bytes per token / the round's probe (gptport bench's read "
             "bandwidth on THREADS threads, the median of its probes in the round)",
             "gptport's head has the tokenizer's rows (import-hf drops the config's padding rows), llama.cpp's and "
             "genai's the config's vocab_size"]
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label,
                                   notes=notes, extra_versions=extra,
                                   details={"llama_bench_cpu_info": first["cpu_info"]}), args.results)


if __name__ == "__main__":
    main()
