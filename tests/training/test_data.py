"""Token shards: documents joined by EOT, uint16, cached by corpus and tokenizer hash."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from gptport import tokenizer as bpe
from gptport.corpus import CorpusReader, resolve_sources
from gptport.errors import InputError
from gptport.training import shards as data
from tests.conftest import make_text


def reader(*paths: Path) -> CorpusReader:
    return CorpusReader(resolve_sources(list(paths)))


@pytest.fixture()
def model_dir(tmp_path: Path, tokenizer_dir: Path) -> Path:
    out = tmp_path / "m"
    shutil.copytree(tokenizer_dir, out)
    return out


def test_shards_hold_each_document_then_eot(model_dir: Path, tok: bpe.BPETokenizer, tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(make_text(200, seed=1))
    b.write_text(make_text(200, seed=2))
    shards = data.prepare(model_dir, reader(a, b), tok, val_fraction=0.1)
    stream = np.concatenate([shards.train, shards.val])
    expected = tok.encode(a.read_text()) + [tok.eot_id] + tok.encode(b.read_text()) + [tok.eot_id]
    assert stream.dtype == np.uint16
    assert stream.tolist() == expected
    assert len(shards.val) == int(len(expected) * 0.1)
    assert shards.meta["documents"] == 2 and not shards.reused


def test_batches_cross_documents_in_order(model_dir: Path, tok: bpe.BPETokenizer, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of several documents share an encode_batch call: each document's ids, then its EOT, in order,
    an empty document included (a lone EOT) and one of several chunks split across calls."""
    monkeypatch.setattr(data, "ENCODE_BATCH", 3)
    files = []
    for i, words in enumerate([40, 0, 900, 5, 60, 0, 7]):
        files.append(tmp_path / f"d{i}.txt")
        files[-1].write_text(make_text(words, seed=i) if words else "")
    corpus = CorpusReader(resolve_sources(files), chunk_bytes=512)
    expected, counts = [], []
    for _, chunks in CorpusReader(resolve_sources(files), chunk_bytes=512).documents():
        pieces = list(chunks)
        counts.append(len(pieces))
        expected += [i for c in pieces for i in tok.encode(c)] + [tok.eot_id]
    assert counts[1] == counts[5] == 0 and counts[2] > 2 * data.ENCODE_BATCH  # empty ones; one over several calls
    shards = data.prepare(model_dir, corpus, tok, val_fraction=0.1)
    assert np.concatenate([shards.train, shards.val]).tolist() == expected
    assert expected.count(tok.eot_id) >= len(files) and shards.meta["documents"] == len(files)


def test_cache_is_reused_and_invalidated(model_dir: Path, tok: bpe.BPETokenizer, tmp_path: Path,
                                         corpus_file: Path) -> None:
    a = tmp_path / "a.txt"
    a.write_text(make_text(100, seed=3))
    assert not data.prepare(model_dir, reader(a), tok, 0.1).reused
    assert data.prepare(model_dir, reader(a), tok, 0.1).reused
    a.write_text(make_text(100, seed=4))  # changed corpus
    assert not data.prepare(model_dir, reader(a), tok, 0.1).reused
    assert not data.prepare(model_dir, reader(a), tok, 0.2).reused  # changed split
    other, _ = bpe.train(reader(corpus_file), 300)
    assert not data.prepare(model_dir, reader(a), other, 0.2).reused  # changed tokenizer


def test_token_bytes_count_the_text(tok: bpe.BPETokenizer) -> None:
    text = "naïve café 日本語 🙂 and plain words\n"
    ids = tok.encode(text) + [tok.eot_id]
    assert int(bpe.token_bytes(tok)[ids].sum()) == len(text.encode("utf-8"))


def test_corpus_too_short_for_a_window(model_dir: Path, tok: bpe.BPETokenizer, tmp_path: Path) -> None:
    a = tmp_path / "a.txt"
    a.write_text("only a few words here\n")
    shards = data.prepare(model_dir, reader(a), tok, 0.1)
    with pytest.raises(InputError, match="corpus too short"):
        data.check_fits(shards, n_ctx=64)


def test_batches_are_next_token_pairs() -> None:
    arr = np.arange(100, dtype=np.uint16)
    x, y = data.sample_batch(arr, 8, 4, np.random.default_rng(0))
    assert x.shape == y.shape == (4, 8)
    assert (y - x == 1).all()
