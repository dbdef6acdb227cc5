"""kquant.py: float weights rounded onto 4-bit grids with float minima, searched as llama.cpp's k-quants, and the
kq schemes that encode them exactly (grid.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx

from gptport.export import awq, grid, kquant, variants
from tests.export.test_grid import K, N, matmuls, run


def trained(seed: int = 0) -> np.ndarray:
    """(K, N) weights like a trained matrix's: heavy-tailed, with a few large columns' worth of outliers."""
    rng = np.random.default_rng(seed)
    w = rng.standard_t(5, (K, N)).astype(np.float32) * 0.02
    w[rng.integers(0, K, 20), rng.integers(0, N, 20)] *= 12
    return w


def test_each_block_lands_on_a_grid_the_encoder_finds_exactly() -> None:
    w = trained()
    q = kquant.rounded(w)
    found = grid.find(q)
    assert found is not None and found.q.max() <= 15
    assert np.allclose(found.scale[:, None, :] * found.q + found.offset[:, None, :], q.reshape(-1, 32, N),
                       rtol=0, atol=64 * np.finfo(np.float32).eps * np.abs(q).max())
    for b in range(0, K, 32):  # at most 16 values a block and column
        assert max(len(np.unique(q[b:b + 32, c])) for c in range(N)) <= 16


def test_the_search_errs_less_than_plain_rounding() -> None:
    """Against the block's min..max over 15 steps (the search's first candidate) and MatMulNBits' own symmetric
    and zero-point rounding, on the weighted error it minimizes and on the plain squared error."""
    w = trained(1)
    blocks = w.reshape(K // 32, 32, N).transpose(0, 2, 1).reshape(-1, 32)
    weight = np.sqrt((blocks ** 2).mean(1, keepdims=True)) + np.abs(blocks)

    def weighted(values: np.ndarray) -> float:
        v = values.reshape(K // 32, 32, N).transpose(0, 2, 1).reshape(-1, 32)
        return float((weight * (v - blocks) ** 2).sum())

    lo, hi = np.minimum(w.reshape(-1, 32, N).min(1, keepdims=True), 0), w.reshape(-1, 32, N).max(1, keepdims=True)
    minmax = (np.rint((w.reshape(-1, 32, N) - lo) / ((hi - lo) / 15)) * ((hi - lo) / 15) + lo).reshape(K, N)
    searched = kquant.rounded(w)
    assert weighted(searched) < 0.9 * weighted(minmax)
    for plain in (awq.rtn(w, 32, True), awq.rtn(w, 32, False)):
        assert ((searched - w) ** 2).sum() < 0.8 * ((plain - w) ** 2).sum()


def test_constant_blocks_and_a_zero_matrix_stay_as_they_are() -> None:
    w = trained(2)
    w[:32, 3] = 0.5
    w[32:64, 4] = -0.25
    q = kquant.rounded(w)
    assert (q[:32, 3] == 0.5).all() and (q[32:64, 4] == -0.25).all()
    assert not kquant.rounded(np.zeros((K, N), np.float32)).any()


def test_a_kq_scheme_writes_the_rounded_weights_exactly(tmp_path: Path) -> None:
    """A kq scheme on a graph of float matrices: each encoded exactly from its rounded values (with float compute,
    the product within float rounding of x @ rounded(W)); nbits4-kq-acc4-head8's product (int8 activations) nearer
    the float one than symmetric rounding's."""
    src = tmp_path / "f.onnx"
    weights = {"a": trained(3), "b": trained(4)}
    onnx.save_model(matmuls(weights), str(src))
    x = np.random.default_rng(9).standard_normal((2, 5, K)).astype(np.float32)
    got = {}
    for name, scheme in (("acc0", replace(variants.SCHEMES["nbits4-kq-acc4-head8"], accuracy_level=0)),
                         ("kq", variants.SCHEMES["nbits4-kq-acc4-head8"]),
                         ("sym", variants.SCHEMES["nbits4-b32-acc4-head8"])):
        variants.quantize(src, tmp_path / f"{name}.onnx", scheme)
        proto = onnx.load(str(tmp_path / f"{name}.onnx"))
        if name != "sym":
            ops = [n.op_type for n in proto.graph.node]
            assert ops.count("MatMulNBits") == 2 and "MatMul" in ops  # the block sums' float MatMuls beside them
        got[name] = run(proto, x)
    for i, w in enumerate(weights.values()):
        exact = x.astype(np.float64) @ w.astype(np.float64)
        rounded = x.astype(np.float64) @ kquant.rounded(w).astype(np.float64)
        assert np.abs(got["acc0"][i] - rounded).max() <= 1e-5 * np.abs(rounded).max()
        assert np.abs(got["kq"][i] - exact).mean() < 0.8 * np.abs(got["sym"][i] - exact).mean()
