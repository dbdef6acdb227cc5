"""The models the benchmarks measure, made once under benchmarks/work/ and kept: a >= 30 MB corpus of
real text, seeded random weights of a preset's shape (speed does not depend on what weights learned),
and the exports each family of benchmarks reads. And the CLI as a user runs it."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "benchmarks" / "work"
SHAKESPEARE = ROOT.parent / "shared" / "corpora" / "tinyshakespeare.txt"
BIG_MIN_BYTES = 30_000_000
# the tokenizers' vocabularies: tiny is the training benchmark's, small and gpt2-124m the presets'
VOCAB = {"tiny": 1024, "small": 4096, "gpt2-124m": 50257}


def cli(*args: str, capture: bool = False, python: str = sys.executable, timeout: float | None = None) -> str:
    """`gptport ARGS` in a fresh process (as a user runs it), failing on a non-zero exit; its stdout with `capture`."""
    r = subprocess.run([python, "-m", "gptport.cli.main", *args], check=True, text=True, timeout=timeout,
                       stdout=subprocess.PIPE if capture else None)
    return r.stdout or ""


def big_corpus() -> Path:
    """Real text found on this machine (the interpreter's standard-library sources, then vim and perl
    docs where present) as one UTF-8 file of at least 30 MB, made once."""
    out = WORK / "big_corpus.txt"
    if out.exists() and out.stat().st_size >= BIG_MIN_BYTES:
        return out
    roots = [(Path(sysconfig.get_paths()["stdlib"]), "*.py"), (Path("/usr/share/vim"), "*.txt"),
             (Path("/usr/share/perl"), "*.pod")]
    WORK.mkdir(parents=True, exist_ok=True)
    total = 0
    with open(out, "wb") as f:
        for root, pattern in roots:
            for path in sorted(root.rglob(pattern)):
                if "site-packages" in path.parts or not path.is_file():
                    continue
                data = path.read_bytes()
                try:
                    data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                f.write(data + b"\n")
                total += len(data) + 1
    if total < BIG_MIN_BYTES:
        raise SystemExit(f"found only {total / 1e6:.1f} MB of text on this machine; need 30 MB")
    return out


def random_weights(d: Path, shape: str, corpus: Path | None = None) -> None:
    """Seeded random weights of the preset `shape` in model directory `d`, with a tokenizer of the shape's
    vocabulary trained on `corpus` (default big_corpus(); kept when already there)."""
    import torch

    from gptport import tokenizer as bpe
    from gptport.config import ModelConfig
    from gptport.preset import load_preset
    from gptport.training import checkpoint
    from gptport.training.model import GPT

    if not (d / "tokenizer.json").exists():
        cli("train-tokenizer", str(corpus or big_corpus()), "--vocab-size", str(VOCAB[shape]), "--out", str(d),
            "--force")
    tok = bpe.load(d)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, **load_preset(shape).model)
    checkpoint.save_model(d, GPT(cfg), cfg, tok, 0)


def serve_model(shape: str, gguf: bool = False) -> Path:
    """WORK/serve/<shape>: random weights exported to fp32 ONNX (the static-cache graph serve runs), and as
    an F32 GGUF for llama.cpp with `gguf`; made once."""
    d = WORK / "serve" / shape
    if not (d / "model.static.onnx").exists():
        random_weights(d, shape)
        cli("export", str(d), "--force")
    if gguf and not (d / "model.f32.gguf").exists():
        cli("export-gguf", str(d), "--outtype", "f32")
    return d


def decode_model(shape: str, optimize: bool = True) -> Path:
    """WORK/decode/<shape>: random weights exported afresh to fp32, int8 and int4 (the variants --no-gate:
    random weights cannot pass the accuracy gate), with or without onnxruntime's transformer optimizer."""
    d = WORK / "decode" / shape
    random_weights(d, shape)
    cli("export", str(d), "--precision", "fp32,int8,int4", "--no-gate", "--force",
        "--optimize" if optimize else "--no-optimize")
    return d


GGUF_TYPES = ("f32", "q8_0")


def llamacpp_model(shape: str) -> Path:
    """WORK/llamacpp/<shape>: random weights as gptport's fp32 and int8 static-cache graphs (--no-gate) and as
    F32 and Q8_0 GGUFs; kept when all are there (the weights are seeded: the same every time)."""
    d = WORK / "llamacpp" / shape
    wanted = [d / "model.static.onnx", d / "model.int8.static.onnx", *(d / f"model.{t}.gguf" for t in GGUF_TYPES)]
    if not all(p.exists() for p in wanted):
        random_weights(d, shape)
        cli("export", str(d), "--precision", "fp32,int8", "--no-gate", "--force")
        for outtype in GGUF_TYPES:
            cli("export-gguf", str(d), "--outtype", outtype, "--force")
    return d


def n_ctx(d: Path) -> int:
    """The model directory's context length (config.json)."""
    import json

    return int(json.loads((d / "config.json").read_text())["model"]["n_ctx"])
