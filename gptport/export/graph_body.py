"""What the static-cache graphs share, written op by op from the weights: the embeddings, each layer
around its attention (LayerNorm, the fused q|k|v projection, the output projection, the MLP), the final
LayerNorm and the head on the positions `logits_index` asks for, and the inputs and outputs the graphs
have in common. Each graph supplies its own attention (gqa_graph.py: GroupQueryAttention;
scatter_graph.py: TensorScatter + Attention). No torch here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from gptport import contract
from gptport.config import ModelConfig

CACHE = "max_sequence"  # the cache's length dimension: n_ctx at run time (or more: the buffers' capacity)
IR_VERSION = 10  # what onnxruntime 1.20 and later read (onnx writes newer ones by default)
# the attention of layer i: (builder, i, qkv (B, S, 3D), q | k | v with heads contiguous) -> its output (B, S, D)
Attend = Callable[["Builder", int, str], str]


def sinusoidal_table(n_ctx: int, d_model: int) -> np.ndarray:
    """model.sinusoidal for positions 0..n_ctx-1, as a (n_ctx, D) float32 table."""
    half = d_model // 2
    inv_freq = np.exp(np.arange(half, dtype=np.float32) * np.float32(-math.log(10000.0) / half))  # (D/2,)
    angles = np.arange(n_ctx, dtype=np.float32)[:, None] * inv_freq  # (C, D/2)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1).astype(np.float32)  # (C, D)


class Builder:
    """Nodes and initializers, with unique names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0
        self._names: set[str] = set()

    def const(self, name: str, array: np.ndarray) -> str:
        """An initializer; one of that name already made is used again (a shape every layer reshapes to)."""
        if name not in self._names:
            self._names.add(name)
            self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def op(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, domain: str = "",
           **attrs: Any) -> list[str]:
        self._count += 1
        name = f"{op_type}_{self._count}"
        outs = [f"{name}_out{i}" for i in range(outputs)] if isinstance(outputs, int) else outputs
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, domain=domain, **attrs))
        return outs

    def matmul(self, x: str, weights: Mapping[str, np.ndarray], prefix: str, out: str | None = None
               ) -> tuple[str, str]:
        """x @ W.T and the name of the bias ("" without one), left for the next op to add. W is
        stored (in, out), a constant MatMul weight, which is what the quantizers look for."""
        w = self.const(f"{prefix}.weight_t", weights[f"{prefix}.weight"].T)
        bias = weights.get(f"{prefix}.bias")
        y = self.op("MatMul", [x, w], [out] if out else 1)[0]
        return y, self.const(f"{prefix}.bias", bias) if bias is not None else ""

    def linear(self, x: str, weights: Mapping[str, np.ndarray], prefix: str, out: str | None = None) -> str:
        """x @ W.T (+ b)."""
        if f"{prefix}.bias" not in weights:
            return self.matmul(x, weights, prefix, out)[0]
        y, bias = self.matmul(x, weights, prefix)
        return self.op("Add", [y, bias], [out] if out else 1)[0]

    def add_layer_norm(self, x: str, delta: str, bias: str, weights: Mapping[str, np.ndarray], prefix: str,
                       eps: float) -> tuple[str, str]:
        """x + delta (+ bias) and its LayerNorm: -> (normalized, sum). Add and LayerNormalization rather
        than the fused SkipLayerNormalization, whose CPU kernel is 2x slower (benchmarks/results)."""
        if bias:  # onto the MatMul's output first: onnxruntime folds it into a quantized MatMulNBits
            delta = self.op("Add", [delta, bias])[0]
        total = self.op("Add", [x, delta])[0]
        return self.layer_norm(total, weights, prefix, eps), total

    def layer_norm(self, x: str, weights: Mapping[str, np.ndarray], prefix: str, eps: float) -> str:
        beta = [self.const(f"{prefix}.bias", weights[f"{prefix}.bias"])] if f"{prefix}.bias" in weights else []
        gamma = self.const(f"{prefix}.weight", weights[f"{prefix}.weight"])
        return self.op("LayerNormalization", [x, gamma, *beta], axis=-1, epsilon=eps)[0]

    def gelu(self, x: str, bias: str, kind: str) -> str:
        """GELU(x + bias): FastGelu (tanh) or BiasGelu (exact), with the bias folded in."""
        if kind == "tanh":
            return self.op("FastGelu", [x, bias] if bias else [x], domain="com.microsoft")[0]
        if bias:
            return self.op("BiasGelu", [x, bias], domain="com.microsoft")[0]
        return self.op("Gelu", [x], approximate="none")[0]


def transformer(config: ModelConfig, weights: Mapping[str, np.ndarray], attend: Attend) -> Builder:
    """The nodes and initializers of a GPT with this config (config.json's "model") and these weights
    (model.safetensors as numpy, GPT-2 names; the head is wte.weight when the embeddings are tied), each
    layer's attention written by `attend`; its output is contract.LOGITS (B, L, V)."""
    n_layer, d_model, n_ctx, eps = config.n_layer, config.d_model, config.n_ctx, config.ln_eps
    w = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}
    g = Builder()

    x = g.op("Gather", [g.const("wte.weight", w["wte.weight"]), contract.INPUT_IDS])[0]  # (B, S, D)
    table = w["wpe.weight"] if config.pos_encoding == "learned" else sinusoidal_table(n_ctx, d_model)
    delta = g.op("Gather", [g.const("positions", table), contract.POSITION_IDS])[0]  # (B, S, D)
    delta_bias = ""
    for i in range(n_layer):
        p = f"h.{i}"
        h, x = g.add_layer_norm(x, delta, delta_bias, w, f"{p}.ln_1", eps)  # x += delta; h = LN(x)
        qkv = g.linear(h, w, f"{p}.attn.c_attn")  # (B, S, 3D): q | k | v, heads contiguous
        attn = attend(g, i, qkv)  # (B, S, D)
        delta, delta_bias = g.matmul(attn, w, f"{p}.attn.c_proj")
        h, x = g.add_layer_norm(x, delta, delta_bias, w, f"{p}.ln_2", eps)
        f = g.gelu(*g.matmul(h, w, f"{p}.mlp.c_fc"), config.gelu)  # (B, S, 4D)
        delta, delta_bias = g.matmul(f, w, f"{p}.mlp.c_proj")
    if delta_bias:
        delta = g.op("Add", [delta, delta_bias])[0]
    x = g.op("Add", [x, delta])[0]  # (B, S, D)
    index = g.op("Unsqueeze", [contract.LOGITS_INDEX, g.const("last_axis", np.array([-1], dtype=np.int64))])[0]
    x = g.op("GatherND", [x, index], batch_dims=1)[0]  # (B, L, D): only the positions asked for
    h = g.layer_norm(x, w, "ln_f", eps)
    if config.tie_embeddings:  # stored once; onnxruntime folds the Transpose when it loads the graph
        head = g.op("Transpose", ["wte.weight"], perm=[1, 0])[0]  # (D, V)
        g.op("MatMul", [h, head], [contract.LOGITS])  # (B, L, V)
    else:
        g.linear(h, w, "lm_head", out=contract.LOGITS)  # (B, L, V)
    return g


def token_inputs() -> list[onnx.ValueInfoProto]:
    """input_ids and position_ids (B, S) int64: what every static-cache graph takes first."""
    batch, seq = contract.BATCH, contract.SEQUENCE
    return [helper.make_tensor_value_info(contract.INPUT_IDS, TensorProto.INT64, [batch, seq]),
            helper.make_tensor_value_info(contract.POSITION_IDS, TensorProto.INT64, [batch, seq])]


def logits_index_input() -> onnx.ValueInfoProto:
    """logits_index (B, L) int64: the new positions whose logits are wanted."""
    return helper.make_tensor_value_info(contract.LOGITS_INDEX, TensorProto.INT64, [contract.BATCH, "logits"])


def cache_values(config: ModelConfig) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    """The logits (B, L, V) and the cache: past_key_values.{i}.key/.value (inputs) and present.{i}.key/.value
    (outputs), each (B, H, C, hd) float32."""
    kv_shape = [contract.BATCH, config.n_head, CACHE, config.head_dim]
    pasts = [helper.make_tensor_value_info(n, TensorProto.FLOAT, kv_shape) for n in contract.past_names(config.n_layer)]
    logits = helper.make_tensor_value_info(contract.LOGITS, TensorProto.FLOAT,
                                           [contract.BATCH, "logits", config.vocab_size])
    presents = [helper.make_tensor_value_info(n, TensorProto.FLOAT, kv_shape)
                for n in contract.present_names(config.n_layer)]
    return pasts, [logits, *presents]


def model(g: Builder, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
          opsets: Mapping[str, int]) -> onnx.ModelProto:
    """The graph of `g`'s nodes and initializers as a model importing `opsets` (domain -> version)."""
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
                             producer_name="gptport", ir_version=IR_VERSION)
