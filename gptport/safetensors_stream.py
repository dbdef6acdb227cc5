"""A safetensors file written tensor by tensor: the header (every name, dtype, shape and offset) is known up front
and written first, then each tensor's bytes as its `chunks` make them, hashed as they go, so that writing a model of
any size holds about one chunk. The disk it needs is known before it starts (check_disk refuses a disk with less
free, in one line); a disk that fills while writing is an ArtifactError naming the file. What import-hf and
import-gguf write model.safetensors with. No torch: the base layer."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gptport.errors import ArtifactError, InputError
from gptport.safetensors_file import DTYPE_BITS, METADATA

GIB = 2**30


@dataclass(frozen=True)
class Out:
    """One tensor to write: its bytes are what `chunks()` yields, in order (arrays or bytes, little-endian)."""

    name: str
    dtype: str  # a safetensors dtype: F32, F16, BF16
    shape: tuple[int, ...]
    chunks: Callable[[], Iterable[np.ndarray | bytes]]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * DTYPE_BITS[self.dtype] // 8


@dataclass(frozen=True)
class Written:
    """How far a write has come: tensors and bytes written of the whole (done 0: about to start)."""

    done: int
    total: int
    name: str
    bytes_done: int
    bytes_total: int


Progress = Callable[[Written], None]


def ordered(outs: Iterable[Out]) -> list[Out]:
    """The tensors in the order they are written: wider types first (as safetensors' own writer does), so that each
    tensor starts at a multiple of its type's width; otherwise as given."""
    return sorted(outs, key=lambda o: -DTYPE_BITS[o.dtype])


def header(outs: list[Out], metadata: dict[str, str]) -> bytes:
    """The header: its length, then its JSON (padded to 8 bytes, so the data starts 8-byte aligned)."""
    entries: dict[str, Any] = {METADATA: metadata}
    offset = 0
    for o in outs:
        entries[o.name] = {"dtype": o.dtype, "shape": list(o.shape), "data_offsets": [offset, offset + o.nbytes]}
        offset += o.nbytes
    blob = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob


def file_size(outs: list[Out], metadata: dict[str, str]) -> int:
    """The bytes the file will have."""
    return len(header(outs, metadata)) + sum(o.nbytes for o in outs)


def check_disk(where: Path, needed: int, what: str) -> None:
    """Refuse before writing when the file system of `where` (or its nearest existing parent) has less than
    `needed` bytes free, in one line with both numbers."""
    place = where
    while not place.exists() and place != place.parent:
        place = place.parent
    free = shutil.disk_usage(place).free
    if free < needed:
        raise InputError(f"{where}: {what} needs {needed / GIB:.2f} GiB ({needed:,} bytes) but its disk has "
                         f"{free / GIB:.2f} GiB ({free:,} bytes) free")


def write(path: Path, outs: list[Out], metadata: dict[str, str], progress: Progress | None = None) -> str:
    """The safetensors file at `path` (`outs` in ordered()'s order), fsynced; its sha256. A tensor whose chunks come
    to another length than its shape's is an ArtifactError naming it."""
    head = header(outs, metadata)
    total = len(head) + sum(o.nbytes for o in outs)
    digest = hashlib.sha256(head)
    if progress is not None:
        progress(Written(0, len(outs), "", len(head), total))
    try:
        with open(path, "wb") as f:
            f.write(head)
            done = len(head)
            for i, o in enumerate(outs, 1):
                written = 0
                for chunk in o.chunks():
                    data = memoryview(np.ascontiguousarray(chunk) if isinstance(chunk, np.ndarray) else chunk).cast("B")
                    f.write(data)
                    digest.update(data)
                    written += len(data)
                if written != o.nbytes:
                    raise ArtifactError(f"{path}: tensor {o.name} came to {written:,} bytes, not the {o.nbytes:,} of "
                                        f"{o.dtype} {list(o.shape)}")
                done += written
                if progress is not None:
                    progress(Written(i, len(outs), o.name, done, total))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise ArtifactError(f"{path}: the disk filled while writing it ({total:,} bytes)") from None
        raise ArtifactError(f"{path}: cannot be written ({e.strerror or e})") from None
    return digest.hexdigest()
