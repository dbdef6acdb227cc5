"""The contract graph (model.onnx and its variants: gptport/contract.py's I/O), written op by op from the weights
as the static-cache graphs are (graph_body.py), not traced: each weight read when its op is written and handed to
a sink (inline, or the graph's external data), so a model of any size is built in about one tensor's memory.

Its attention is onnx's own operators, which every runtime gptport targets runs (onnxruntime on each provider,
onnxruntime-web, OpenVINO): per layer, q, k and v split into heads, rope rotating q and k (rope_graph.py: cos and
sin of position_ids * the model's frequencies, the halves layout; partial, LongRoPE, layers without), the new keys
and values appended to the past by Concat (the present outputs), softmax(q k^T * scale + mask) v with the query
heads grouped over the kv head they share (a 5-D MatMul, no repeated keys). The mask is made once: bottom-right
causal, keys where attention_mask is 0 masked, each query seeing itself (training/model.py's attention_mask_4d),
added as 0 or float32's lowest; a window layer's once more, keys older than the window masked too (the cache keeps
them).

I/O, B = batch, S = new tokens, P = past tokens, T = P + S:
    input_ids (B, S) int64, attention_mask (B, T) int64, position_ids (B, S) int64,
    past_key_values.{i}.key/.value (B, Hkv, P, hd) -> logits (B, S, V), present.{i}.key/.value (B, Hkv, T, hd).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper

from gptport import contract
from gptport.config import ModelConfig
from gptport.export import graph_body
from gptport.export.graph_body import PORTABLE, Builder, Forms, Qkv
from gptport.export.graph_caps import softcap
from gptport.export.nbits import NBits
from gptport.export.rope_graph import Rotary
from gptport.export.tensor_sink import Sink

OPSET = 18  # what torch.export wrote before (and --opset's floor): Range, Where, Split with sizes as inputs


def _i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


class _Attention:
    """What every layer's attention shares (the mask, rope's cos and sin), made on the first layer's call."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self.masks: dict[int, str] = {}  # by window (0: none)
        self.rotary = Rotary(config)

    def __call__(self, g: Builder, i: int, qkv: Qkv) -> str:
        cfg = self.config
        H, Hkv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        q, k, v = g.parts(qkv)  # (B, S, H*hd), (B, S, Hkv*hd) twice
        q, k, v = (g.op("Reshape", [x, g.const(f"heads_{n}", _i64(0, 0, n, hd))])[0]
                   for x, n in ((q, H), (k, Hkv), (v, Hkv)))  # (B, S, n, hd)
        q, k = self.rotary.rotate(g, q, i), self.rotary.rotate(g, k, i)  # rope, but in a layer without it
        scale = cfg.attn_scale or 1 / math.sqrt(hd)
        q = g.op("Mul", [q, g.const("attn_scale", np.array(scale, np.float32))])[0]
        q, k, v = (g.op("Transpose", [x], perm=[0, 2, 1, 3])[0] for x in (q, k, v))  # (B, n, S, hd)
        pasts, presents = contract.past_names(cfg.n_layer), contract.present_names(cfg.n_layer)
        k = g.op("Concat", [pasts[2 * i], k], [presents[2 * i]], axis=2)[0]  # (B, Hkv, T, hd)
        v = g.op("Concat", [pasts[2 * i + 1], v], [presents[2 * i + 1]], axis=2)[0]  # (B, Hkv, T, hd)
        with g.float32():  # the mask, the scores and softmax in float32 (an fp16 graph's too)
            mask = self._mask(g, cfg.sliding_window if cfg.windowed(i) else 0)  # (B, 1, 1, S, T)
        if Hkv == H:
            scores = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])[0]])[0]  # (B, H, S, T)
            mask = g.op("Squeeze", [mask, g.const("axis_1", _i64(1))])[0]  # (B, 1, S, T)
        else:  # query heads h = j * G + g read kv head j: (B, Hkv, G, S, hd) against (B, Hkv, 1, T, hd)
            q = g.op("Reshape", [q, g.const("grouped", _i64(0, Hkv, H // Hkv, -1, hd))])[0]
            k, v = (g.op("Unsqueeze", [x, g.const("axis_2", _i64(2))])[0] for x in (k, v))
            scores = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 2, 4, 3])[0]])[0]  # (B, Hkv, G, S, T)
        with g.float32():
            probs = g.op("Softmax", [g.op("Add", [self._capped(g, g.widen(scores)), mask])[0]], axis=-1)[0]
        y = g.op("MatMul", [g.narrow(probs), v])[0]  # (B, H, S, hd), or grouped (B, Hkv, G, S, hd)
        if Hkv != H:
            y = g.op("Reshape", [y, g.const("ungrouped", _i64(0, H, -1, hd))])[0]  # (B, H, S, hd)
        y = g.op("Transpose", [y], perm=[0, 2, 1, 3])[0]  # (B, S, H, hd)
        return g.op("Reshape", [y, g.const("joined", _i64(0, 0, H * hd))])[0]  # (B, S, H*hd)

    def _capped(self, g: Builder, scores: str) -> str:
        """The scores (B, H, S, T), or grouped (B, Hkv, G, S, T), soft-capped before the mask where the model caps
        them (attn_softcap: Gemma 2's)."""
        cap = self.config.attn_softcap
        return softcap(g, scores, cap, "attn_softcap") if cap > 0 else scores

    def _mask(self, g: Builder, window: int) -> str:
        """(B, 1, 1, S, T) float32: 0 where a query may attend, float32's lowest elsewhere; with a `window`, only
        keys k with q - window < k (a window layer's)."""
        if window in self.masks:
            return self.masks[window]
        zero, one = g.const("zero", _i64(0)), g.const("one", _i64(1))
        total = g.op("Gather", [g.op("Shape", [contract.ATTENTION_MASK])[0], one], axis=0)[0]  # (1,) T
        new = g.op("Gather", [g.op("Shape", [contract.INPUT_IDS])[0], one], axis=0)[0]  # (1,) S
        keys = g.op("Range", [g.op("Squeeze", [zero])[0], g.op("Squeeze", [total])[0],
                              g.op("Squeeze", [one])[0]])[0]  # (T,)
        queries = g.op("Range", [g.op("Squeeze", [g.op("Sub", [total, new])[0]])[0], g.op("Squeeze", [total])[0],
                                 g.op("Squeeze", [one])[0]])[0]  # (S,) their positions P..T-1
        column = g.op("Unsqueeze", [queries, g.const("axis_1", _i64(1))])[0]  # (S, 1)
        causal = g.op("LessOrEqual", [keys, column])[0]  # (S, T)
        if window:  # and q - window < k
            start = g.op("Sub", [column, g.const(f"window_{window}", _i64(window))])[0]  # (S, 1)
            causal = g.op("And", [causal, g.op("Greater", [keys, start])[0]])[0]  # (S, T)
        itself = g.op("Equal", [keys, column])[0]  # (S, T)
        real = g.op("Cast", [contract.ATTENTION_MASK], to=TensorProto.BOOL)[0]  # (B, T)
        real = g.op("Unsqueeze", [real, g.const("axes_1_2_3", _i64(1, 2, 3))])[0]  # (B, 1, 1, 1, T)
        keep = g.op("Or", [g.op("And", [real, causal])[0], itself])[0]  # (B, 1, 1, S, T)
        lowest = g.const("lowest", np.array(np.finfo(np.float32).min, np.float32))
        self.masks[window] = g.op("Where", [keep, g.const("zero_f", np.array(0, np.float32)), lowest])[0]
        return self.masks[window]


def build(config: ModelConfig, weights: Mapping[str, np.ndarray], sink: Sink | None = None,
          nbits: NBits | None = None, forms: Forms = PORTABLE, opset: int = OPSET, residuals: list[str] | None = None,
          half: bool = False) -> onnx.ModelProto:
    """The contract graph of a model with this config and these weights (gptport's names, read as each op is
    written), its initializers handed to `sink` (default: inline), its MatMul weights quantized by `nbits` when
    given (MatMulNBits: onnxruntime's); `residuals`, if given, receives the names of the residual stream after
    each layer (what layer_check.py taps). `half`: the fp16 graph, weights, activations and cache float16, the
    norms, softmax and rope angles float32 (float16's range and precision fall short there), the logits float32."""
    g = graph_body.transformer(config, weights, _Attention(config), forms, sink, nbits, every_position=True,
                               half=half)
    if residuals is not None:
        residuals.extend(g.residuals)
    batch, seq, past, total = contract.BATCH, contract.SEQUENCE, contract.PAST, contract.TOTAL
    kv, cache = [config.n_kv_head, config.head_dim], TensorProto.FLOAT16 if half else TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(contract.INPUT_IDS, TensorProto.INT64, [batch, seq]),
              helper.make_tensor_value_info(contract.ATTENTION_MASK, TensorProto.INT64, [batch, total]),
              helper.make_tensor_value_info(contract.POSITION_IDS, TensorProto.INT64, [batch, seq]),
              *(helper.make_tensor_value_info(n, cache, [batch, kv[0], past, kv[1]])
                for n in contract.past_names(config.n_layer))]
    outputs = [helper.make_tensor_value_info(contract.LOGITS, TensorProto.FLOAT, [batch, seq, config.vocab_size]),
               *(helper.make_tensor_value_info(n, cache, [batch, kv[0], total, kv[1]])
                 for n in contract.present_names(config.n_layer))]
    opsets = {"": opset, **({"com.microsoft": 1} if nbits is not None or forms != PORTABLE else {})}
    return graph_body.model(g, "gptport", inputs, outputs, opsets)
