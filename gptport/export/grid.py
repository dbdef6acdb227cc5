"""Weights that already lie on a 4-bit grid, encoded for MatMulNBits without a second rounding.

A model imported from a GGUF file of llama.cpp's 4-bit types carries weights that are, block by block of
32 input channels, `scale * q + offset` with q in 0..15 (Q4_0: offset = -8 scale; Q4_1 and Q4_K's
sub-blocks: any offset). Quantizing those values again with onnxruntime's quantizer rounds them a second
time onto a different grid (symmetric, or an integer zero point that cannot express Q4_1's float minimum):
SmolLM2-135M's Q4_1 weights came out agreeing with the float model on ~70% of held-out positions. This module
finds such matrices and writes the same values (to float32 rounding), re-expressed per block as codes 0..15
from the block's minimum with a positive step: MatMulNBits takes the codes and steps with its implied zero
point 8, and what the minimum adds, (sum of x over each block) @ (minimum + 8 step), is a small float
MatMul beside it:

    y = x @ W = MatMulNBits(x; codes, steps) + sums(x) @ R      sums(x): (..., K/32), R: (K/32, N)

The block sums are a Reshape of x to (..., K/32, 32) and a ReduceSum: nothing that grows with K^2 (a
(K, K/32) indicator matrix would be 26 MB at K = 14336), and at SmolLM2-135M's shape decoding runs as fast
as with the indicator (three interleaved pairs by hand, 2026-11-27). No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

BLOCK = 32  # llama.cpp's 4-bit block (Q4_0, Q4_1, and Q4_K's sub-blocks)
LEVELS = 15  # codes 0..15
ZERO = 8  # MatMulNBits' zero point when none is given (4 bits)
SAMPLE_COLUMNS = 64  # looked at first, so a matrix off the grid is turned away after a small slice of it
CHUNK = 4096  # columns fitted at a time after the sample
_ULPS = 64.0  # how far (in float32 epsilons of the block's largest magnitude) a value may sit from its grid point


@dataclass(frozen=True)
class Grid:
    """A (K, N) matrix as codes, scales and offsets of blocks of BLOCK rows: w = scale * q + offset."""

    q: np.ndarray  # (K/BLOCK, BLOCK, N) uint8, 0..15
    scale: np.ndarray  # (K/BLOCK, N) float32
    offset: np.ndarray  # (K/BLOCK, N) float32


def find(w: np.ndarray) -> Grid | None:
    """`w` (K, N) as a Grid if every block of BLOCK rows of every column holds at most 16 evenly spaced
    values (to float32 rounding) and some block more than one, else None. The first SAMPLE_COLUMNS columns
    are tried first; the rest in slices of CHUNK columns (a fit holds a few copies of what it fits)."""
    if w.ndim != 2 or w.shape[0] % BLOCK or w.dtype != np.float32 or not (w != w[:1]).any():
        return None  # not a weight MatMulNBits takes, or constant along K (zeros): nothing to keep exact
    parts = []
    for start in (0, *range(SAMPLE_COLUMNS, w.shape[1], CHUNK)):
        part = _fit(w[:, start:SAMPLE_COLUMNS if start == 0 else start + CHUNK])
        if part is None:
            return None
        parts.append(part)
    return Grid(*(np.concatenate(arrays, axis=-1) for arrays in zip(*((p.q, p.scale, p.offset) for p in parts),
                                                                      strict=True)))


def _fit(w: np.ndarray) -> Grid | None:
    """`w` (K, n) as a Grid, or None if a block of it is off every 4-bit grid."""
    k, n = w.shape
    blocks = w.reshape(k // BLOCK, BLOCK, n)  # (nb, BLOCK, n)
    lo, hi = blocks.min(1), blocks.max(1)  # (nb, n)
    tol = _ULPS * np.finfo(np.float32).eps * np.maximum(np.abs(lo), np.abs(hi))  # (nb, n)
    scale = np.zeros_like(lo)
    q = np.zeros(blocks.shape, np.uint8)
    todo = hi > lo  # a constant block: scale 0, every code 0
    # The span is `steps` grid steps for some steps <= 15: the most a block's values use is tried first
    # (Q4_0 and Q4_1 use all 16 levels); any steps that fits is an exact encoding.
    for steps in range(LEVELS, 0, -1):
        if not todo.any():
            break
        idx = np.nonzero(todo)
        sub = blocks[idx[0], :, idx[1]]  # (m, BLOCK)
        d = ((hi - lo)[idx] / steps)[:, None]  # (m, 1)
        codes = np.rint((sub - lo[idx][:, None]) / d)
        ok = (np.abs(lo[idx][:, None] + d * codes - sub) <= tol[idx][:, None]).all(1)  # (m,)
        hit = (idx[0][ok], idx[1][ok])
        scale[hit] = d[ok, 0]
        q[hit[0], :, hit[1]] = codes[ok].astype(np.uint8)
        todo[hit] = False
    if todo.any():
        return None
    return Grid(q, scale, lo)


def _pack(g: Grid) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits' B (N, K/BLOCK, BLOCK/2) uint8, two codes a byte, the lower index in the low nibble,
    and its scales (N * K/BLOCK,) float32, column-major over blocks."""
    codes = g.q.transpose(2, 0, 1)  # (N, nb, BLOCK)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return np.ascontiguousarray(packed), np.ascontiguousarray(g.scale.T).reshape(-1)


def _initializers(graph: onnx.GraphProto, weight: str, g: Grid) -> list[str]:
    """`g`'s codes, scales and offsets (+ ZERO x scale: MatMulNBits subtracts its zero point) added to
    `graph` as initializers; their names."""
    packed, scales = _pack(g)
    names = [f"{weight}_grid_{part}" for part in ("q4", "scales", "offsets")]
    for arr, name in zip((packed, scales, g.offset + ZERO * g.scale), names, strict=True):
        graph.initializer.append(numpy_helper.from_array(arr, name))
    return names


def _block_sums(graph: onnx.GraphProto, inits: dict[str, onnx.TensorProto], x: str, k: int, rank: int, out: str,
                name: str) -> list[onnx.NodeProto]:
    """Nodes writing `out` (..., K/32), the sums of x (..., K) over each block of BLOCK channels: a Reshape
    keeping x's leading dims (x of `rank` dims: gptport's activations are (B, T, C)) and a ReduceSum."""
    shape, axes = f"grid_block_shape_{rank}_{k}", "grid_block_axes"
    for const, value in ((shape, [0] * (rank - 1) + [k // BLOCK, BLOCK]), (axes, [-1])):
        if const not in inits:
            inits[const] = numpy_helper.from_array(np.array(value, np.int64), const)
            graph.initializer.append(inits[const])
    blocks = f"{name}_blocks"
    return [helper.make_node("Reshape", [x, shape], [blocks], name=blocks),  # (..., K/32, 32)
            helper.make_node("ReduceSum", [blocks, axes], [out], name=name, keepdims=0)]  # (..., K/32)


def encode(proto: onnx.ModelProto, accuracy_level: int) -> list[str]:
    """Replace each MatMul of `proto` whose weight is an initializer on a 4-bit grid by its exact
    MatMulNBits encoding; the names of the nodes added (to keep other quantizers off them). Nodes keep
    their order, so the graph stays topologically sorted; a weight two MatMuls share is encoded once."""
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    users: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            users[name] = users.get(name, 0) + 1
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in (*graph.input, *graph.value_info, *graph.output) if v.type.tensor_type.HasField("shape")}
    added: list[str] = []
    sums: dict[str, str] = {}  # activation -> its block sums (one per input, shared by q/k/v or gate/up)
    encoded: dict[str, list[str]] = {}  # weight -> its codes, scales and offsets
    out: list[onnx.NodeProto] = []
    for node in graph.node:
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if weight is not None and weight.name not in encoded:
            g = find(numpy_helper.to_array(weight))
            if g is not None:
                encoded[weight.name] = _initializers(graph, weight.name, g)
        if weight is None or weight.name not in encoded:
            out.append(node)
            continue
        x, (k, n), base = node.input[0], weight.dims, node.name or node.output[0]
        if x not in sums:
            sums[x] = f"{base}_grid_block_sums"
            out += _block_sums(graph, inits, x, k, ranks.get(x, 3), sums[x], f"{base}_grid_sum")
            added += [f"{base}_grid_sum", f"{base}_grid_sum_blocks"]
        names = encoded[weight.name]
        attrs = {"K": k, "N": n, "bits": 4, "block_size": BLOCK}
        if accuracy_level:
            attrs["accuracy_level"] = accuracy_level
        main, fix = f"{base}_grid_main", f"{base}_grid_offset"
        out.append(helper.make_node("MatMulNBits", [x, names[0], names[1]], [main], name=f"{base}_Q4_grid",
                                    domain="com.microsoft", **attrs))
        out.append(helper.make_node("MatMul", [sums[x], names[2]], [fix], name=fix))
        out.append(helper.make_node("Add", [main, fix], [node.output[0]], name=f"{base}_grid_add"))
        added += [f"{base}_Q4_grid", fix, f"{base}_grid_add"]
        users[weight.name] -= 1
        if users[weight.name] == 0:
            graph.initializer.remove(weight)
    del graph.node[:]
    graph.node.extend(out)
    if added and not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return added
