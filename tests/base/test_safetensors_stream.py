"""safetensors_stream.py: a file written tensor by tensor reads back (safetensors' own reader and gptport's header
check) with every tensor's bytes, its sha256 is the file's, wider types come first; a disk without room is refused
before anything is written, in one line with both numbers; a full disk mid-write and a tensor whose chunks come
short are ArtifactErrors naming the file."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest

from gptport import provenance, safetensors_file
from gptport import safetensors_stream as ss
from gptport.errors import ArtifactError, InputError


def _outs(rng: np.random.Generator) -> list[ss.Out]:
    a = rng.standard_normal((5, 3)).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float16)
    c = (rng.standard_normal((4, 2)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # bf16 bits
    return [ss.Out("half", "F16", (7,), lambda: [b[:3], b[3:]]), ss.Out("bf", "BF16", (4, 2), lambda: [c]),
            ss.Out("full", "F32", (5, 3), lambda: [a[:2], a[2:].tobytes()])]


def test_written_tensor_by_tensor_it_reads_back(tmp_path: Path) -> None:
    from safetensors import safe_open

    outs = ss.ordered(_outs(np.random.default_rng(0)))
    assert [o.dtype for o in outs] == ["F32", "F16", "BF16"]  # each starts at a multiple of its width
    seen: list[ss.Written] = []
    path = tmp_path / "w.safetensors"
    sha = ss.write(path, outs, {"format": "pt"}, seen.append)
    assert sha == provenance.file_digest(path) and path.stat().st_size == ss.file_size(outs, {"format": "pt"})
    assert [(w.done, w.total) for w in seen] == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert seen[-1].bytes_done == seen[-1].bytes_total == path.stat().st_size
    entries = safetensors_file.read_header(path)
    assert {n: (e.dtype, e.shape) for n, e in entries.items()} == {"full": ("F32", (5, 3)), "half": ("F16", (7,)),
                                                                  "bf": ("BF16", (4, 2))}
    assert safetensors_file.data_start(path) % 8 == 0
    with safe_open(str(path), framework="np") as f:
        want = {o.name: np.concatenate([np.frombuffer(bytes(c), np.uint8) for c in o.chunks()]) for o in outs}
        for name in ("full", "half"):
            assert f.get_tensor(name).tobytes() == want[name].tobytes()
    widened = safetensors_file.read_numpy(path)["bf"]  # numpy has no bf16: widened, exactly
    assert widened.dtype == np.float32 and widened.view(np.uint32).tolist() == (
        want["bf"].view(np.uint16).astype(np.uint32) << 16).reshape(4, 2).tolist()


def test_a_disk_without_room_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))  # type: ignore[attr-defined]
    with pytest.raises(InputError) as e:
        ss.check_disk(tmp_path / "not" / "yet", 5 * 2**30, "importing into x")
    assert str(e.value) == (f"{tmp_path / 'not' / 'yet'}: importing into x needs 5.00 GiB (5,368,709,120 bytes) but "
                            "its disk has 0.00 GiB (1,000 bytes) free")
    ss.check_disk(tmp_path, 999, "x")


def test_a_short_tensor_and_a_full_disk_are_named(tmp_path: Path) -> None:
    short = [ss.Out("a", "F32", (4,), lambda: [np.zeros(3, np.float32)])]
    with pytest.raises(ArtifactError, match="tensor a came to 12 bytes, not the 16 of F32 \\[4\\]"):
        ss.write(tmp_path / "s.safetensors", short, {})
    full = Path("/dev/full")
    if not full.exists():
        pytest.skip("no /dev/full here")
    big = [ss.Out("a", "F32", (2**20,), lambda: [np.zeros(2**20, np.float32)])]
    with pytest.raises(ArtifactError, match="/dev/full: the disk filled while writing it") as e:
        ss.write(full, big, {})
    assert e.value.__cause__ is None or e.value.__cause__.errno == errno.ENOSPC  # type: ignore[attr-defined]
