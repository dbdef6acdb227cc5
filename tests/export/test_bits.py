"""benchmarks.harness.bits: bits per weight by role of a quantized graph (MatMulNBits' codes and float32 scales:
4 + 32/32 bits at block 32, 8 + 32/32 for the head) and of a GGUF (its types' stored bytes)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import onnx
import pytest

from benchmarks.harness import bits
from gptport.export import variants
from tests.support import gguf_files as gf

torch = pytest.importorskip("torch")
Q = gguf.GGMLQuantizationType


def test_a_graphs_roles_in_bits_per_weight(tmp_path: Path) -> None:
    from tests.export.test_smooth import LLAMA, wide_model
    from tests.export.test_smooth import _graph as build

    model = wide_model(LLAMA)
    fp32 = tmp_path / "fp32.onnx"
    onnx.save_model(build(model), str(fp32))
    assert bits.onnx_sizes(fp32)["blocks"][0] * 8 == 32 * bits.onnx_sizes(fp32)["blocks"][1]
    got = {}
    for name in ("nbits4-b32-acc4-head8", "nbits4-b32-acc4-head8-down8"):
        out = tmp_path / f"{name}.onnx"
        variants.quantize(fp32, out, variants.SCHEMES[name])
        got[name] = bits.summary(bits.onnx_sizes(out), out.stat().st_size, 10**6)
    plain, down8 = got["nbits4-b32-acc4-head8"], got["nbits4-b32-acc4-head8-down8"]
    assert plain["bpw_blocks"] == 5.0 and plain["bpw_head"] == 9.0, plain
    assert 5.0 < down8["bpw_blocks"] < 9.0 and down8["bpw_head"] == 9.0, down8
    assert plain["bpw_file"] == 8 * (tmp_path / "nbits4-b32-acc4-head8.onnx").stat().st_size / 10**6


def test_a_ggufs_roles_in_bits_per_weight(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 256)).astype(np.float32)  # (rows, cols): one k-quant block a row
    q6k = rng.integers(0, 256, (8, gguf.GGML_QUANT_SIZES[Q.Q6_K][1]), dtype=np.uint8)  # its bytes, as stored
    path = gf.write(tmp_path / "m.gguf", "llama", lambda _: None, [
        ("blk.0.attn_q.weight", w, Q.Q4_0), ("blk.0.ffn_down.weight", w, Q.Q8_0),
        ("blk.0.attn_norm.weight", w[0], Q.F32), ("output.weight", q6k, Q.Q6_K), ("token_embd.weight", w, Q.F16)])
    s = bits.summary(bits.gguf_sizes(path), 1000, 1000)
    assert s == {"bpw_blocks": (4.5 + 8.5) / 2, "bpw_embedding": 16.0, "bpw_head": 6.5625, "bpw_file": 8.0}
