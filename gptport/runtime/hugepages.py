"""The weights onnxruntime holds, backed by 2 MiB pages once a CPU session is made (Linux).

A decode step streams every weight from memory. With 4 KiB pages that stream crosses a page every 4 KiB:
a TLB miss each time, and the hardware prefetchers stop at page boundaries. Linux backs anonymous memory
with transparent huge pages only where a program asks (`/sys/kernel/mm/transparent_hugepage/enabled` is
`madvise` on most distributions), and neither onnxruntime nor glibc's malloc asks by default (numpy does,
for its own large arrays: which is why a numpy bandwidth probe read faster than a decode step). So after a
session is made, the process's large anonymous mappings that are mostly resident (the initializers and
the MatMul kernels' prepacked weights) are marked MADV_HUGEPAGE and collapsed in place (MADV_COLLAPSE,
Linux 6.1+). Nothing changes but the page size; where the kernel refuses (older kernels, THP `never`),
the memory stays as it was. GPTPORT_HUGEPAGES=0 turns it off.

A serving engine's static KV cache is faulted in when it is made (`resident_zeros`): numpy's zeros come from
calloc, whose pages the kernel maps at their first touch, so the first requests of a fresh server paid for
touching their rows' buffers (gpt2-124m's 16 slots of 1,024 positions, 1.2 GB: 1.4 s in each of its first two
8-row prompt runs against 0.24 s after; made resident at once, 0.09 s), unless it would take over half the
memory known to be available (`fits`). No torch here.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

HUGE = 2 << 20  # bytes in a huge page on x86-64 and arm64 (4 KiB base pages)
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
MIN_BYTES = 16 << 20  # smaller mappings are not the weights
MIN_RESIDENT = 0.75  # of a mapping's size: a sparse reservation is not filled out


@dataclass
class Backed:
    """What `back_weights` did: bytes collapsed into huge pages, mappings tried, how many of them the kernel
    refused, and why (or why nothing was tried)."""

    collapsed: int = 0
    mappings: int = 0
    refused: int = 0
    why: str = ""


_CHECKS = contextvars.ContextVar("gptport_hugepages_checks", default=False)


@contextlib.contextmanager
def checks_only() -> Iterator[None]:
    """Sessions made inside are not backed: export's checks run each session for a few steps and drop it, and
    collapsing every large mapping again took ~1.5 s a session in SmolLM2's export (nine of them, under cProfile)."""
    token = _CHECKS.set(True)
    try:
        yield
    finally:
        _CHECKS.reset(token)


def enabled() -> bool:
    """Linux, and not turned off by GPTPORT_HUGEPAGES=0."""
    return sys.platform == "linux" and os.environ.get("GPTPORT_HUGEPAGES", "1") != "0"


def _mappings(path: str = "/proc/self/smaps") -> list[tuple[int, int, int]]:
    """(start, end, resident bytes) of each anonymous read-write private mapping: no file behind it, the
    brk heap included (glibc's malloc serves blocks up to 32 MiB from it: most weight matrices), not a stack."""
    out: list[tuple[int, int, int]] = []
    current: list[int] | None = None
    with open(path, encoding="ascii", errors="replace") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                name = head[5] if len(head) > 5 else ""
                start, end = (int(x, 16) for x in head[0].split("-"))
                anonymous = name in ("", "[heap]")
                current = [start, end, 0] if head[1].startswith("rw") and head[1][3] == "p" and anonymous else None
                if current is not None:
                    out.append(current)  # type: ignore[arg-type]
            elif current is not None and head and head[0] == "Rss:":
                current[2] = int(head[1]) * 1024
    return [tuple(m) for m in out]  # type: ignore[misc]


def back_weights() -> Backed:
    """Mark and collapse the large, mostly resident anonymous mappings into huge pages (see the module)."""
    if not enabled():
        return Backed(why="off (GPTPORT_HUGEPAGES=0, or not Linux)")
    if _CHECKS.get():
        return Backed(why="a checking session (hugepages.checks_only)")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        maps = _mappings()
    except (OSError, AttributeError, ValueError) as e:
        return Backed(why=f"cannot read or advise the mappings ({e})")
    done = Backed()
    for start, end, resident in maps:
        lo, hi = -(-start // HUGE) * HUGE, end // HUGE * HUGE  # the huge-page-aligned part
        if hi - lo < MIN_BYTES or resident < MIN_RESIDENT * (end - start):
            continue
        done.mappings += 1
        if madvise(lo, hi - lo, MADV_HUGEPAGE) == 0 and madvise(lo, hi - lo, MADV_COLLAPSE) == 0:
            done.collapsed += hi - lo
        else:
            done.refused += 1
            done.why = done.why or f"the kernel refused ({os.strerror(ctypes.get_errno())})"
    return done


def _number(path: str, key: str = "") -> int | None:
    """An integer read from a /proc or cgroup file: the whole file, or the kB value of the line `key`."""
    try:
        with open(path, encoding="ascii") as f:
            if not key:
                text = f.read().strip()
                return None if text == "max" else int(text)
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup") -> int | None:
    """The memory this process may still take: the kernel's MemAvailable, less where a cgroup (v2's memory.max
    less memory.current, or v1's limit less usage: a container's) leaves less; None where nothing says."""
    room = [_number(meminfo, "MemAvailable:")]
    for limit, used in (("memory.max", "memory.current"), ("memory/memory.limit_in_bytes",
                                                           "memory/memory.usage_in_bytes")):
        most, now = _number(f"{cgroup}/{limit}"), _number(f"{cgroup}/{used}")
        if most is not None and now is not None:
            room.append(most - now)
    known = [r for r in room if r is not None]
    return min(known) if known else None


def fits(nbytes: int, meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup") -> bool:
    """Whether `nbytes` may be made resident at once: at most half of what `available` says (False where it says
    nothing). A cache larger than that is faulted in as its rows are written, as before."""
    room = available(meminfo, cgroup)
    return room is not None and nbytes <= room // 2


def resident_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zero-filled array whose every page is faulted in now (numpy advises its large arrays onto huge pages
    itself, where the kernel's THP mode is madvise or always)."""
    a = np.zeros(shape, dtype=dtype)
    a.fill(0)  # the first touch of every page, now rather than in a request
    return a
