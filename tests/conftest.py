"""Shared fixtures: small seeded corpora and a tokenizer trained on one, made in temporary dirs."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from gptport import tokenizer as bpe
from gptport.corpus import CorpusReader, resolve_sources

SYLLABLES = ["ka", "to", "ri", "men", "sol", "ve", "qua", "lin", "dor", "ex", "pu", "ny", "the", "and",
             "ing", "er", "straß", "café", "наш", "日本", "語", "🙂", "ü", "ñ"]


THREADS = "GPTPORT_THREADS"  # gptport/runtime/onnx_engine.py's THREADS_ENV


def pytest_configure(config: pytest.Config) -> None:
    """In the controlling process, before the xdist workers start (they and the CLI's subprocesses inherit
    the environment): each worker's share of the cores for onnxruntime (GPTPORT_THREADS) and torch
    (OMP_NUM_THREADS): pools of every core in each worker spin against each other. A variable set before the
    run is left as it is."""
    if hasattr(config, "workerinput"):
        return
    workers = config.getoption("numprocesses", None) or 0
    if isinstance(workers, int) and workers > 1:
        share = str(max(1, (os.cpu_count() or 1) // workers))
        os.environ.setdefault(THREADS, share)
        os.environ.setdefault("OMP_NUM_THREADS", share)


def make_text(n_lines: int, seed: int = 0) -> str:
    """Seeded pseudo-text: words of random syllables, punctuation, a little non-ASCII."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))
                 for _ in range(rng.randint(3, 12))]
        lines.append(" ".join(words) + rng.choice([".", ",", "!", "?", ";", ""]))
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(make_text(3000), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory, corpus_file: Path) -> Path:
    out = tmp_path_factory.mktemp("model")
    tok, report = bpe.train(CorpusReader(resolve_sources([corpus_file])), 512)
    bpe.save(tok, out, report, force=True)
    return out


@pytest.fixture(scope="session")
def tok(tokenizer_dir: Path) -> bpe.BPETokenizer:
    return bpe.load(tokenizer_dir)


def build_model_dir(out: Path, tokenizer_dir: Path, corpus: Path, steps: int, **model: object) -> Path:
    """A model directory holding a small GPT trained for `steps` steps (0: only initialised)."""

    from gptport.config import ModelConfig, TrainConfig
    from gptport.training import shards as data
    from gptport.training.train import Trainer

    shutil.copytree(tokenizer_dir, out)
    tok = bpe.load(out)
    shape = {"n_ctx": 32, "d_model": 64, "n_layer": 2, "n_head": 4, **model}
    cfg = ModelConfig(vocab_size=tok.vocab_size, **shape)  # type: ignore[arg-type]
    tcfg = TrainConfig(steps=max(steps, 1), batch_size=16, lr=3e-3, warmup_steps=5, eval_every=max(steps, 1),
                       eval_batches=2, device="cpu", seed=0)
    shards = data.prepare(out, CorpusReader(resolve_sources([corpus])), tok, 0.1)
    trainer = Trainer(out, cfg, tcfg, shards, tok, bpe.token_bytes(tok))
    if steps:
        trainer.run()
    else:
        trainer.save()
    return out


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    """A tied, learned-position model (n_ctx 96) trained for 150 steps, exported to fp32, int8 and fp16."""
    from gptport.export import exporter

    out = build_model_dir(tmp_path_factory.mktemp("trained") / "m", tokenizer_dir, corpus_file, steps=150, n_ctx=96)
    exporter.export(out, ["fp32", "int8", "fp16"])
    return out


@pytest.fixture(scope="session")
def structured_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    """A model with room for JSON and tools (n_ctx 768), trained for 30 steps so that its text is not uniform noise."""
    from gptport.export import exporter

    out = build_model_dir(tmp_path_factory.mktemp("structured") / "m", tokenizer_dir, corpus_file, steps=30,
                          n_ctx=768)
    exporter.export(out, ["fp32"])
    return out


VARIANTS = {
    "learned-tied": {"pos_encoding": "learned", "tie_embeddings": True},
    "sinusoidal-untied": {"pos_encoding": "sinusoidal", "tie_embeddings": False},
    "sinusoidal-tied-nobias": {"pos_encoding": "sinusoidal", "tie_embeddings": True, "bias": False, "gelu": "exact"},
    "learned-untied": {"pos_encoding": "learned", "tie_embeddings": False},
}


@pytest.fixture(scope="session", params=list(VARIANTS))
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path,
             corpus_file: Path) -> tuple[Path, Any, Any]:
    """A model of each config variant (initialised, not trained), exported to fp32: (dir, torch model,
    model.onnx's engine)."""
    from gptport.export import exporter
    from gptport.runtime.onnx_engine import load_cpu
    from gptport.training.checkpoint import load_model

    out = build_model_dir(tmp_path_factory.mktemp(request.param) / "m", tokenizer_dir, corpus_file, steps=0,
                          **VARIANTS[request.param])
    exporter.export(out, ["fp32"])
    model, _ = load_model(out, bpe.load(out))
    return out, model, load_cpu(out / "model.onnx")
