"""Batch-1 decode and prefill per precision: `gptport bench` on random weights of the `small` (vocabulary
4096) and `gpt2-124m` (vocabulary 50257) shapes, batch 1, prompt 64, 2 threads, against torch eager and
the machine's memory bandwidth, fp32 and the 8- and 4-bit variants, each as the static-cache graph and as
the contract graph (model*.onnx). One round per shape (`gptport bench` repeats each row --repeat times).

Random weights cannot pass the variants' accuracy gate, so the variants are written by
`gptport export --no-gate` (the same schemes, recorded as ungated; bench warns about each).

    python -m benchmarks.decode.precisions [--shapes small,gpt2-124m] [--gen-len 128] [--repeat 15]
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.models import cli as gptport
from benchmarks.harness.models import decode_model
from benchmarks.harness.run import Run

COLUMNS = ("engine", "precision", "kv_cache", "prefill_tok_s", "decode_tok_s", "speedup_vs_torch",
           "bandwidth_fraction", "error")


def bench(d: Path, gen_len: int, repeat: int, threads: int) -> dict[str, Any]:
    """`gptport bench`'s JSON for the directory's fp32, int8 and int4 graphs, both caches, batch 1."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        gptport("bench", str(d), "--precisions", "fp32,int8,int4", "--kv-cache", "static,concat", "--batch", "1",
                "--prompt-len", "64", "--gen-len", str(gen_len), "--repeat", str(repeat), "--threads", str(threads),
                "--json", str(out))
        return dict(json.loads(out.read_text()))


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-optimize", dest="optimize", action="store_false",
                    help="export without onnxruntime's transformer optimizer (plain ONNX ops)")
    args = ap.parse_args()
    run, rows = Run(), []
    for shape in args.shapes.split(","):
        d = decode_model(shape, args.optimize)
        with run.round(shape=shape) as rnd:
            rnd.data["bench"] = bench(d, args.gen_len, args.repeat, args.threads)
        for r in rnd.data["bench"]["rows"]:
            rows.append({"shape": shape, **{k: r.get(k) for k in COLUMNS}})
            print(f"{shape:10} {r['engine']:6} {r['precision']:5} {r['kv_cache']:7} prefill "
                  f"{r['prefill_tok_s'] or 0:>9,.0f} decode {r['decode_tok_s'] or 0:>8,.0f} tok/s")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, cli.settings(args),
                                   label=args.label or ("" if args.optimize else "plain")), args.results)


if __name__ == "__main__":
    main()
