"""Hostile safetensors files (gptport/safetensors_file.py): each refused in one line naming the file and what is
wrong, before the safetensors library maps it, in memory bounded by the file; the same refusal from every reader
of a model directory's weights (the torch checkpoint, export-hf's numpy read, through the CLI); a seeded
hypothesis fuzz of the reader (tests/support/safetensors_fuzz.py; benchmarks.stress.fuzz_safetensors runs 10,000
cases). import-hf's shards: tests/export/test_hf_hostile.py."""

from __future__ import annotations

import json
import re
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from gptport import safetensors_file
from gptport.errors import ArtifactError
from tests.support import safetensors_fuzz
from tests.support.cli import assert_one_line_error, gptport

SEED = safetensors_fuzz.seed_bytes()  # a (4, 4) F32 [0, 64], b (6,) F32 [64, 88], c (2, 3) F16 [88, 100]
HEADER, BODY = safetensors_fuzz.split(SEED)
FUZZ_EXAMPLES = 200  # in CI; the benchmark runs 10,000


def changed(edit: Callable[[dict[str, Any]], None], body: bytes = BODY) -> bytes:
    header = json.loads(json.dumps(HEADER))
    edit(header)
    return safetensors_fuzz.joined(json.dumps(header).encode(), body)


def text(header_text: bytes) -> bytes:
    return safetensors_fuzz.joined(header_text, BODY)


def _set(name: str, **fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda h: h[name].update(fields)


def _rename(old: str, new: str, **fields: Any) -> Callable[[dict[str, Any]], None]:
    def edit(h: dict[str, Any]) -> None:
        h[new] = {**h.pop(old), **fields}
    return edit


N = len(SEED)
CASES: dict[str, tuple[bytes, str]] = {  # each hostile file and what its refusal says after "PATH: "
    "an empty file": (b"", "not a safetensors file (0 bytes, fewer than the 8 of its header length)"),
    "a header length past the file": (struct.pack("<Q", N) + SEED[8:],
                                       f"its header length {N:,} runs past the end of the file ({N:,} bytes)"),
    "a header length of 2**62": (struct.pack("<Q", 2**62) + SEED[8:],
                                 f"its header length {2**62:,} runs past the end of the file"),
    "a header that is not JSON": (text(b"x" * 40), "its header is not valid JSON (Expecting value: line 1 column 1"),
    "a header that is an array": (text(b"[]"), "its header is not a JSON object"),
    "a header that is no UTF-8": (text(b'{"\xff": 1}'), "its header is not UTF-8"),
    "a header nested 5,000 deep": (text(b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
                                   "its header's JSON is nested too deep"),
    "a tensor listed twice": (text(json.dumps(HEADER).encode()[:-1] + b', "a": {}}'), "its header lists a twice"),
    "metadata that is no string": (changed(lambda h: h.update({"__metadata__": {"k": 1}})),
                                   "its __metadata__ must map strings to strings"),
    "overlapping offsets": (changed(_set("b", data_offsets=[0, 24])), "tensors b and a overlap"),
    "offsets swapped": (changed(lambda h: h["a"].update(data_offsets=h["b"]["data_offsets"])),
                        "tensor a is F32 of shape [4, 4] (64 bytes), but its data_offsets [64, 88] hold 24"),
    "offsets past the end": (changed(_set("c", data_offsets=[88, 2**40])),
                             "tensor c is F16 of shape [2, 3] (12 bytes), but its data_offsets [88, 1099511627776] "
                             "hold 1,099,511,627,688"),
    "offsets reversed": (changed(_set("a", data_offsets=[64, 0])),
                         "tensor a has data_offsets [64, 0]; expected [begin, end] with 0 <= begin <= end"),
    "a gap between tensors": (changed(_set("b", shape=[4], data_offsets=[64, 80])),
                              "bytes 80..88 of the data belong to no tensor (before c)"),
    "a dtype the shape contradicts": (changed(_set("a", dtype="F64")),
                                      "tensor a is F64 of shape [4, 4] (128 bytes), but its data_offsets [0, 64] "
                                      "hold 64"),
    "a shape whose size wraps around": (changed(_set("a", shape=[2**32, 2**32], data_offsets=[0, 0])),
                                        "tensor a is F32 of shape [4294967296, 4294967296] "
                                        "(73,786,976,294,838,206,464 bytes)"),
    "an unknown dtype": (changed(_set("a", dtype="Q9")), "tensor a has dtype 'Q9', which is no safetensors type"),
    "a negative dimension": (changed(_set("a", shape=[-1, 16])),
                             "tensor a has shape [-1, 16]; expected a list of integers >= 0"),
    "a float dimension": (changed(_set("a", shape=[4.0, 4])),
                          "tensor a has shape [4.0, 4]; expected a list of integers >= 0"),
    "70 dimensions": (changed(_set("a", shape=[1] * 69 + [16])), "tensor a has 70 dimensions (at most 8)"),
    "a field missing": (changed(lambda h: h["a"].pop("shape")),
                        "tensor a is not an object with dtype, shape and data_offsets"),
    "a name with a newline": (changed(_rename("a", "x\ny", dtype="Q9")), "tensor x\\ny has dtype 'Q9'"),
    "a type numpy cannot hold": (changed(_set("b", dtype="F4", shape=[48])),
                                 "tensor b is F4, which this reader does not take (BF16, BOOL, C64, F16, F32, F64"),
    "truncated": (SEED[:-3], "tensor c ends at byte 100 of the data, which holds 97 (truncated?)"),
    "bytes after the last tensor": (SEED + b"\0" * 4, "the tensors end at byte 100 of the data, which holds 104"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_file_is_refused_in_one_line(case: str, tmp_path: Path) -> None:
    data, says = CASES[case]
    path = tmp_path / "model.safetensors"
    path.write_bytes(data)
    with pytest.raises(ArtifactError) as e:
        safetensors_file.read_numpy(path)
    assert str(e.value).startswith(f"{path}: ") and says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_valid_file_reads_and_offsets_out_of_order_are_no_fault(tmp_path: Path) -> None:
    """The tensors may lie in any order in the data section as long as they tile it (the library reads them too)."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(SEED)
    assert safetensors_file.read_numpy(path)["a"][3, 3] == 15
    reordered = changed(lambda h: (h["a"].update(data_offsets=[24, 88]), h["b"].update(data_offsets=[0, 24])),
                        BODY[64:88] + BODY[:64] + BODY[88:])
    path.write_bytes(reordered)
    tensors = safetensors_file.read_numpy(path)
    assert tensors["a"][3, 3] == 15 and list(tensors["b"]) == list(range(6))
    assert set(safetensors_file.read_header(path)) == {"a", "b", "c"}


def test_a_header_length_of_gigabytes_allocates_nothing(tmp_path: Path) -> None:
    """A length past the file, or past MAX_HEADER in a (sparse) file that long, is refused before its bytes are read."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 2**62) + SEED[8:])
    big = tmp_path / "big.safetensors"
    with open(big, "wb") as f:
        f.write(struct.pack("<Q", 2 * safetensors_file.MAX_HEADER))
        f.truncate(2 * safetensors_file.MAX_HEADER + 8)  # sparse: no disk used
    tracemalloc.start()
    for p, says in ((path, "runs past the end"), (big, "is over 100,000,000 bytes, the most gptport reads")):
        with pytest.raises(ArtifactError, match=says):
            safetensors_file.read_header(p)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, peak


def test_every_reader_of_a_model_directory_refuses_it(tmp_path: Path, tokenizer_dir: Path, corpus_file: Path) -> None:
    """The torch checkpoint's reader, export-hf's and export-gguf's numpy read (model_read), and the CLI through
    export-hf: one line naming model.safetensors, nothing written. config.json is made to accept the hostile
    file's sha256 (as a stranger would write it), so that it is the file's bytes that are refused."""
    from gptport import provenance
    from gptport.export import model_read
    from gptport.model_card import mark_pending, read_card
    from gptport.training import checkpoint
    from tests.conftest import build_model_dir

    model_dir = build_model_dir(tmp_path / "m", tokenizer_dir, corpus_file, steps=0)
    weights = model_dir / "model.safetensors"
    weights.write_bytes(CASES["overlapping offsets"][0])
    mark_pending(model_dir, provenance.file_digest(weights))
    cfg = read_card(model_dir).model
    for read in (lambda: checkpoint.load_weights(model_dir, cfg), lambda: model_read.read_weights(model_dir, cfg)):
        with pytest.raises(ArtifactError, match=f"^{re.escape(str(weights))}: tensors b and a overlap$"):
            read()
    out = tmp_path / "hf-out"
    assert_one_line_error(gptport("export-hf", str(model_dir), "--out", str(out)), 1, str(weights),
                          "tensors b and a overlap")
    assert not out.exists()


@settings(max_examples=FUZZ_EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=safetensors_fuzz.files(SEED))
def test_the_reader_fuzzed(data: bytes, tmp_path: Path) -> None:
    """Seeded mutations of a valid file: each is read or refused in one line naming the file, never anything else;
    what the header check accepts, the library reads (the check is no looser than the library)."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(data)
    status, message = safetensors_fuzz.classify(safetensors_file.read_numpy, path)
    assert status != "crashed", message
    if status == "read":
        assert all(isinstance(t, np.ndarray) for t in safetensors_file.read_numpy(path).values())
