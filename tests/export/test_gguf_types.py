"""Every tensor type import-gguf takes (gguf_file.TYPES) is read as the `gguf` package dequantizes it, whole and a
few rows at a time: blocks of random bytes with sane float16 scales, one tensor per type in one file. The real
files of these types (llama-quantize's SmolLM2) are checked against transformers by benchmarks.export.gguf_types.
No torch."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from gptport.errors import InputError
from gptport.export.gguf_file import TYPES, GGUFFile
from tests.support import gguf_files as gf

Q = gguf.GGMLQuantizationType
ROWS, COLS = 5, 512  # two blocks of 256 values a row (the k-quants' and i-quants' block)
# where each block type keeps its float16 fields (scales, minimums), in bytes from the block's start
FP16_AT = {Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q2_K: (80, 82),
           Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.IQ4_NL: (0,), Q.IQ4_XS: (0,),
           Q.IQ3_S: (0,)}
BLOCKS = [q for q in TYPES if q not in (Q.F32, Q.F16, Q.BF16)]


def random_blocks(qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """(ROWS, bytes a row) uint8 of `qtype`: random codes, float16 fields between 0.01 and 0.1 in magnitude."""
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (ROWS * COLS // values, size), dtype=np.uint8)
    for at in FP16_AT[qtype]:
        scale = (rng.uniform(0.01, 0.1, len(blocks)) * rng.choice([-1, 1], len(blocks))).astype(np.float16)
        blocks[:, at:at + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(ROWS, -1)


def test_every_block_type_has_its_float16_fields_listed() -> None:
    assert set(BLOCKS) == set(FP16_AT)


def test_every_type_taken_reads_as_the_gguf_package_dequantizes_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    tensors = [(f"t.{q.name}", random_blocks(q, rng), q) for q in BLOCKS]
    floats = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    tensors += [("t.F16", floats.astype(np.float16).view(np.uint8), Q.F16), ("t.F32", floats, Q.F32)]
    path = gf.write(tmp_path / "types.gguf", "llama", lambda w: None, tensors)
    f = GGUFFile(path)
    f.check_types()  # takes every one
    for name, raw, qtype in tensors:
        want = gguf.quants.dequantize(raw, qtype).reshape(ROWS, COLS)
        assert f.type_name(name) == qtype.name and f.shape(name) == (ROWS, COLS)
        got = f.dequantize(name)
        assert got.dtype == np.float32 and np.isfinite(got).all() and np.abs(got).max() > 0, name
        np.testing.assert_array_equal(got, want, err_msg=name)
        np.testing.assert_array_equal(f.dequantize(name, 1, 4), want[1:4], err_msg=name)  # rows in pieces


@pytest.mark.parametrize("qtype", [Q.TQ2_0, Q.IQ2_XXS], ids=lambda q: q.name)
def test_a_type_not_taken_is_refused_naming_it(qtype: Q, tmp_path: Path) -> None:
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.zeros((ROWS, COLS // values * size), np.uint8)
    path = gf.write(tmp_path / "t.gguf", "llama", lambda w: None, [("blk.0.attn_q.weight", raw, qtype)])
    with pytest.raises(InputError, match=f"tensor blk.0.attn_q.weight is {qtype.name}, a type gptport does not import"):
        GGUFFile(path).check_types()
