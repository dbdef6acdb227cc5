"""The static-cache graph: the same model written directly in onnxruntime's operators, with one
GroupQueryAttention (com.microsoft) per layer that appends each step's keys and values in place to a
cache preallocated at n_ctx. Built from model.safetensors and config.json, not traced (no torch).

GPT-2's layers and the Llama family's: GroupQueryAttention takes the fused q|k|v (kv_num_heads
n_kv_head), or q, k and v apart after a q/k norm (onnxruntime's CPU kernel does not take the norm's
weights itself); with rope it rotates q and k itself (do_rotary, the halves layout: rotary_interleaved
0) by cos/sin tables of n_ctx positions at each row's cache positions, which are its token positions
(rows start at cache position 0). Partial rotary, LongRoPE and layers without rope are rotated before it, at
position_ids, in onnx's operators (rope_graph.py), and q, k and v handed to it apart, unrotated by it.

Why a second graph: the contract graph (model.onnx) concatenates past and new keys, so every decode
step allocates and copies the whole cache, and it is made of ~230 small nodes. This one has ~14
nodes per layer and, with the cache bound as both input and output (static_cache.step_fn), copies
nothing per step. It is onnxruntime-specific (GroupQueryAttention: CPU in float32, CUDA in float16),
so it sits beside model.onnx rather than replacing it.

I/O, B = batch, S = new tokens, C = n_ctx (the cache length), rows right-aligned at position 0:
    input_ids (B, S) int64, position_ids (B, S) int64 (read by learned and sinusoidal positions only),
    seqlens_k (B,) int32: tokens in the cache after this call, minus one,
    total_sequence_length () int32: the longest row's tokens after this call (S on a prefill),
    logits_index (B, L) int64: the new positions (0..S-1) whose logits are wanted: all of them to
        score a text, each row's last to generate (the head then runs on L = 1 row, not S),
    past_key_values.{i}.key/.value (B, Hkv, C, hd) -> present.{i}.key/.value, same buffer (Hkv = n_kv_head),
    -> logits (B, L, V).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from gptport import contract
from gptport.config import ModelConfig
from gptport.errors import UsageError
from gptport.export import graph_body, rope_graph
from gptport.export.graph_body import FASTEST, Builder, Forms, Qkv, sinusoidal_table
from gptport.export.nbits import NBits
from gptport.export.rope_graph import Rotary
from gptport.export.tensor_sink import Sink

CACHE = graph_body.CACHE
OPSET = 21
IR_VERSION = graph_body.IR_VERSION
__all__ = ["CACHE", "IR_VERSION", "OPSET", "build", "cache_values", "logits_index_input", "refuse_unsupported",
           "sinusoidal_table", "token_inputs", "unsupported"]


def unsupported(config: ModelConfig) -> str:
    """Why this config cannot have the static-cache graphs, this one and scatter_graph.py's ("" when it
    can): GroupQueryAttention's head size and, with rope, its rotation's."""
    head_dim = config.head_dim
    if head_dim % 8:
        return f"GroupQueryAttention needs a head size that is a multiple of 8 (this model's is {head_dim})"
    return ""


def refuse_unsupported(config: ModelConfig) -> None:
    """A UsageError saying why, when this config cannot have the static-cache graphs (unsupported)."""
    reason = unsupported(config)
    if reason:
        raise UsageError(f"no static-cache graph: {reason}")


def rope_table_names(g: Builder, config: ModelConfig, local: bool) -> list[str]:
    """The cos and sin tables (C, hd/2) of the global layers, or with `local` the window layers', made once."""
    prefix = "rope.local" if local else "rope"
    if f"{prefix}.cos" not in g.made:
        cos, sin = rope_graph.rope_tables(config, local=local)  # (C, hd/2) each
        g.made |= {f"{prefix}.cos", f"{prefix}.sin"}
        return [g.const(f"{prefix}.cos", cos), g.const(f"{prefix}.sin", sin)]
    return [f"{prefix}.cos", f"{prefix}.sin"]


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
    (outputs), each (B, Hkv, C, hd) float32."""
    kv_shape = [contract.BATCH, config.n_kv_head, CACHE, config.head_dim]
    pasts = [helper.make_tensor_value_info(n, TensorProto.FLOAT, kv_shape) for n in contract.past_names(config.n_layer)]
    logits = helper.make_tensor_value_info(contract.LOGITS, TensorProto.FLOAT,
                                           [contract.BATCH, "logits", config.vocab_size])
    presents = [helper.make_tensor_value_info(n, TensorProto.FLOAT, kv_shape)
                for n in contract.present_names(config.n_layer)]
    return pasts, [logits, *presents]


def build(config: ModelConfig, weights: Mapping[str, np.ndarray], forms: Forms = FASTEST, sink: Sink | None = None,
          nbits: NBits | None = None, residuals: list[str] | None = None) -> onnx.ModelProto:
    """The static-cache graph of a model with this config (config.json's "model") and these weights
    (model.safetensors as numpy, gptport's names; the head is wte.weight when the embeddings are tied);
    refused for a config it cannot have (unsupported). `forms`: which operators write RMSNorm and SwiGLU; `sink`
    and `nbits`: where the initializers go and how the MatMul weights are quantized (graph_body.transformer)."""
    refuse_unsupported(config)
    n_layer = config.n_layer
    pasts, presents = contract.past_names(n_layer), contract.present_names(n_layer)
    lengths = [contract.SEQLENS_K, contract.TOTAL_SEQUENCE_LENGTH]
    rotary = Rotary(config) if rope_graph.outside(config) else None

    def attend(g: Builder, i: int, qkv: Qkv) -> str:  # appends in place to the cache at each row's seqlens_k
        rope: dict[str, Any] = {}
        tables: list[str] = []
        if rotary is not None:  # rotated here, at position_ids: q, k and v apart
            q, k, v = g.parts(qkv)  # (B, S, H*hd), (B, S, Hkv*hd) twice
            qkv = Qkv("", (rotary.heads(g, q, i, config.n_head), rotary.heads(g, k, i, config.n_kv_head), v))
        elif config.pos_encoding == "rope":  # rotated inside, at each row's cache positions
            tables = rope_table_names(g, config, config.local_rope(i))
            rope.update(do_rotary=1, rotary_interleaved=0)
        if config.windowed(i):  # keys q - window < k: onnxruntime's CPU kernel keeps local_window_size of them,
            rope["local_window_size"] = config.sliding_window  # its own included (measured: test_gemma3_export.py)
        if config.attn_softcap > 0:  # tanh(s / cap) * cap after the scale, before the mask (measured: 0052)
            rope["softcap"] = config.attn_softcap
        q, k, v = (qkv.packed, "", "") if qkv.parts is None else qkv.parts  # packed, or apart after q/k norm
        return g.op("GroupQueryAttention", [q, k, v, pasts[2 * i], pasts[2 * i + 1], *lengths, *tables],
                    [f"h.{i}.attn", presents[2 * i], presents[2 * i + 1]], domain="com.microsoft",
                    num_heads=config.n_head, kv_num_heads=config.n_kv_head,
                    scale=config.attn_scale or 1.0 / math.sqrt(config.head_dim), **rope)[0]  # (B, S, H*hd)

    g = graph_body.transformer(config, weights, attend, forms, sink, nbits)
    if residuals is not None:  # the residual stream after each layer (a layer-by-layer check cuts there)
        residuals.extend(g.residuals)
    past_values, outputs = cache_values(config)
    inputs = [
        *token_inputs(),
        helper.make_tensor_value_info(contract.SEQLENS_K, TensorProto.INT32, [contract.BATCH]),
        helper.make_tensor_value_info(contract.TOTAL_SEQUENCE_LENGTH, TensorProto.INT32, []),
        logits_index_input(),
        *past_values,
    ]
    return graph_body.model(g, "gptport_static_cache", inputs, outputs, {"": OPSET, "com.microsoft": 1})
