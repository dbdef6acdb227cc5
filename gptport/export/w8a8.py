"""W8A8 MatMuls on onnxruntime's integer GEMM: int8 weights with one scale per output channel, activations
quantized to 8 bits with one scale per token (per row of the MatMul's input), multiplied by MatMulInteger.

onnxruntime's fast int8 products on the CPU are per tensor: DynamicQuantizeMatMul and MatMulIntegerToFloat
take one activation scale for the whole input, which a single token's outlier spoils for every row beside it,
and MatMulNBits quantizes activations in blocks along K on a slower kernel (design record 0038). Here the
scale is computed per row by ordinary operators, the input is quantized to uint8 around 128, and MLAS's
u8 x s8 GEMM (VNNI where the CPU has it) does the product:

    a = max(max_j |x_j|, eps)          # (..., 1) per row
    q = uint8(x * (127 / a) + 128.5)   # round half up, in [1, 255]
    y = float(MatMulInteger(q, W_q, 128)) * (a / 127) * w_scale

At SmolLM2-135M's shape it is 2x the prefill speed of 8-bit MatMulNBits and 1.3x its decode, but too coarse for
that model's gate (design record 0038): a measured scheme, not on the int8 ladder. On a CPU without VNNI (AVX2
only) the u8 x s8 GEMM adds each pair of products in int16 (vpmaddubsw) and saturates with these full-range
weights: the products are wrong there (20% of the output's range in tests/export/test_quant_schemes.py on an
AVX2 EPYC), so it is measured on VNNI CPUs only. No torch here."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

EPS = 1e-8  # an all-zero row gets this range (its quantized values are all 128, its product 0)


def _quantize_weight(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(K, N) float -> (K, N) int8 in [-127, 127] and (N,) float32 scales, symmetric per output channel."""
    scale = np.maximum(np.abs(w).max(axis=0), EPS) / 127.0  # (N,)
    return np.clip(np.rint(w / scale), -127, 127).astype(np.int8), scale.astype(np.float32)


def weight_matmul(node: onnx.NodeProto, inits: Mapping[str, onnx.TensorProto]) -> bool:
    """A MatMul whose second input is a 2-D float32 initializer."""
    w = inits.get(node.input[1]) if node.op_type == "MatMul" else None
    return w is not None and len(w.dims) == 2 and w.data_type == TensorProto.FLOAT


def rewrite(proto: onnx.ModelProto) -> int:
    """Replace every weight-reading MatMul of `proto` in place with the per-token int8 product; a tensor read by
    several MatMuls is quantized once, a weight several read is stored once. -> how many were replaced."""
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    consts = [numpy_helper.from_array(np.array(v, np.float32), name) for name, v in
              (("w8a8_eps", EPS), ("w8a8_127", 127.0), ("w8a8_inv127", 1 / 127.0), ("w8a8_half", 128.5))]
    consts += [numpy_helper.from_array(np.array([-1], np.int64), "w8a8_last"),
               numpy_helper.from_array(np.array(128, np.uint8), "w8a8_zp")]
    quantized: dict[str, tuple[str, str]] = {}  # input -> (its uint8 tensor, its row scales)
    nodes, added, done, weights = [], list(consts), 0, set()
    for node in graph.node:
        if not weight_matmul(node, inits):
            nodes.append(node)
            continue
        x, w_name = node.input
        p = f"{node.name or node.output[0]}_w8a8"
        if x not in quantized:
            q = f"{x}_w8a8"
            nodes += [helper.make_node("Abs", [x], [q + "_abs"]),
                      helper.make_node("ReduceMax", [q + "_abs", "w8a8_last"], [q + "_amax"], keepdims=1),
                      helper.make_node("Max", [q + "_amax", "w8a8_eps"], [q + "_a"]),  # (..., 1)
                      helper.make_node("Div", ["w8a8_127", q + "_a"], [q + "_inv"]),
                      helper.make_node("Mul", [q + "_a", "w8a8_inv127"], [q + "_scale"]),
                      helper.make_node("Mul", [x, q + "_inv"], [q + "_x127"]),
                      helper.make_node("Add", [q + "_x127", "w8a8_half"], [q + "_shift"]),
                      helper.make_node("Cast", [q + "_shift"], [q + "_u8"], to=TensorProto.UINT8)]
            quantized[x] = (q + "_u8", q + "_scale")
        xq, row_scale = quantized[x]
        if w_name not in weights:  # a weight several MatMuls read is stored once
            wq, w_scale = _quantize_weight(numpy_helper.to_array(inits[w_name]))  # (K, N) int8, (N,)
            added += [numpy_helper.from_array(wq, w_name + "_w8a8"),
                      numpy_helper.from_array(w_scale, w_name + "_w8a8_s")]
            weights.add(w_name)
        nodes += [helper.make_node("MatMulInteger", [xq, w_name + "_w8a8", "w8a8_zp"], [p + "_acc"]),
                  helper.make_node("Cast", [p + "_acc"], [p + "_accf"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", [p + "_accf", row_scale], [p + "_rows"]),
                  helper.make_node("Mul", [p + "_rows", w_name + "_w8a8_s"], list(node.output))]
        done += 1
    used = {i for n in nodes for i in n.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + [a for a in added if a.name in used])
    return done
