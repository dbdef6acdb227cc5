"""Huge pages under the weights (runtime/hugepages.py): a large resident anonymous mapping is collapsed into
2 MiB pages, a sparse one is left alone, and GPTPORT_HUGEPAGES=0 turns it off. Linux only; skipped with the
reason where the kernel offers no transparent huge pages or no MADV_COLLAPSE. export's checking sessions are not
backed (hugepages.checks_only)."""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gptport.runtime import hugepages

SIZE = 64 << 20

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="transparent huge pages are Linux's")


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "absent"
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else text.strip()


def _smaps_field(address: int, field: str) -> int:
    """A field (kB) of the mapping that holds `address`, in bytes."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":") and len(head) >= 5:
            start, end = (int(x, 16) for x in head[0].split("-"))
            inside = start <= address < end
        elif inside and head and head[0] == field + ":":
            return int(head[1]) * 1024
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.fixture
def region() -> Iterator[tuple[mmap.mmap, int]]:
    """A private anonymous mapping of SIZE bytes, nothing resident yet, and its address."""
    m = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    address = ctypes.addressof(ctypes.c_char.from_buffer(m))
    yield m, address
    m.close()


def test_a_resident_mapping_is_collapsed_into_huge_pages(region: tuple[mmap.mmap, int]) -> None:
    if _thp_mode() in ("never", "absent"):
        pytest.skip(f"transparent huge pages are {_thp_mode()} on this kernel")
    m, address = region
    m.write(b"\x01" * SIZE)  # every page resident, on 4 KiB pages (THP is madvise-only or off for it)
    before = _smaps_field(address, "AnonHugePages")
    done = hugepages.back_weights()
    if done.collapsed == 0 and done.refused:
        pytest.skip(f"no MADV_COLLAPSE here: {done.why}")
    after = _smaps_field(address, "AnonHugePages")
    assert done.mappings >= 1 and done.collapsed >= SIZE - 2 * hugepages.HUGE, done
    assert after >= SIZE - 2 * hugepages.HUGE > before, (before, after)
    assert m[:4] == b"\x01" * 4 and m[SIZE - 4:] == b"\x01" * 4  # the same bytes


def test_a_sparse_mapping_is_not_filled_out(region: tuple[mmap.mmap, int]) -> None:
    m, address = region
    m[0:1] = b"\x01"  # one page resident of 16,384
    hugepages.back_weights()
    assert _smaps_field(address, "Rss") < 4 << 20


def test_off_by_environment(region: tuple[mmap.mmap, int], monkeypatch: pytest.MonkeyPatch) -> None:
    m, address = region
    m.write(b"\x01" * SIZE)
    monkeypatch.setenv("GPTPORT_HUGEPAGES", "0")
    done = hugepages.back_weights()
    assert done.collapsed == 0 and done.mappings == 0 and done.why.startswith("off")
    assert _smaps_field(address, "AnonHugePages") == 0


def test_not_inside_exports_checks(region: tuple[mmap.mmap, int]) -> None:
    """export's checking sessions (hugepages.checks_only) are not backed; after the block, sessions are again."""
    m, address = region
    m.write(b"\x01" * SIZE)
    with hugepages.checks_only():
        done = hugepages.back_weights()
    assert done.collapsed == 0 and done.mappings == 0 and "checking" in done.why, done
    assert _smaps_field(address, "AnonHugePages") == 0
    assert hugepages.back_weights().mappings >= 1 or not hugepages.enabled()


def _rss() -> int:
    """This process's resident bytes (VmRSS)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_a_static_cache_buffer_is_resident_when_made() -> None:
    """resident_zeros: every page faulted in at once, so no request pays the first touch; numpy's own zeros
    of the same size are not resident (the check has teeth)."""
    import numpy as np

    before = _rss()
    lazy = np.zeros(SIZE // 4, dtype=np.float32)
    assert _rss() - before < 4 << 20 and lazy.nbytes == SIZE
    before = _rss()
    a = hugepages.resident_zeros((16, SIZE // 64), np.dtype(np.float32))  # (S, ...) 64 MiB
    assert _rss() - before >= SIZE - (1 << 20)
    assert a.shape == (16, SIZE // 64) and a.dtype == np.float32 and not a.any()


def test_a_cache_is_made_resident_only_within_half_the_available_memory(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from gptport.serve.startup import residency

    meminfo, cgroup = tmp_path / "meminfo", tmp_path / "cgroup"
    meminfo.write_text("MemTotal:  4000 kB\nMemAvailable:  1000 kB\n")
    cgroup.mkdir()
    absent = str(tmp_path / "absent")
    assert hugepages.fits(512_000, str(meminfo), absent) and not hugepages.fits(512_001, str(meminfo), absent)
    assert not hugepages.fits(1, absent, absent)  # nothing said: faulted in as rows fill
    (cgroup / "memory.max").write_text("max\n")  # a cgroup without a limit leaves MemAvailable's answer
    (cgroup / "memory.current").write_text("123\n")
    assert hugepages.fits(512_000, str(meminfo), str(cgroup))
    (cgroup / "memory.max").write_text("600000\n")  # a container's limit: 600,000 - 123 bytes of room
    assert hugepages.fits(299_938, str(meminfo), str(cgroup)) and not hugepages.fits(299_939, str(meminfo),
                                                                                      str(cgroup))
    assert residency(SimpleNamespace(resident=True)) == ", resident"
    assert "more than half the memory known to be available" in residency(SimpleNamespace(resident=False))
    assert residency(SimpleNamespace(resident=None)) == residency(object()) == ""
