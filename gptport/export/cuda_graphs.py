"""The static-cache graphs the CUDA provider decodes with, built from the weights like their CPU twins:

- the one-token decode graph (model.decode.onnx, fp32): per layer, TensorScatter writes the new key and
  value of each row at its own length (`seqlens_k`) into the preallocated buffer, in place when the
  buffer is bound as both past and present, and opset-24 Attention attends each row's one new query to
  its first seqlens_k + 1 positions (`nonpad_kv_seqlen`: no causal mask needed for one query). Every
  shape is fixed for a batch size (the whole buffer is read), so onnxruntime can capture it in a CUDA
  graph and replay it; GroupQueryAttention, the CPU's decode operator, takes float16 only on CUDA.
  Its inputs are the static-cache graph's (gqa_graph.py) without total_sequence_length: the runtime
  steps it with the same code.
- the fp16 static-cache graph (model.fp16.static.onnx): gqa_graph's graph converted to float16 (weights
  and cache; norms, softmax and logits stay float32), GroupQueryAttention as CUDA runs it.

Both write each residual sum and the norm after it as one SkipLayerNormalization (or, for RMSNorm,
SkipSimplifiedLayerNormalization) with the projection's bias folded in (CUDA_FORMS): on CUDA one kernel
where the CPU's graphs launch three, each a few microseconds at batch 1 (benchmarks/gpu/decode_profile.py).

A decode graph takes no prompt: prefills go through the multi-row append graph (scatter_graph.py) over
the same buffers. No torch here.

I/O of the decode graph, B = rows, C = the buffer's capacity:
    input_ids (B, 1) int64, position_ids (B, 1) int64,
    seqlens_k (B,) int32: each row's length before this token (where it is written),
    logits_index (B, 1) int64: zeros,
    past_key_values.{i}.key/.value (B, Hkv, C, hd) -> present.{i}.key/.value, the same buffer,
    -> logits (B, 1, V).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from gptport import contract
from gptport.config import ModelConfig
from gptport.errors import UsageError
from gptport.export import gqa_graph, graph_body, rope_graph
from gptport.export.graph_body import Builder, Forms, Qkv

OPSET = 24  # TensorScatter, and Attention with nonpad_kv_seqlen
CUDA_FORMS = Forms(rms="skip", layer="skip")  # the residual, its bias and the norm in one node


def unchecked(config: ModelConfig) -> str:
    """The attention choices the CUDA graphs do not compute yet, or not measured on a GPU ("" when none): the
    decode graph's attention is its own, and CUDA's GroupQueryAttention window was never run against torch."""
    named = [what for what, used in ((f"a sliding window of {config.sliding_window}", bool(config.window_layers)
                                      and config.sliding_window > 0),
                                     ("a local RoPE base", config.rope_local_theta > 0),
                                     (f"softmax scale {config.attn_scale:g}", config.attn_scale != 0),
                                     (f"attention soft-capping at {config.attn_softcap:g}", config.attn_softcap > 0)
                                     ) if used]
    return f"{', '.join(named)}: the CUDA graphs do not compute it yet" if named else ""


def unsupported(config: ModelConfig) -> str:
    """Why this config cannot have the decode graph ("" when it can): the static-cache graphs' limits, and
    Attention-24's CUDA kernel, which reads nonpad_kv_seqlen only where every query head has its own kv head."""
    reason = gqa_graph.unsupported(config)
    if reason:
        return reason
    reason = unchecked(config)
    if reason:
        return reason
    if rope_graph.outside(config):
        return "partial rotary, LongRoPE or layers without rope: the decode graph rotates by RotaryEmbedding only"
    if config.n_kv_head != config.n_head:
        return (f"{config.n_kv_head} key/value heads for {config.n_head} query heads: onnxruntime's CUDA Attention "
                "takes nonpad_kv_seqlen without grouped heads only")
    return ""


def _i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def build_decode(config: ModelConfig, weights: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """The one-token decode graph of a model with this config and these weights (model.safetensors as
    numpy, gptport's names); refused, naming why, for a config it cannot have (unsupported)."""
    reason = unsupported(config)
    if reason:
        raise UsageError(f"no decode graph: {reason}")
    n_layer, hd = config.n_layer, config.head_dim
    pasts, presents = contract.past_names(n_layer), contract.present_names(n_layer)
    made: dict[str, str] = {}  # what every layer shares, made at the first

    def shared(g: Builder) -> tuple[str, str]:  # (B,) int64 each: where each row writes, and its valid length
        if not made:
            made["write"] = g.op("Cast", [contract.SEQLENS_K], to=TensorProto.INT64)[0]
            made["valid"] = g.op("Add", [made["write"], g.const("one", _i64(1))])[0]
        return made["write"], made["valid"]

    def rotate(g: Builder, x: str, heads: int) -> str:  # (B, 1, heads*hd) at each row's position
        if "cos" not in made:
            cos, sin = rope_graph.rope_tables(config)  # (C, hd/2) each
            made["cos"], made["sin"] = g.const("rope.cos", cos), g.const("rope.sin", sin)
        return g.op("RotaryEmbedding", [x, made["cos"], made["sin"], contract.POSITION_IDS], num_heads=heads,
                    interleaved=0)[0]

    def heads(g: Builder, x: str, n: int) -> str:  # (B, 1, n*hd) -> (B, n, 1, hd): one token, so no transpose
        return g.op("Reshape", [x, g.const(f"heads_{n}", _i64(0, n, 1, hd))])[0]

    def attend(g: Builder, i: int, qkv: Qkv) -> str:
        q, k, v = g.parts(qkv)  # (B, 1, H*hd), (B, 1, Hkv*hd) twice
        if config.pos_encoding == "rope":
            q, k = rotate(g, q, config.n_head), rotate(g, k, config.n_kv_head)
        write, valid = shared(g)
        key = g.op("TensorScatter", [pasts[2 * i], heads(g, k, config.n_kv_head), write], [presents[2 * i]],
                   axis=2)[0]  # (B, Hkv, C, hd): the same buffer when bound so
        value = g.op("TensorScatter", [pasts[2 * i + 1], heads(g, v, config.n_kv_head), write],
                     [presents[2 * i + 1]], axis=2)[0]
        y = g.op("Attention", [heads(g, q, config.n_head), key, value, "", "", "", valid],
                 scale=1.0 / math.sqrt(hd))[0]  # (B, H, 1, hd): each row reads its first seqlens_k + 1 positions
        return g.op("Reshape", [y, g.const("tokens_q", _i64(0, 1, config.q_width))], [f"h.{i}.attn"])[0]

    g = graph_body.transformer(config, weights, attend, CUDA_FORMS)
    past_values, outputs = gqa_graph.cache_values(config)
    batch = contract.BATCH
    inputs = [
        helper.make_tensor_value_info(contract.INPUT_IDS, TensorProto.INT64, [batch, 1]),
        helper.make_tensor_value_info(contract.POSITION_IDS, TensorProto.INT64, [batch, 1]),
        helper.make_tensor_value_info(contract.SEQLENS_K, TensorProto.INT32, [batch]),
        helper.make_tensor_value_info(contract.LOGITS_INDEX, TensorProto.INT64, [batch, 1]),
        *past_values,
    ]
    return graph_body.model(g, "gptport_decode", inputs, outputs, {"": OPSET, "com.microsoft": 1})


def fp16_static(config: ModelConfig, weights: Mapping[str, np.ndarray], dst: Path) -> None:
    """The fp16 static-cache graph of a model with this config and these weights at `dst`: gqa_graph's graph
    in CUDA_FORMS converted to float16 (weights, cache and every operator, GroupQueryAttention in float16);
    the logits stay float32. The norms are not kept in float32 as in the fp16 contract graph
    (contract_graph's `half`): onnxruntime's kernels accumulate their statistics in float32 either way, and the
    converter gives a kept node's weights of this graph float16 types (onnxruntime refuses the mixed node)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    half = convert_float_to_float16(gqa_graph.build(config, weights, CUDA_FORMS), keep_io_types=[contract.LOGITS],
                                    disable_shape_infer=True)
    onnx.save_model(half, str(dst))
