"""Block-wise int4/int8 weights for onnxruntime's MatMulNBits, made one matrix at a time (and a large matrix a
slab of its output rows at a time) by onnxruntime's own kernels, the ones its MatMulNBitsQuantizer calls: the
builder writes a quantized graph straight from the weights, never a float graph first. No torch here."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

SLAB_BYTES = 128 * 2**20  # float32 bytes of a matrix quantized at once: the head of a 128k vocabulary in slabs


@dataclass(frozen=True)
class NBits:
    """How the MatMul weights of a graph are quantized (variants.Scheme's nbits kinds without smoothing or a grid):
    `bits` in blocks of `block` along the input, `accuracy_level` (4: int8 compute, 0: float), symmetric or
    with zero points; the head with `head_bits` / `head_level` / `head_block` where they are set, and the MLP's
    down projections with `down_block` where set."""

    bits: int
    block: int
    accuracy_level: int
    symmetric: bool = True
    head_bits: int = 0
    head_level: int = -1
    head_block: int = 0
    down_block: int = 0

    def of(self, role: str) -> Quant:
        """The quantization of one matrix: `role` "head", "down" or "" (any other)."""
        if role == "head":
            return Quant(self.head_bits or self.bits, self.head_block or self.block,
                         self.accuracy_level if self.head_level < 0 else self.head_level, self.symmetric)
        if role == "down" and self.down_block:
            return Quant(self.bits, self.down_block, self.accuracy_level, self.symmetric)
        return Quant(self.bits, self.block, self.accuracy_level, self.symmetric)


@dataclass(frozen=True)
class Quant:
    """One matrix's: bits, block length along the input, accuracy level, symmetric."""

    bits: int
    block: int
    accuracy_level: int
    symmetric: bool

    def shapes(self, n: int, k: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """MatMulNBits' B (N, k_blocks, blob), scales (N, k_blocks) and zero points (N, packed k_blocks)."""
        blocks, per_byte = -(-k // self.block), 8 // self.bits
        return (n, blocks, self.block * self.bits // 8), (n, blocks), (n, -(-blocks // per_byte))


def slabs(w: np.ndarray, q: Quant) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """`w` (N, K) (a Linear's weight: output rows) quantized a slab of rows at a time: -> (packed (n, k_blocks,
    blob) uint8, scales (n, k_blocks) float32, zero points (n, packed k_blocks) uint8) per slab."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

    kernel = {4: quantize_matmul_4bits, 8: quantize_matmul_8bits}[q.bits]
    n, k = w.shape
    blocks = -(-k // q.block)
    rows = max(1, SLAB_BYTES // (4 * blocks * q.block))
    part = np.zeros(0, np.float32)
    for start in range(0, n, rows):
        if part.shape != (blocks * q.block, min(rows, n - start)):  # one buffer for the slabs of a shape
            part = np.zeros((blocks * q.block, min(rows, n - start)), dtype=np.float32)  # (K padded, n): B's layout
        part[:k] = np.asarray(w[start:start + rows], dtype=np.float32).T  # the padding stays zeros
        packed_shape, scale_shape, zp_shape = q.shapes(part.shape[1], k)
        packed, scales = np.zeros(packed_shape, np.uint8), np.zeros(scale_shape, np.float32)
        zero = np.zeros(zp_shape, np.uint8)
        kernel(packed, part, scales, zero, q.block, part.shape[1], k, q.symmetric)  # as MatMulNBitsQuantizer calls it
        yield packed, scales, zero
