"""Activation-aware int4 weights (AWQ, Lin et al. 2024): before MatMulNBits' round-to-nearest, each group of
matrices that reads one activation (q|k|v after ln_1, gate|up after ln_2, down after SwiGLU's product) gets its
input channels rescaled by s = mean|x|^alpha, alpha searched per group on a grid for the least error of the
quantized output on calibration rows (calibration.activation_samples); s is folded into what made the input
(smooth.fold: the norm's weight, up's columns), so the float graph computes the same function. Then each block
of each output column is clipped to the fraction of its largest magnitude that quantizes with the least
output error (AWQ's clipping search): that changes the float weights, which only the quantizer reads.

The error is measured on the quantizer's own arithmetic: rtn() is MatMulNBits' 4-bit quantization
(onnxruntime's quantize_matmul_4bits, symmetric and with zero points) reproduced in numpy; a test holds the two
equal. Why AWQ and not GPTQ: design record 0051. No torch here."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from gptport.export import smooth

ALPHAS = np.linspace(0.0, 1.0, 11)  # the grid of exponents (AWQ's has 20; alpha 0: no scaling, always a candidate)
CLIP_RATIOS = np.linspace(1.0, 0.55, 10)  # of a block's largest magnitude (AWQ: down to half, in 20 steps)
SEARCH_ROWS = 256  # calibration rows the scale search measures on (its cost: rows x K x N per alpha)
FLOOR = 1e-6  # no channel's mean |x| below this: a dead channel is not scaled to zero


def rtn(w: np.ndarray, block: int, symmetric: bool) -> np.ndarray:
    """`w` (K, N) (a MatMul's weight, input rows) as MatMulNBits' 4-bit round-to-nearest gives it back, in blocks
    of `block` rows: symmetric, the block's signed largest magnitude at code -8; else min..max (0 included) over
    15 steps with an integer zero point."""
    k, n = w.shape
    pad = -k % block
    b = np.concatenate([w, np.zeros((pad, n), w.dtype)]).reshape(-1, block, n) if pad else w.reshape(-1, block, n)
    if symmetric:  # (nb, block, n)
        vmax = np.take_along_axis(b, np.abs(b).argmax(1)[:, None], 1)  # (nb, 1, n)
        scale = vmax / -8.0
        inv = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale != 0)
        q = np.clip(np.rint(b * inv) + 8.0, 0.0, 15.0)
        out = (q - 8.0) * scale
    else:
        lo, hi = np.minimum(b.min(1, keepdims=True), 0.0), np.maximum(b.max(1, keepdims=True), 0.0)
        scale = (hi - lo) / 15.0
        inv = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale != 0)
        zero = np.clip(np.rint(-lo * inv), 0.0, 15.0)
        out = (np.clip(np.rint(b * inv) + zero, 0.0, 15.0) - zero) * scale
    return out.reshape(-1, n)[:k].astype(w.dtype)


def int8_rows(x: np.ndarray, block: int) -> np.ndarray:
    """`x` (n, K) as MatMulNBits' int8 compute (accuracy level 4) sees it: each block of `block` channels of each
    row rounded to 255 levels of its largest magnitude."""
    n, k = x.shape
    if k % block:
        return x
    b = x.reshape(n, k // block, block)
    scale = np.abs(b).max(-1, keepdims=True) / 127.0  # (n, nb, 1)
    inv = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale != 0)
    return (np.clip(np.rint(b * inv), -127, 127) * scale).reshape(n, k).astype(x.dtype)


def search_scale(x: np.ndarray, weights: list[np.ndarray], block: int, symmetric: bool,
                 int8: bool = False) -> np.ndarray:
    """s (K,) for the matrices `weights` (each (K, N_i)) that read the activation rows `x` (n, K): mean|x|^alpha
    (normalized to a geometric mean of 1 between its extremes), alpha on ALPHAS, the one whose quantized outputs
    (x / s) @ rtn(W * s) are nearest x @ W in squared error; with `int8` the rows x / s rounded as int8 compute
    rounds them (int8_rows)."""
    mean = np.maximum(np.abs(x).mean(0), FLOOR).astype(np.float64)  # (K,): from every row
    x = x[:SEARCH_ROWS]
    refs = [x @ w for w in weights]  # (n, N_i)
    best, chosen = np.inf, np.ones_like(mean, dtype=np.float32)
    for alpha in ALPHAS:
        s = mean ** alpha
        s = (s / np.sqrt(s.max() * s.min())).astype(np.float32)
        xs = int8_rows(x / s, block) if int8 else x / s  # (n, K)
        err = sum(float(np.square(xs @ rtn(w * s[:, None], block, symmetric) - r).sum())
                  for w, r in zip(weights, refs, strict=True))
        if err < best:
            best, chosen = err, s
    return chosen


def clip(x: np.ndarray, w: np.ndarray, block: int, symmetric: bool, int8: bool = False) -> np.ndarray:
    """`w` (K, N) read by rows `x` (n, K), each block of `block` rows of each column clamped to the ratio of its
    extremes on CLIP_RATIOS whose quantization errs least on x's part: ||x_b @ w_b - x'_b @ q||^2 for q =
    rtn(clamp(w_b)) (x' = x, or with `int8` x as int8 compute rounds it), computed from the blocks' Gram
    matrices as q.G.q - 2 q.C.w_b + const (G = x'_b^T x'_b, C = x'_b^T x_b: block x block, whatever the rows).
    K not a multiple of `block`: `w` unchanged."""
    k, n = w.shape
    if k % block:
        return w
    nb = k // block
    xb = x.reshape(-1, nb, block).transpose(1, 0, 2).astype(np.float64)  # (nb, rows, block)
    xq = (int8_rows(x, block) if int8 else x).reshape(-1, nb, block).transpose(1, 0, 2).astype(np.float64)
    gram, cross = xq.transpose(0, 2, 1) @ xq, xq.transpose(0, 2, 1) @ xb  # (nb, block, block)
    wb = w.reshape(nb, block, n)  # (nb, block, n)
    lo, hi = wb.min(1, keepdims=True), wb.max(1, keepdims=True)  # (nb, 1, n)
    best_err = np.full((nb, n), np.inf)
    best = wb.copy()
    cw = cross @ wb  # (nb, block, n)
    for r in CLIP_RATIOS:
        c = np.clip(wb, r * lo, r * hi) if not symmetric else np.clip(wb, -r * np.maximum(-lo, hi),
                                                                      r * np.maximum(-lo, hi))
        q = rtn(c.reshape(k, n), block, symmetric).reshape(nb, block, n)
        err = (q * (gram @ q - 2.0 * cw)).sum(1)  # (nb, n): the error less its constant ||x_b w_b||^2
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best = np.where(better[:, None, :], c, best)
    return best.reshape(k, n)


def apply(proto: onnx.ModelProto, samples: Mapping[str, np.ndarray], block: int, symmetric: bool,
          skip: Collection[str] = (), clipping: bool = True, int8: bool = False) -> list[str]:
    """Rescale (and with `clipping`, clip) `proto`'s 4-bit matrices in place for the activation rows `samples`
    (calibration.activation_samples), leaving the modules of `skip` (kept at 8 bits) alone, the error measured
    with int8 activations where `int8` (accuracy level 4); -> the modules rescaled. The attention's output
    projection (its input comes from no norm) is clipped only."""
    modules = [m for m in samples if m not in skip]

    def choose(module: str, weights: list[np.ndarray]) -> np.ndarray:
        return search_scale(samples[module], weights, block, symmetric, int8)

    done = smooth.fold(proto, modules, choose)
    if clipping:
        inits = {i.name: i for i in proto.graph.initializer}
        readers: dict[str, int] = {}
        for node in proto.graph.node:
            for name in node.input:
                readers[name] = readers.get(name, 0) + 1
        todo = {m: (s, names) for m, (s, names) in done.items()}
        for m in modules:  # not rescaled (the output projection's input): clipped against x itself
            w = f"{m}.weight_t"  # the builder's name for a Linear's (in, out) weight
            if m not in todo and w in inits and readers.get(w) == 1:
                todo[m] = (np.ones(samples[m].shape[1], np.float32), [w])
        for m, (s, names) in todo.items():
            x = samples[m] / s  # (n, K): what the rescaled weights read
            for name in names:
                w = clip(x, numpy_helper.to_array(inits[name]), block, symmetric, int8)
                inits[name].CopyFrom(numpy_helper.from_array(w.astype(np.float32), name))
    return list(done)
