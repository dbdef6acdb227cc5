"""The README's performance table: `gptport bench` on random weights of the `small` (vocabulary 4096)
and `gpt2-124m` (vocabulary 50257) shapes, batch 1, prompt 64, 2 threads, against torch eager and
the machine's memory bandwidth, fp32 and the 8- and 4-bit variants, each as the static-cache graph
and as the contract graph (model*.onnx), in one run per shape.

Random weights cannot pass the variants' accuracy gate, so the variants are written by
`gptport export --no-gate` (the same schemes, recorded as ungated; bench warns about each).
Writes benchmarks/results/decode-<shape>.json.

    python benchmarks/bench_decode.py [--shapes small,gpt2-124m] [--gen-len 128] [--repeat 15]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "decode"
VOCAB = {"tiny": 1024, "small": 4096, "gpt2-124m": 50257}  # tiny: bench_train.py's vocabulary


def gptport(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "gptport.cli.main", *args], check=True)


def random_weights(d: Path, shape: str, corpus: Path) -> None:
    """Seeded random weights of the preset's shape in model directory `d`, with a tokenizer of the
    shape's vocabulary trained on `corpus` (kept when already there)."""
    import torch

    from gptport import tokenizer as bpe
    from gptport.config import ModelConfig, load_preset
    from gptport.training import checkpoint
    from gptport.training.model import GPT

    if not (d / "tokenizer.json").exists():
        gptport("train-tokenizer", str(corpus), "--vocab-size", str(VOCAB[shape]), "--out", str(d), "--force")
    tok = bpe.load(d)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, **load_preset(shape).model)
    checkpoint.save_model(d, GPT(cfg), cfg, tok, 0)


def model_dir(shape: str, corpus: Path, optimize: bool) -> Path:
    """A model directory with random weights of the preset's shape, exported (fp32, int8, int4; the
    variants with --no-gate)."""
    d = WORK / shape
    random_weights(d, shape, corpus)
    gptport("export", str(d), "--precision", "fp32,int8,int4", "--no-gate", "--force",
            "--optimize" if optimize else "--no-optimize")
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-optimize", dest="optimize", action="store_false",
                    help="export without onnxruntime's transformer optimizer (plain ONNX ops)")
    ap.add_argument("--corpus", type=Path, default=HERE / "work" / "big_corpus.txt",
                    help="text to train the tokenizers on (bench_tokenizer.py builds it)")
    args = ap.parse_args()
    if not args.corpus.exists():
        raise SystemExit(f"{args.corpus}: missing; run benchmarks/bench_tokenizer.py first, or pass --corpus")
    for shape in args.shapes.split(","):
        d = model_dir(shape, args.corpus, args.optimize)
        out = HERE / "results" / f"decode-{shape}{'' if args.optimize else '-plain'}.json"
        gptport("bench", str(d), "--precisions", "fp32,int8,int4", "--kv-cache", "static,concat",
                "--batch", "1", "--prompt-len", "64",
                "--gen-len", str(args.gen_len), "--repeat", str(args.repeat), "--threads", str(args.threads),
                "--json", str(out))
        result = json.loads(out.read_text())
        result["shape"] = shape
        result["optimized"] = args.optimize
        out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
