"""Corpus -> token shards (data/train.bin, data/val.bin, data/meta.json), and batch sampling.

Shards are a cache keyed by the corpus content's sha256, the tokenizer's sha256 and the split:
a changed corpus or tokenizer is noticed and the data prepared again. Documents (files) are joined
with `<|endoftext|>`; the last `val_fraction` of the token stream is the validation split.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gptport import atomic, paths
from gptport.corpus import CorpusReader
from gptport.errors import ArtifactError, InputError
from gptport.tokenizer import BPETokenizer

DATA_DIR = paths.DATA_DIR
META = paths.DATA_META
ENCODE_BATCH = 64  # chunks per encode_batch call: enough to keep every core busy
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Shards:
    """Prepared token shards, memory-mapped."""

    train: np.ndarray  # (N_train,) uint16 | uint32
    val: np.ndarray  # (N_val,)
    meta: dict[str, object]
    reused: bool


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def corpus_sha256(reader: CorpusReader) -> str | None:
    """sha256 over every source's name and content, read once; None for stdin (it cannot be re-read)."""
    if any(s.path is None for s in reader.sources):
        return None
    h = hashlib.sha256()
    for source in reader.sources:
        assert source.path is not None
        h.update(source.name.encode() + b"\0")
        with open(source.path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        h.update(b"\0")
    return h.hexdigest()


def read_shard(path: Path, dtype: np.dtype, vocab_size: int | None = None, tokens: int | None = None) -> np.ndarray:
    """A token shard (train.bin, val.bin) as a read-only array, refused with its name unless it holds
    whole `dtype` tokens (`tokens` of them, when given), each below `vocab_size` when it is given (one
    pass over the shard). An empty shard is an empty array."""
    try:
        size = path.stat().st_size
        arr = np.memmap(path, dtype=dtype, mode="r") if size else np.zeros(0, dtype)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: missing") from None
    except ValueError as e:  # a size that is not a whole number of tokens
        raise ArtifactError(f"{path}: {size} bytes are not whole {dtype.name} tokens ({e})") from e
    if tokens is not None and len(arr) != tokens:
        raise ArtifactError(f"{path}: holds {len(arr)} tokens, not the {tokens} its {META} records")
    if vocab_size is not None and len(arr) and int(arr.max()) >= vocab_size:
        raise ArtifactError(f"{path}: holds token id {int(arr.max())}, beyond the vocabulary of {vocab_size}")
    return arr


def _load(data_dir: Path, meta: dict[str, object], reused: bool, vocab_size: int | None = None) -> Shards:
    """The shards that `meta` describes, their lengths checked, their ids too when `vocab_size` is given."""
    dtype = np.dtype(str(meta["dtype"]))
    train = read_shard(data_dir / paths.TRAIN_SHARD, dtype, vocab_size, _count(meta, "train_tokens"))
    val = read_shard(data_dir / paths.VAL_SHARD, dtype, vocab_size, _count(meta, "val_tokens"))
    return Shards(train, val, meta, reused)


def _count(meta: dict[str, object], key: str) -> int | None:
    value = meta.get(key)
    return value if isinstance(value, int) else None


def prepare(
    model_dir: Path,
    reader: CorpusReader,
    tok: BPETokenizer,
    val_fraction: float,
    on_progress: Callable[[int], None] | None = None,
) -> Shards:
    """Tokenize the corpus into shards, or reuse shards made from the same corpus and tokenizer."""
    data_dir = model_dir / DATA_DIR
    key = {"corpus_sha256": corpus_sha256(reader), "tokenizer_sha256": tok.sha256,
           "val_fraction": val_fraction, "format_version": FORMAT_VERSION}
    meta_path = data_dir / META
    if key["corpus_sha256"] is not None and meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except ValueError:  # not JSON, not UTF-8: a damaged cache, made again below
            meta = {}
        if isinstance(meta, dict) and all(meta.get(k) == v for k, v in key.items()):
            with contextlib.suppress(ArtifactError, KeyError, TypeError, ValueError):  # damaged: made again
                return _load(data_dir, meta, reused=True, vocab_size=tok.vocab_size)
    data_dir.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tok.vocab_size)
    all_path = atomic.temp_name(data_dir / "all.bin")
    try:
        n_tokens = _tokenize(reader, tok, dtype, all_path, on_progress)
        if reader.stats.bytes == 0:
            raise InputError("empty corpus: no text in " + ", ".join(s.name for s in reader.sources))
        stream = np.memmap(all_path, dtype=dtype, mode="r")
        n_val = max(1, int(n_tokens * val_fraction))
        for name, part in ((paths.TRAIN_SHARD, stream[: n_tokens - n_val]),
                           (paths.VAL_SHARD, stream[n_tokens - n_val:])):
            with atomic.atomic_path(data_dir / name) as tmp:
                part.tofile(tmp)
        del stream
    finally:
        all_path.unlink(missing_ok=True)
    meta = {**key, "corpus_sha256": key["corpus_sha256"] or reader.stats.sha256.hexdigest(),
            "dtype": dtype.name, "tokens": n_tokens, "train_tokens": n_tokens - n_val, "val_tokens": n_val,
            "documents": reader.stats.documents, "bytes": reader.stats.bytes,
            "replaced_bytes": reader.stats.replaced_bytes,
            "sources": [s.name for s in reader.sources]}
    atomic.write_text(meta_path, json.dumps(meta, indent=2) + "\n")
    return _load(data_dir, meta, reused=False)


def _tokenize(reader: CorpusReader, tok: BPETokenizer, dtype: np.dtype, out: Path,
              on_progress: Callable[[int], None] | None) -> int:
    """Encode every document's chunks, ENCODE_BATCH chunks a call across documents (a corpus of many small
    files keeps every core busy too), writing ids and an EOT after each document."""
    n = 0
    eot = np.array([tok.eot_id], dtype=dtype)
    pending: list[str | None] = []  # chunks in order, None where a document ends (its EOT)
    texts = 0  # the chunks among them

    with open(out, "wb") as f:

        def flush() -> int:
            encoded = iter(tok.encode_batch([c for c in pending if c is not None]))
            parts = [eot if c is None else np.asarray(next(encoded), dtype=dtype) for c in pending]
            joined = np.concatenate(parts)
            joined.tofile(f)
            if on_progress:
                on_progress(reader.stats.bytes)
            pending.clear()
            return len(joined)

        for _, chunks in reader.documents():
            for chunk in chunks:
                pending.append(chunk)
                texts += 1
                if texts == ENCODE_BATCH:
                    n, texts = n + flush(), 0
            pending.append(None)
        if pending:
            n += flush()
        f.flush()
        os.fsync(f.fileno())
    return n


def check_fits(shards: Shards, n_ctx: int) -> None:
    """Refuse a corpus whose splits are too short for one context window."""
    need = n_ctx + 1
    for split, arr in (("training", shards.train), ("validation", shards.val)):
        if len(arr) < need:
            total = int(shards.meta["tokens"])  # type: ignore[arg-type]
            raise InputError(
                f"corpus too short: its {split} split has {len(arr)} tokens (of {total} in all) but one "
                f"context window needs {need} (n_ctx {n_ctx}); add text, lower --set n_ctx=..., or "
                "raise --val-fraction")


def sample_batch(data: np.ndarray, n_ctx: int, batch_size: int, rng: np.random.Generator
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Random windows: inputs (B, T) and next-token targets (B, T), int64."""
    starts = rng.integers(0, len(data) - n_ctx, size=batch_size)  # (B,)
    idx = starts[:, None] + np.arange(n_ctx + 1)[None, :]  # (B, T+1)
    window = data[idx].astype(np.int64)  # (B, T+1)
    return window[:, :-1], window[:, 1:]


def step_batches(data: np.ndarray, n_ctx: int, batch_size: int, rng: np.random.Generator, slots: int,
                 mine: range) -> list[tuple[np.ndarray, np.ndarray]]:
    """One optimizer step's micro-batches over all ranks. The step has `slots` (world size × grad_accum)
    micro-batches drawn in order from one generator that every rank holds in the same state; each rank
    draws them all, so the generators stay equal, and reads the slots in `mine` (rank r: slots
    r·accum … r·accum + accum − 1). The step's data thus depends on world size × grad_accum only: 2 ranks
    × accum 1 see what 1 process × accum 2 sees, in the same order; one process draws as it always did."""
    out = []
    for slot in range(slots):
        if slot in mine:
            out.append(sample_batch(data, n_ctx, batch_size, rng))
        else:
            rng.integers(0, len(data) - n_ctx, size=batch_size)  # another rank's slot: advance alike
    return out


def load_prepared(model_dir: Path) -> Shards:
    """The shards another process (rank 0) has just prepared in `model_dir`, without re-reading the corpus."""
    meta_path = model_dir / DATA_DIR / META
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{meta_path}: unreadable ({e}); every rank must see the model directory rank 0 "
                         "prepared the shards in (a shared file system, or a copy with its data/)") from e
    return _load(model_dir / DATA_DIR, meta, reused=True)


def eval_windows(data: np.ndarray, n_ctx: int, count: int) -> np.ndarray:
    """`count` evenly spaced window starts covering the split, the same at every eval."""
    last = len(data) - n_ctx - 1
    return np.unique(np.linspace(0, max(last, 0), num=count).astype(np.int64))
