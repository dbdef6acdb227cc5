"""Shared fixtures: small seeded corpora and a tokenizer trained on one, made in temporary dirs."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gptport import tokenizer as bpe
from gptport.corpus import CorpusReader, resolve_sources

SYLLABLES = ["ka", "to", "ri", "men", "sol", "ve", "qua", "lin", "dor", "ex", "pu", "ny", "the", "and",
             "ing", "er", "straß", "café", "наш", "日本", "語", "🙂", "ü", "ñ"]


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
