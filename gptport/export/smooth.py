"""Activation smoothing before int8 quantization (SmoothQuant's equivalent rescaling, Xiao et al. 2023): a
MatMul whose input comes out of a norm, or out of SwiGLU's product, gets its input channels divided by s_j and
its weight rows multiplied by s_j, s_j = max|x_j|^alpha / max|W_j|^(1 - alpha). The division is folded into
what made the input (the norm's weight and bias, or the up projection's columns), so the graph computes the
same function in float and nothing is added to it; only the quantizer sees different numbers. With int8
activations quantized in blocks of 32 channels (MatMulNBits' accuracy level 4), a channel that is a hundred
times its neighbours takes their precision: Llama-family models have such channels after every norm and in
the down projections' inputs. No torch here: the channels' ranges come from calibration.py.

Ranges are keyed by the torch module whose output (a norm: "h.3.ln_1") or input (a down projection:
"h.3.mlp.c_proj") the MatMul reads; the graph's norms are found by their weight's name ("h.3.ln_1.weight"),
which both the contract graph and the static-cache graphs keep."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

NORMS = {"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization", "SkipLayerNormalization",
         "SkipSimplifiedLayerNormalization"}
FLOOR = 1e-5  # no channel's range or weight row below this: a dead channel is not blown up
# How a rescaling's s is chosen: (module, the (in, out) weights that read its activation) -> s (in,), or None to
# leave the module alone. SmoothQuant's (smooth()) from the ranges; AWQ's (awq.py) by a search.
Choose = Callable[[str, list[np.ndarray]], "np.ndarray | None"]
Folded = dict[str, tuple[np.ndarray, list[str]]]  # module -> (its s, the weight initializers now reading x / s)


@dataclass
class _Graph:
    """The graph's initializers by name, each tensor's producer and consumers."""

    inits: dict[str, onnx.TensorProto]
    producer: dict[str, onnx.NodeProto]
    consumers: dict[str, list[onnx.NodeProto]]

    @classmethod
    def of(cls, graph: onnx.GraphProto) -> _Graph:
        producer, consumers = {}, {}
        for n in graph.node:
            for o in n.output:
                producer[o] = n
            for i in n.input:
                consumers.setdefault(i, []).append(n)
        return cls({i.name: i for i in graph.initializer}, producer, consumers)

    def owned(self, name: str) -> bool:
        """An initializer read by exactly one node (a tied head shares the embedding's: not touched)."""
        return name in self.inits and len(self.consumers.get(name, [])) == 1

    def array(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self.inits[name]).copy()

    def put(self, name: str, array: np.ndarray) -> None:
        self.inits[name].CopyFrom(numpy_helper.from_array(array.astype(np.float32), name))


def _weights(g: _Graph, x: str) -> list[str] | None:
    """The weight initializers of the MatMuls that read `x`, if every reader of `x` is such a MatMul."""
    readers = g.consumers.get(x, [])
    names = [n.input[1] for n in readers if n.op_type == "MatMul" and n.input[0] == x]
    if not readers or len(names) != len(readers) or not all(g.owned(w) for w in names):
        return None
    return names


def _scales(ranges: np.ndarray, weights: list[np.ndarray], alpha: float) -> np.ndarray:
    """s_j for input channel j of weights stored (in, out)."""
    w = np.maximum(np.max([np.abs(a).max(axis=1) for a in weights], axis=0), FLOOR)  # (in,)
    a = np.maximum(ranges.astype(np.float64), FLOOR)
    return (a ** alpha / w ** (1 - alpha)).astype(np.float32)


def _gamma_at(g: _Graph, node: onnx.NodeProto, ranges: Collection[str]) -> int:
    """Which input of `node` is a norm's weight the ranges know: a norm operator's, or a Mul by a "*.weight"
    initializer (RMSNorm as torch.export writes it: x * rsqrt(mean(x^2) + eps), times the weight); -1: none."""
    if node.op_type in NORMS:
        at = 2 if node.op_type.startswith("Skip") else 1
    elif node.op_type == "Mul":
        at = next((i for i, x in enumerate(node.input) if x in g.inits and x.endswith(".weight")), -1)
    else:
        return -1
    return at if at >= 0 and node.input[at].removesuffix(".weight") in ranges else -1


def _smooth_norm(g: _Graph, node: onnx.NodeProto, at: int, module: str, choose: Choose, done: Folded) -> None:
    """Divide the norm's weight (input `at`, and its bias) by s, multiply the rows of its readers' weights by s."""
    beta_at = {"LayerNormalization": 2, "SkipLayerNormalization": 3}.get(node.op_type, -1)
    beta = node.input[beta_at] if 0 <= beta_at < len(node.input) else ""
    names = _weights(g, node.output[0])
    if names is None or not g.owned(node.input[at]) or (beta and not g.owned(beta)) or (
            node.op_type == "SkipLayerNormalization" and len(node.input) > 4 and node.input[4]):
        return
    s = choose(module, [g.array(w) for w in names])
    if s is None:
        return
    g.put(node.input[at], g.array(node.input[at]) / s)
    if beta:
        g.put(beta, g.array(beta) / s)
    for w in names:
        g.put(w, g.array(w) * s[:, None])
    done[module] = (s, names)


def _up_columns(g: _Graph, x: str, width: int) -> tuple[str, str, slice] | None:
    """Where SwiGLU's up branch `x` comes from: (its MatMul weight, its bias or "", its columns), through an
    optional bias Add and an optional Split of a [gate | up] product."""
    node, bias = g.producer.get(x), ""
    if node is not None and node.op_type == "Add" and node.input[1] in g.inits:
        node, bias = g.producer.get(node.input[0]), node.input[1]
    cols = slice(0, width)
    if node is not None and node.op_type == "Split":
        sizes = [int(v) for v in g.array(node.input[1])] if len(node.input) > 1 and node.input[1] in g.inits else []
        k = list(node.output).index(x)
        if not sizes or len(g.consumers.get(node.input[0], [])) != 1:
            return None
        cols = slice(sum(sizes[:k]), sum(sizes[:k + 1]))
        node = g.producer.get(node.input[0])
    if node is None or node.op_type != "MatMul" or not g.owned(node.input[1]) or (bias and not g.owned(bias)):
        return None
    if bias and g.array(bias).shape[-1] != g.array(node.input[1]).shape[1]:
        return None
    return node.input[1], bias, cols


def _smooth_down(g: _Graph, down: onnx.NodeProto, module: str, choose: Choose, done: Folded) -> None:
    """down(silu(gate) * up): divide up's columns (and bias) by s, multiply down's rows by s."""
    mul = g.producer.get(down.input[0])
    if mul is None or mul.op_type != "Mul" or not g.owned(down.input[1]) or len(g.consumers[mul.output[0]]) != 1:
        return
    w_down = g.array(down.input[1])  # (F, D)
    ups = [x for x in mul.input if g.producer.get(x) is not None and g.producer[x].op_type in ("MatMul", "Add",
                                                                                                "Split")]
    if len(ups) != 1 or len(g.consumers.get(ups[0], [])) != 1:
        return
    found = _up_columns(g, ups[0], w_down.shape[0])
    if found is None:
        return
    w_up_name, bias, cols = found
    w_up = g.array(w_up_name)
    if w_up[:, cols].shape[1] != w_down.shape[0]:
        return
    s = choose(module, [w_down])
    if s is None:
        return
    w_up[:, cols] /= s
    g.put(w_up_name, w_up)
    if bias:
        b = g.array(bias)
        b[..., cols] = b[..., cols] / s
        g.put(bias, b)
    g.put(down.input[1], w_down * s[:, None])
    done[module] = (s, [down.input[1]])


def smooth(proto: onnx.ModelProto, ranges: Mapping[str, np.ndarray], alpha: float) -> list[str]:
    """Rescale `proto` in place where `ranges` (module name -> (in,) max |x_j|) says; -> the modules done."""
    return list(fold(proto, ranges, lambda module, weights: _scales(ranges[module], weights, alpha)))


def fold(proto: onnx.ModelProto, modules: Collection[str], choose: Choose) -> Folded:
    """Rescale `proto` in place: each norm of `modules` and each down projection of `modules` whose weights can
    take it (owned, read by MatMuls only) by the s `choose` gives; -> what was done, in graph order."""
    g = _Graph.of(proto.graph)
    done: Folded = {}
    for node in list(proto.graph.node):
        at = _gamma_at(g, node, modules)
        if at < 0:
            continue
        module = node.input[at].removesuffix(".weight")
        _smooth_norm(g, node, at, module, choose, done)
        down = f"{module.rsplit('.', 1)[0]}.mlp.c_proj" if module.endswith(".ln_2") else ""
        if down not in modules:
            continue
        reads = _weights(g, node.output[0]) or []
        muls = {c.output[0] for w in reads for c in _through(g, w)}
        downs = [c for m in muls for c in g.consumers.get(m, []) if c.op_type == "MatMul" and c.input[0] == m]
        if len(downs) == 1:
            _smooth_down(g, downs[0], down, choose, done)
    return done


def _through(g: _Graph, weight: str) -> list[onnx.NodeProto]:
    """The Mul nodes reached from the MatMul of `weight` through at most a bias Add, a Split and SiLU's
    Sigmoid and Mul: where SwiGLU multiplies its two branches."""
    matmul = g.consumers[weight][0]
    frontier, found = list(matmul.output), []
    for _ in range(4):
        nxt = []
        for t in frontier:
            for c in g.consumers.get(t, []):
                if c.op_type == "Mul" and c not in found:
                    found.append(c)
                if c.op_type in ("Add", "Split", "Sigmoid", "Mul"):
                    nxt.extend(c.output)
        frontier = nxt
    return [m for m in found if any(len(g.consumers.get(o, [])) == 1 and g.consumers[o][0].op_type == "MatMul"
                                    for o in m.output)]
