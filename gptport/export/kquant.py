"""4-bit weights with a float minimum of their own per block, searched as llama.cpp's k-quants search theirs.

Each block of 32 input rows of each output column becomes `scale * q + minimum`, q in 0..15, where (scale,
minimum) is llama.cpp's make_qkx2_quants' choice (the search its Q4_K and Q5_K use): codes rounded from the
block's range stretched over 15 + (-1 .. 1 in steps of 0.1) steps, each candidate's scale and minimum then solved
by weighted least squares (weights |x| + the block's root mean square: large values count more), the minimum
never above 0, and the least weighted error kept. Where llama.cpp stores both as 6-bit integers of a superblock's
float16 pair, these stay float32. The values are written back into the float weights, on a 4-bit grid: grid.py
then encodes them exactly (MatMulNBits' codes and steps, and a float MatMul of the blocks' sums for the minima),
so a float checkpoint's int4 gets the asymmetric rounding a GGUF import already had. Design record 0051. No torch
here."""

from __future__ import annotations

import numpy as np

BLOCK = 32  # input rows a scale and minimum cover (grid.BLOCK)
LEVELS = 15  # codes 0..15
STEPS = np.arange(-1.0, 1.0 + 1e-9, 0.1)  # make_qkx2_quants' rmin -1, rdelta 0.1, nstep 20: the range over 15 + r
SLAB = 1 << 20  # blocks searched at a time (128 MiB of float32 at 32 values a block)


def rounded(w: np.ndarray) -> np.ndarray:
    """`w` (K, N) (a MatMul's weight, input rows; K a multiple of BLOCK) as its 4-bit codes give it back: each
    block of BLOCK rows of each column `scale * q + minimum` (search()), float32."""
    k, n = w.shape
    if k % BLOCK:
        raise ValueError(f"{k} input rows are not blocks of {BLOCK}")
    out = np.empty((k, n), np.float32)
    cols = max(1, SLAB // (k // BLOCK))
    for c in range(0, n, cols):
        part = np.asarray(w[:, c:c + cols], np.float32)  # (K, n)
        m = part.shape[1]
        blocks = part.reshape(k // BLOCK, BLOCK, m).transpose(0, 2, 1).reshape(-1, BLOCK)  # (K/32 * n, 32)
        out[:, c:c + m] = search(blocks).reshape(k // BLOCK, m, BLOCK).transpose(0, 2, 1).reshape(k, m)
    return out


def search(x: np.ndarray) -> np.ndarray:
    """Blocks `x` (m, BLOCK) float32 -> their values on each one's best 4-bit grid (m, BLOCK)."""
    weight = np.sqrt((x * x).mean(1, keepdims=True)) + np.abs(x)  # (m, 32): make_qkx2_quants' av_x + |x|
    lo = np.minimum(x.min(1, keepdims=True), 0.0)  # (m, 1)
    span = x.max(1, keepdims=True) - lo  # (m, 1)
    flat = span[:, 0] <= 0  # every value equal (and >= 0 or all zero): kept as they are
    span = np.where(flat[:, None], 1.0, span)
    scale, low = span / LEVELS, lo  # the plain min..max grid, the first candidate
    codes = np.clip(np.rint((x - lo) / scale), 0, LEVELS)
    best = _error(x, weight, scale, low, codes)
    sum_w, sum_x = weight.sum(1, keepdims=True), (weight * x).sum(1, keepdims=True)
    for r in STEPS:
        q = np.clip(np.rint((x - lo) * ((LEVELS + r) / span)), 0, LEVELS)  # (m, 32)
        sum_l, sum_l2, sum_xl = (weight * q).sum(1, keepdims=True), (weight * q * q).sum(1, keepdims=True), \
            (weight * q * x).sum(1, keepdims=True)
        det = sum_w * sum_l2 - sum_l * sum_l
        ok = det > 0
        safe = np.where(ok, det, 1.0)
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / safe
        this_low = (sum_l2 * sum_x - sum_l * sum_xl) / safe
        above = this_low > 0  # the minimum held at 0: the scale alone fitted
        this_scale = np.where(above, sum_xl / np.where(sum_l2 > 0, sum_l2, 1.0), this_scale)
        this_low = np.where(above, 0.0, this_low)
        err = _error(x, weight, this_scale, this_low, q)
        better = ok & (err < best)
        best = np.where(better, err, best)
        scale, low = np.where(better, this_scale, scale), np.where(better, this_low, low)
        codes = np.where(better, q, codes)
    out = (scale * codes + low).astype(np.float32)
    out[flat] = x[flat]
    return out


def _error(x: np.ndarray, weight: np.ndarray, scale: np.ndarray, low: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """The weighted squared error of each block's grid values (m, 1)."""
    d = scale * codes + low - x
    return (weight * d * d).sum(1, keepdims=True)
