"""Freed memory handed back to the system during an export.

glibc's malloc keeps large freed blocks in its heap for reuse, and raises the size above which it maps a
block on its own each time such a block is freed; its threads' arenas do not share what they keep. A
process that makes and drops model-sized buffers one after another (graphs in memory, onnxruntime sessions,
quantizer copies) so grows toward the sum of them: measured on a 135M model, a session made, run and dropped
left 0.5 GB resident that malloc_trim returned, and 0.07 GB with the threshold fixed at 1 MiB. Export fixes it
there (mallopt), so every block of a MiB or more is mapped alone and unmapped when freed, and after each step
collects what the step left in reference cycles (release). Nothing happens where the C library has no mallopt
or malloc_trim (macOS, Windows) but the collection. No torch here."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
from collections.abc import Iterator

M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h
THRESHOLD = 1 << 20  # bytes: blocks this large are mapped on their own


def _libc_function(name: str) -> ctypes._CFuncPtr | None:
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def return_large_blocks() -> bool:
    """Fix malloc's mmap threshold at THRESHOLD for this process; whether the C library took it."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD))


@contextlib.contextmanager
def settled() -> Iterator[None]:
    """Inside, what existed before (the imported modules' objects: ~0.2M, 0.11 s a collection) is left out of
    release()'s collections (gc.freeze), which then look at what the export made; given back to them after."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def release() -> None:
    """After a step: what it left in reference cycles collected (onnxruntime's transformer optimizer leaves
    model-sized ones: 1.25 GB of a 135M model's until the collector runs), and the heap's free pages handed back
    (malloc_trim) where the C library has it."""
    gc.collect()
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
        trim(0)
