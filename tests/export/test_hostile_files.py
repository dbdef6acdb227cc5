"""Model files from strangers: hostile GGUF files (counts, dimensions, offsets and lengths past the file, unaligned
or overlapping tensors, unknown value and tensor types, a tensor or key listed twice, arrays of arrays): each
refused in one line naming the file and what is wrong, in bounded memory, nothing written. Plus a seeded fuzz of
the GGUF reader (tests/support/gguf_fuzz.py; benchmarks.stress.fuzz_gguf runs 10,000 cases). Hostile safetensors
files: tests/base/test_safetensors_hostile.py; Hugging Face directories: tests/export/test_hf_hostile.py; ONNX
graphs whose external data leaves their directory: tests/runtime/test_onnx_external_hostile.py."""

from __future__ import annotations

import random
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np

from tests.support import gguf_fuzz
from tests.support.cli import assert_one_line_error, gptport

FUZZ_CASES = 300  # each reader, in CI (the benchmark runs 10,000)


def written(tmp_path: Path, data: bytes, name: str = "bad.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def seed_gguf(tmp_path: Path) -> bytes:
    """Two F32 tensors whose names have the same length (one can be renamed to the other) and two string keys."""
    path = tmp_path / "seed.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("general.name", "seed")
    w.add_string("general.nbme", "seed")
    w.add_array("tokenizer.ggml.tokens", ["a", "b"])
    w.add_tensor("aa.weight", np.ones((2, 8), np.float32))
    w.add_tensor("bb.weight", np.ones(8, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def tensor_info(data: bytes, name: bytes) -> int:
    """Where tensor `name`'s n_dims field starts in the header."""
    return data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)


def with_tensor(data: bytes, name: bytes, dims: list[int] | None = None, qtype: int | None = None,
                offset: int | None = None) -> bytes:
    """The file with tensor `name`'s dimensions, type or data offset rewritten (its dimension count kept)."""
    out = bytearray(data)
    at = tensor_info(data, name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    if dims is not None:
        assert len(dims) == n_dims
        struct.pack_into(f"<{n_dims}Q", out, at + 4, *dims)
    after = at + 4 + 8 * n_dims
    if qtype is not None:
        struct.pack_into("<I", out, after, qtype)
    if offset is not None:
        struct.pack_into("<Q", out, after + 4, offset)
    return bytes(out)


def gguf_cases(seed: bytes) -> dict[str, tuple[bytes, str]]:
    """Each hostile GGUF file and what its refusal says."""
    second = struct.unpack_from("<Q", seed, tensor_info(seed, b"bb.weight") + 4 + 8 + 4)[0]
    name_len = seed.index(b"general.name") - 8
    value_type = seed.index(b"general.name") + len(b"general.name")
    array = seed.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 4  # the array's item type
    dims_at = tensor_info(seed, b"aa.weight")
    many_dims = bytearray(seed)
    struct.pack_into("<I", many_dims, dims_at, 1000)
    return {
        "dimensions whose product wraps around": (with_tensor(seed, b"aa.weight", dims=[2**32, 2**32]), "truncated"),
        "a thousand dimensions": (bytes(many_dims), "has 1,000 dimensions (at most 4)"),
        "data past the end": (with_tensor(seed, b"bb.weight", offset=2**40), "truncated"),
        "an unaligned offset": (with_tensor(seed, b"bb.weight", offset=second + 4),
                                "not a multiple of the alignment 32"),
        "overlapping tensors": (with_tensor(seed, b"bb.weight", offset=0), "overlap"),
        "a tensor listed twice": (seed.replace(b"bb.weight", b"aa.weight"), "tensor aa.weight is listed twice"),
        "a key listed twice": (seed.replace(b"general.nbme", b"general.name"), "Duplicate general.name"),
        "a string of gigabytes": (seed[:name_len] + struct.pack("<Q", 2**33) + seed[name_len + 8:], "truncated"),
        "an unknown value type": (seed[:value_type] + struct.pack("<I", 99) + seed[value_type + 4:],
                                  "(99) is not a valid GGUFValueType"),
        "an array of arrays": (seed[:array] + struct.pack("<I", 9) + seed[array + 4:], "an array of arrays"),
        "an unknown tensor type": (with_tensor(seed, b"aa.weight", qtype=200), "has type 200, which is no GGML type"),
        "a tensor count of 2**40": (seed[:8] + struct.pack("<Q", 2**40) + seed[16:], "truncated"),
        "a key count of 2**63": (seed[:16] + struct.pack("<Q", 2**63) + seed[24:], "truncated"),
        "a bad magic": (b"GGUX" + seed[4:], "GGUF magic invalid"),
        "version 99": (seed[:4] + struct.pack("<I", 99) + seed[8:], "version 99"),
        "an empty file": (b"", "not a GGUF file gptport can read"),
    }


def test_every_hostile_gguf_is_refused_in_one_line_in_bounded_memory(tmp_path: Path) -> None:
    """Each case refused naming what is wrong; three of them in a fresh interpreter whose peak memory is measured."""
    seed = seed_gguf(tmp_path)
    assert gguf_fuzz.outcome(gguf_fuzz.read_gguf, written(tmp_path, seed, "seed.gguf")) == ("read", "")
    for case, (data, says) in gguf_cases(seed).items():
        path = written(tmp_path, data)
        status, message = gguf_fuzz.outcome(gguf_fuzz.read_gguf, path)
        assert status == "refused" and says in message, (case, status, message)
    # in a fresh interpreter, its peak RSS read from /proc (VmHWM: ru_maxrss would start from this process's own,
    # which the child inherits across fork); the interpreter with numpy, gguf and safetensors takes ~30 MiB of it
    script = ("import sys\nfrom pathlib import Path\nfrom tests.support.gguf_fuzz import outcome, read_gguf\n"
              "status = outcome(read_gguf, Path(sys.argv[1]))[0]\n"
              "print(status, next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')))")
    for case in ("dimensions whose product wraps around", "a string of gigabytes", "a tensor count of 2**40"):
        path = written(tmp_path, gguf_cases(seed)[case][0])
        run = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True)
        status, peak_kib = run.stdout.split()
        assert status == "refused" and int(peak_kib) < 200 * 2**10, (case, run.stdout)


def test_import_gguf_refuses_a_hostile_file_and_writes_nothing(tmp_path: Path) -> None:
    seed = seed_gguf(tmp_path)
    path = written(tmp_path, gguf_cases(seed)["overlapping tensors"][0])
    out = tmp_path / "out"
    assert_one_line_error(gptport("import-gguf", str(path), "--out", str(out)), 1, str(path), "overlap")
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_the_gguf_reader_fuzzed(tmp_path: Path) -> None:
    """Seeded mutations of a valid file: each is read or refused in one line naming the file, never anything else."""
    seed, path = gguf_fuzz.gguf_bytes(), tmp_path / "fuzzed.gguf"
    seen: dict[str, int] = {}
    for i in range(FUZZ_CASES):
        path.write_bytes(gguf_fuzz.mutate_gguf(seed, random.Random(i)))
        status, message = gguf_fuzz.outcome(gguf_fuzz.read_gguf, path)
        assert status != "crashed", (i, message)
        seen[status] = seen.get(status, 0) + 1
    assert seen.get("refused", 0) > FUZZ_CASES // 2, seen  # the mutations do reach the checks
