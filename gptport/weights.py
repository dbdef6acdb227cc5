"""A model directory's weights read one tensor at a time: model.safetensors' header checked first
(safetensors_file.read_header), each tensor read from the file (not mapped: a mapped page read once stays resident
and counted until the map is dropped) and widened to float32 only when it is asked for, so that reading a model of
any size costs about its largest tensor (rows() reads a block of a tensor's rows: less still). What the op-by-op
builder and the layer-by-layer reference read; an imported model's weights may be bf16 or fp16 (import-hf keeps its
source's type). No torch here: the base layer."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
from ml_dtypes import bfloat16

from gptport.errors import ArtifactError, escaped
from gptport.safetensors_file import Entry, read_header

FLOATS = ("F32", "F16", "BF16")
READ_BLOCK = 16 << 20  # bytes into() reads at a time (through one buffer it keeps)


def typed(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Little-endian bytes of a float tensor viewed as their type (F32, F16, BF16), nothing copied."""
    return raw.view({"F32": "<f4", "F16": "<f2"}.get(dtype, bfloat16))


def widen(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Little-endian bytes of a float tensor as float32 (bf16: its 16 bits are float32's high half; ml_dtypes' cast
    is 4x faster than shifting the bits through uint32)."""
    values = typed(raw, dtype)
    return values if dtype == "F32" else values.astype(np.float32)


class ModelWeights(Mapping[str, np.ndarray]):
    """The tensors of a safetensors file by name, as float32 arrays read when asked, each into memory of its own
    (freed when the caller drops it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, Entry] = read_header(path, FLOATS)
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
        self._start = 8 + n
        self._buffer = np.zeros(0, np.uint8)  # into()'s reads (at most READ_BLOCK bytes, or one row)

    @classmethod
    def open(cls, model_dir: Path) -> ModelWeights:
        """model.safetensors of `model_dir` (paths.WEIGHTS), its header checked."""
        from gptport.paths import WEIGHTS

        return cls(model_dir / WEIGHTS)

    def _read(self, e: Entry, begin: int, size: int, into: np.ndarray | None = None) -> np.ndarray:
        """`size` bytes of tensor `e` from its byte `begin`, into memory of their own (or the front of `into`)."""
        raw = np.empty(size, np.uint8) if into is None else into[:size]
        view, offset, got = memoryview(raw), self._start + e.begin + begin, 0
        with open(self.path, "rb", buffering=0) as f:
            while got < raw.size:  # a read may return less than asked (a large one, a signal)
                n = os.preadv(f.fileno(), [view[got:]], offset + got)
                if not n:
                    raise ArtifactError(f"{self.path}: truncated while tensor {escaped(e.name)} was read")
                got += n
        return raw

    def __getitem__(self, name: str) -> np.ndarray:
        e = self.entries[name]
        if e.dtype == "F32":
            return widen(self._read(e, 0, e.end - e.begin), e.dtype).reshape(e.shape)
        out = np.empty(e.shape, np.float32)  # the 16-bit bytes pass through into()'s buffer: no copy of their own
        self.into(name, out)
        return out

    def into(self, name: str, out: np.ndarray) -> None:
        """Tensor `name` written into `out` (its shape, any float type: the values converted as numpy casts),
        READ_BLOCK bytes of rows at a time through a buffer kept between calls: a reader that refills the same
        arrays (the layer-by-layer reference's modules) touches no new memory."""
        e = self.entries[name]
        if tuple(out.shape) != e.shape:
            raise ArtifactError(f"{self.path}: tensor {escaped(name)} has shape {list(e.shape)}, asked for "
                                f"{list(out.shape)}")
        n = e.shape[0] if e.shape else 1
        flat = out.reshape(n, -1)  # (rows, the rest): a view of `out`
        row = (e.end - e.begin) // n if n else 0
        per = max(1, READ_BLOCK // max(row, 1))
        if self._buffer.size < min(n, per) * row:
            self._buffer = np.empty(min(n, per) * row, np.uint8)
        for a in range(0, n, per):
            b = min(n, a + per)
            np.copyto(flat[a:b], typed(self._read(e, a * row, (b - a) * row, self._buffer), e.dtype).reshape(b - a, -1),
                      casting="unsafe")

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows start:stop of a tensor (clipped to its rows, as a slice is) as float32, reading only them: a huge
        embedding quantized a block of rows at a time."""
        e = self.entries[name]
        if not e.shape:
            raise ValueError(f"tensor {name} is a scalar: it has no rows")
        start, stop, _ = slice(start, stop).indices(e.shape[0])
        n = max(0, stop - start)
        row = (e.end - e.begin) // e.shape[0] if e.shape[0] else 0
        return widen(self._read(e, start * row, n * row), e.dtype).reshape(n, *e.shape[1:])

    def take(self, name: str, index: np.ndarray) -> np.ndarray:
        """Rows `index` (any shape of row numbers, each checked by the caller) of a tensor as float32, index.shape +
        its row's shape, reading only those rows: a reference's embedding lookup costs its tokens, not the table."""
        e = self.entries[name]
        flat = np.asarray(index, dtype=np.int64).reshape(-1)
        unique, inverse = np.unique(flat, return_inverse=True)
        if unique.size and not 0 <= unique[0] <= unique[-1] < e.shape[0]:
            raise ValueError(f"tensor {name} has {e.shape[0]} rows, asked for {unique[0]}..{unique[-1]}")
        row = (e.end - e.begin) // e.shape[0] if e.shape and e.shape[0] else 0
        raw = np.concatenate([self._read(e, int(r) * row, row) for r in unique]) if unique.size else \
            np.zeros(0, np.uint8)
        rows = widen(raw, e.dtype).reshape(unique.size, *e.shape[1:])
        return rows[inverse.reshape(-1)].reshape(*np.shape(index), *e.shape[1:])

    @property
    def names(self) -> list[str]:
        return list(self.entries)

    def dtype(self, name: str) -> str:
        """The tensor's type as the file holds it: F32, F16 or BF16 (get() and rows() give float32 whatever it is)."""
        return self.entries[name].dtype

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name].shape

    def stored_bytes(self) -> int:
        """Bytes of every tensor as the file holds them."""
        return sum(e.end - e.begin for e in self.entries.values())

    def check_shapes(self, expected: Mapping[str, tuple[int, ...]]) -> None:
        """Every tensor `expected` names present with that shape, and no other: an ArtifactError naming the first
        that is not, before anything is read."""
        for name, shape in expected.items():
            if name not in self.entries:
                raise ArtifactError(f"{self.path}: no tensor {escaped(name)}, which config.json's model has")
            if self.entries[name].shape != tuple(shape):
                raise ArtifactError(f"{self.path}: tensor {escaped(name)} has shape {list(self.entries[name].shape)},"
                                    f" config.json's model says {list(shape)}")
        extra = sorted(set(self.entries) - set(expected))
        if extra:
            raise ArtifactError(f"{self.path}: tensor {escaped(extra[0])} is not one config.json's model has")


def open_weights(model_dir: Path) -> ModelWeights:
    """model.safetensors of `model_dir` (paths.WEIGHTS), its header checked."""
    return ModelWeights.open(model_dir)


@runtime_checkable
class Lazy(Protocol):
    """Weights that tell a tensor's shape, and read a few of its rows, without reading the whole tensor."""

    def shape(self, name: str) -> tuple[int, ...]: ...

    def take(self, name: str, index: np.ndarray) -> np.ndarray: ...


def take(weights: Mapping[str, np.ndarray], name: str, index: np.ndarray) -> np.ndarray:
    """Rows `index` of tensor `name` as float32 (index.shape + its row's shape): only those rows read where
    `weights` reads a file (Lazy: ModelWeights.take), else gathered from the array."""
    if isinstance(weights, Lazy):
        return weights.take(name, index)
    return np.asarray(weights[name], dtype=np.float32)[np.asarray(index, dtype=np.int64)]


def shape_of(weights: Mapping[str, np.ndarray], name: str) -> tuple[int, ...]:
    """Tensor `name`'s shape, from the file's header where `weights` reads one (Lazy: nothing read)."""
    if isinstance(weights, Lazy):
        return weights.shape(name)
    return tuple(np.shape(weights[name]))


def shapes_of(weights: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape, from a file's header where `weights` reads one (nothing read), else the arrays'."""
    if isinstance(weights, ModelWeights):
        return {k: e.shape for k, e in weights.entries.items()}
    return {k: tuple(np.shape(v)) for k, v in weights.items()}


def float32_bytes(weights: Mapping[str, np.ndarray]) -> int:
    """Bytes of every tensor of `weights` widened to float32 (from the header where there is one)."""
    return sum(4 * int(np.prod(shape, dtype=np.int64)) for shape in shapes_of(weights).values())
