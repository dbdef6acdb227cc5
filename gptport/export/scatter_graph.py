"""The multi-row append graph: the static-cache graph (gqa_graph.py) with its attention written in
onnx's own opset-24 operators, so that one run appends several new tokens to each of several rows of
the cache, each row at its own length. Built from the weights like its twin (no torch).

Why a third graph: onnxruntime's CPU GroupQueryAttention refuses a batch of rows that each append
several tokens after a cache ("batch_size must be 1 when sequence_length > 1 and past context is
given"), so prefix-reuse rests, new chat turns and chunks of prompts are one-row runs of their own.
Per layer, TensorScatter writes the new keys and values into the cache at each row's `write_index`
(in place when the cache is bound as both past and present, as static_cache binds it), and Attention
(opset 24) attends each row's new tokens to its first `write_index + K` positions (`nonpad_kv_seqlen`),
causally, aligned at that row's end (a window layer's through a boolean mask, causal and within the
window). The cache has the GQA graph's layout, so one set of buffers serves
both graphs (runtime/slots.py): GroupQueryAttention for one-token decode steps, this graph for appends
(docs/design/0036-multi-row-append.md measures which serves what).

The new tokens of every row come packed into one sequence (1, T), so the matrix products, norms and
MLP run on the T real tokens only; each layer's attention takes q, k and v apart, rotates q and k at
their position_ids while still packed (rope: RotaryEmbedding, opset 23, the halves layout), gathers
them into rows padded to the longest (B, K) and scatters its output back. Attention-24 reads each kv
head for its n_head / n_kv_head query heads itself. A row with fewer than K new tokens writes padding
past its real ones, where no attention reads (each row attends causally to its first write_index + K positions,
its real tokens first) until its next append writes over it. A row of the bound span that appends
nothing writes padding at its own length (or past a free row's kept prefix: runtime/append.py). Every
row needs write_index + K <= C.

I/O, B = rows bound, T = new tokens in all, K = the most new tokens of a row, C = the cache's capacity:
    input_ids (1, T) int64, position_ids (1, T) int64: the new tokens, row after row,
    write_index (B,) int64: each row's first new position (the tokens it holds before this call),
    pack_index (B, K) int64: the places in 0..T-1 of each row's new tokens (padding: any place),
    unpack_index (T,) int64: each new token's place r * K + j among the padded rows,
    logits_index (1, L) int64: the places in 0..T-1 of the tokens whose logits are wanted,
    past_key_values.{i}.key/.value (B, Hkv, C, hd) -> present.{i}.key/.value, same buffer (Hkv = n_kv_head),
    -> logits (1, L, V).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper

from gptport import contract
from gptport.config import ModelConfig
from gptport.export import gqa_graph, graph_body, rope_graph
from gptport.export.graph_body import FASTEST, Builder, Forms, Qkv
from gptport.export.nbits import NBits
from gptport.export.rope_graph import Rotary
from gptport.export.tensor_sink import Sink

OPSET = 24  # TensorScatter and Attention with nonpad_kv_seqlen


def build(config: ModelConfig, weights: Mapping[str, np.ndarray], forms: Forms = FASTEST, sink: Sink | None = None,
          nbits: NBits | None = None, residuals: list[str] | None = None) -> onnx.ModelProto:
    """The multi-row append graph of a model with this config and these weights (as gqa_graph.build, `residuals`
    too; refused for the configs gqa_graph.unsupported names)."""
    gqa_graph.refuse_unsupported(config)
    n_layer, head_dim = config.n_layer, config.head_dim
    pasts, presents = contract.past_names(n_layer), contract.present_names(n_layer)
    made: dict[str, str] = {}  # what every layer shares, made at the first: lengths, rope tables
    rotary = Rotary(config, packed=True) if rope_graph.outside(config) else None  # partial, LongRoPE, layers without

    def valid_lengths(g: Builder) -> tuple[str, str]:
        if not made.get("each"):
            width = g.op("Shape", [contract.PACK_INDEX], start=1, end=2)[0]  # (1,): K
            made["each"] = g.op("Add", [contract.WRITE_INDEX, width])[0]  # (B,): write_index + K
            made["longest"] = g.op("ReduceMax", [made["each"]], keepdims=1)[0]  # (1,): the longest
        return made["each"], made["longest"]

    def rotate(g: Builder, x: str, heads: int, local: bool) -> str:  # (1, T, heads*hd) at each token's position_ids
        cos, sin = gqa_graph.rope_table_names(g, config, local)
        return g.op("RotaryEmbedding", [x, cos, sin, contract.POSITION_IDS], num_heads=heads, interleaved=0)[0]

    def window_mask(g: Builder) -> str:  # (B, 1, K, P) bool: query j of row r (position write_index + j) sees
        if not made.get("window"):  # keys p with write_index + j - window < p <= write_index + j
            _, longest = valid_lengths(g)
            zero, one = g.const("zero_scalar", np.array(0, np.int64)), g.const("one_scalar", np.array(1, np.int64))
            width = g.op("Squeeze", [g.op("Shape", [contract.PACK_INDEX], start=1, end=2)[0]])[0]  # () K
            queries = g.op("Range", [zero, width, one])[0]  # (K,)
            keys = g.op("Range", [zero, g.op("Squeeze", [longest])[0], one])[0]  # (P,)
            at = g.op("Unsqueeze", [contract.WRITE_INDEX, g.const("axis_1", np.array([1], np.int64))])[0]  # (B, 1)
            at = g.op("Unsqueeze", [g.op("Add", [at, queries])[0], g.const("axis_2", np.array([2], np.int64))])[0]
            start = g.op("Sub", [at, g.const("window", np.array(config.sliding_window, np.int64))])[0]  # (B, K, 1)
            keep = g.op("And", [g.op("Greater", [keys, start])[0], g.op("LessOrEqual", [keys, at])[0]])[0]
            made["window"] = g.op("Unsqueeze", [keep, g.const("axis_1", np.array([1], np.int64))])[0]  # (B,1,K,P)
        return made["window"]

    def to_rows(g: Builder, x: str, heads: int) -> str:  # (1, T, heads*hd) -> (B, heads, K, hd), padded rows
        flat = g.op("Reshape", [x, g.const(f"tokens_{heads}", np.array([-1, heads * head_dim], dtype=np.int64))])[0]
        rows = g.op("Gather", [flat, contract.PACK_INDEX], axis=0)[0]  # (B, K, heads*hd): each row's tokens
        split = g.const(f"rows_{heads}", np.array([0, 0, heads, head_dim], dtype=np.int64))
        return g.op("Transpose", [g.op("Reshape", [rows, split])[0]], perm=[0, 2, 1, 3])[0]  # (B, heads, K, hd)

    def attend(g: Builder, i: int, qkv: Qkv) -> str:
        q, k, v = g.parts(qkv)  # (1, T, H*hd), (1, T, Hkv*hd) twice
        if rotary is not None:  # rotated while packed, in onnx's operators
            q, k = rotary.heads(g, q, i, config.n_head), rotary.heads(g, k, i, config.n_kv_head)
        elif config.pos_encoding == "rope":  # rotated while packed: the real tokens only, at their positions
            local = config.local_rope(i)
            q, k = rotate(g, q, config.n_head, local), rotate(g, k, config.n_kv_head, local)
        q = to_rows(g, q, config.n_head)  # (B, H, K, hd)
        k, v = to_rows(g, k, config.n_kv_head), to_rows(g, v, config.n_kv_head)  # (B, Hkv, K, hd) each
        key = g.op("TensorScatter", [pasts[2 * i], k, contract.WRITE_INDEX], [presents[2 * i]], axis=2)[0]
        value = g.op("TensorScatter", [pasts[2 * i + 1], v, contract.WRITE_INDEX], [presents[2 * i + 1]], axis=2)[0]
        each, longest = valid_lengths(g)
        start, axis = g.const("zero", np.array([0], dtype=np.int64)), g.const("seq_axis", np.array([2], dtype=np.int64))
        key = g.op("Slice", [key, start, longest, axis])[0]  # (B, Hkv, P, hd): the positions any row attends to
        value = g.op("Slice", [value, start, longest, axis])[0]
        mask = window_mask(g) if config.windowed(i) else ""  # a window layer's: causal and within the window
        capped = {"softcap": config.attn_softcap} if config.attn_softcap > 0 else {}  # before the mask, as Gemma 2's
        y = g.op("Attention", [q, key, value, mask, "", "", each], is_causal=0 if mask else 1,
                 scale=config.attn_scale or 1.0 / math.sqrt(head_dim), **capped)[0]  # (B, H, K, hd)
        y = g.op("Transpose", [y], perm=[0, 2, 1, 3])[0]  # (B, K, H, hd)
        y = g.op("Reshape", [y, g.const("tokens_q", np.array([-1, config.q_width], dtype=np.int64))])[0]  # (B*K, H*hd)
        y = g.op("Gather", [y, contract.UNPACK_INDEX], axis=0)[0]  # (T, H*hd): back to the packed order
        return g.op("Unsqueeze", [y, g.const("first_axis", np.array([0], dtype=np.int64))], [f"h.{i}.attn"])[0]

    g = graph_body.transformer(config, weights, attend, forms, sink, nbits)
    if residuals is not None:  # the residual stream after each layer, (1, T, D) packed (append_layers.py cuts there)
        residuals.extend(g.residuals)
    past_values, outputs = gqa_graph.cache_values(config)
    batch, width = contract.BATCH, "row_tokens"
    inputs = [
        *gqa_graph.token_inputs(),
        helper.make_tensor_value_info(contract.WRITE_INDEX, TensorProto.INT64, [batch]),
        helper.make_tensor_value_info(contract.PACK_INDEX, TensorProto.INT64, [batch, width]),
        helper.make_tensor_value_info(contract.UNPACK_INDEX, TensorProto.INT64, [contract.SEQUENCE]),
        gqa_graph.logits_index_input(),
        *past_values,
    ]
    return graph_body.model(g, "gptport_multi_row_append", inputs, outputs, {"": OPSET, "com.microsoft": 1})
