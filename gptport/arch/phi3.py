"""Phi-3, Phi-3.5 and Phi-4-mini (Phi3ForCausalLM): the Llama family's decoder with q|k|v fused in one qkv_proj
(gptport's c_attn as it is) and the gate and up projections in one gate_up_proj (the gate's rows, then up's: two row
blocks of one source, RowsOf), no biases, rope over the first partial_rotary_factor of each head (Phi-4-mini: 0.75)
with LongRoPE's short and long factors ("longrope", Phi-3's "su"). Its sliding_window (Phi-3-mini-4k's 2047) is a
window on every layer, as transformers 5.24 applies it (query q sees keys q - window < k <= q: hf_window.py; null:
none); export-hf writes it back. The dropout keys change nothing at inference. llama.cpp's `phi3` holds q|k|v as
attn_qkv and gate|up as ffn_up, the rotary width as rope.dimension_count, LongRoPE's factors as the tensors
rope_factors_short/long and its attention factor as rope.scaling.attn_factor; it picks the long factors by the
context it is run with (-c above the original context: every position), not by a sequence's length as transformers
and gptport do (gguf_note), and disables Phi-3's sliding window (an export with one is refused). Everything else is
base.py's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from gptport.arch.base import GGUF_KEYS, GGUF_LAYOUT, HF_LAYOUT, Family, RowsOf, Specials
from gptport.config import ModelConfig
from gptport.errors import InputError

HF_LAYOUT_PHI3 = replace(HF_LAYOUT, modules={
    **HF_LAYOUT.modules, "attn.c_attn": "self_attn.qkv_proj", "mlp.c_gate": RowsOf("mlp.gate_up_proj", 0, 2),
    "mlp.c_fc": RowsOf("mlp.gate_up_proj", 1, 2)})
GGUF_LAYOUT_PHI3 = replace(GGUF_LAYOUT, modules={
    **GGUF_LAYOUT.modules, "attn.c_attn": "attn_qkv", "mlp.c_gate": RowsOf("ffn_up", 0, 2),
    "mlp.c_fc": RowsOf("ffn_up", 1, 2)})
FACTORS = {"rope_short_factor": "rope_factors_short.weight", "rope_long_factor": "rope_factors_long.weight"}
GGUF_KEYS_PHI3 = GGUF_KEYS | {"rope.scaling.attn_factor", "attention.sliding_window"}
KEYS = frozenset({"resid_pdrop", "embd_pdrop", "original_max_position_embeddings", "partial_rotary_factor",
                  "sliding_window"})


def gguf_mismatches(cfg: ModelConfig) -> list[str]:
    """What keeps a gptport model from llama.cpp's phi3 (empty when it computes it, the LongRoPE choice aside:
    gguf_note)."""
    out = mismatches(cfg)
    if cfg.attn_scale:
        out.append(f"softmax scale {cfg.attn_scale:g} (llama.cpp's phi3 takes 1/sqrt(head_dim))")
    if cfg.sliding_window and cfg.window_layers:
        out.append(f"a sliding window of {cfg.sliding_window} (llama.cpp's phi3 disables Phi-3's window and attends "
                   "to every position)")
    wants = (("mlp", "swiglu"), ("norm", "rmsnorm"), ("pre_norms", True), ("post_norms", False), ("embed_scale", 1.0),
             ("residual_scale", 1.0), ("logits_divisor", 1.0), ("attn_softcap", 0.0), ("final_softcap", 0.0))
    return out + [f"{name} is {getattr(cfg, name)!r} (Phi-3's is {want!r})" for name, want in wants
                  if getattr(cfg, name) != want]


def gguf_note(cfg: ModelConfig) -> str:
    """When llama.cpp's phi3 computes what gptport does ('' where always)."""
    if cfg.rope_scaling != "longrope":
        return ""
    n = cfg.rope_original_n_ctx
    return (f"LongRoPE: llama.cpp computes what gptport does when run with a context (-c, which it rounds up to a "
            f"multiple of 256) of at most {n} tokens (the short factors at every position); above {n} it takes the "
            f"long factors at every position, which gptport takes only once a sequence is longer than {n} tokens")


@dataclass(frozen=True)
class Phi3(Family):
    def gguf_values(self, f: Any, values: dict[str, Any]) -> dict[str, Any]:
        """The rotary width, LongRoPE (both factor tensors, each value the shortest decimal of its float32, the
        attention factor, the original context) and
        Phi-3's window (llama.cpp disables it; gptport computes it, as transformers does, on every layer)."""
        p, head_dim = f"{self.gguf_arch}.", values["head_dim"]
        rotary = f.integer(p + "rope.dimension_count", head_dim)
        out = {**values, "rotary_dim": 0 if rotary == head_dim else rotary}
        present = [name for name in FACTORS.values() if name in f.tensors]
        if present:
            if len(present) == 1:
                raise InputError(f"{f.path}: {present[0]} without its pair ({', '.join(FACTORS.values())})")
            if values.get("rope_scaling", "none") != "none":
                raise InputError(f"{f.path}: LongRoPE's factor tensors with {p}rope.scaling.type linear")
            out.update({ours: tuple(float(str(x)) for x in np.asarray(f.dequantize(name), dtype=np.float32))
                        for ours, name in FACTORS.items()},
                       rope_scaling="longrope", rope_attention_factor=f.number(p + "rope.scaling.attn_factor", 1.0),
                       rope_original_n_ctx=f.integer(p + "rope.scaling.original_context_length", values["n_ctx"]))
        elif f.number(p + "rope.scaling.attn_factor", 1.0) != 1.0:
            raise InputError(f"{f.path}: {p}rope.scaling.attn_factor {f.number(p + 'rope.scaling.attn_factor')} "
                             "without LongRoPE's factor tensors, which gptport does not compute")
        window = f.integer(p + "attention.sliding_window", 0)
        if 0 < window < values["n_ctx"]:
            out.update(sliding_window=window, window_layers=tuple(range(values["n_layer"])))
        return out

    def gguf_write(self, writer: Any, cfg: ModelConfig) -> None:
        """LongRoPE's attention factor and original context (its factors are tensors: gguf_llama.tensors)."""
        if cfg.rope_scaling == "longrope":
            writer.add_rope_scaling_orig_ctx_len(cfg.rope_original_n_ctx)
            writer.add_rope_scaling_attn_factors(cfg.rope_attention_factor)

    def model_config(self, hf: Mapping[str, Any], vocab_size: int, tokens: Specials, where: Path) -> ModelConfig:
        if hf.get("attention_bias") or hf.get("mlp_bias"):  # Phi3's layers have none (nor read these keys)
            raise InputError(f"{where}: Phi3ForCausalLM has no biases")
        return super().model_config(hf, vocab_size, tokens, where)

    def hf_extra(self, cfg: ModelConfig) -> dict[str, Any]:
        partial = cfg.rotary_width / cfg.head_dim
        if int(cfg.head_dim * partial) != cfg.rotary_width:  # what transformers will compute back
            raise InputError(f"rotary_dim {cfg.rotary_width} is no partial_rotary_factor of head_dim {cfg.head_dim}")
        extra: dict[str, Any] = {"partial_rotary_factor": partial, "resid_pdrop": 0.0,
                                 "sliding_window": cfg.sliding_window if cfg.window_layers else None,  # every layer's
                                 "embd_pdrop": 0.0, "pad_token_id": None}
        if cfg.rope_scaling == "longrope":
            extra["original_max_position_embeddings"] = cfg.rope_original_n_ctx
        return extra


def mismatches(cfg: ModelConfig) -> list[str]:
    """What keeps a gptport model from being a Phi3ForCausalLM (empty when it is one)."""
    out = [what for what, bad in (
        ("biases", cfg.has_qkv_bias or cfg.has_out_bias or cfg.has_mlp_bias), ("q/k norm", cfg.qk_norm),
        (f"head_dim {cfg.head_dim} is not d_model / n_head", cfg.head_dim * cfg.n_head != cfg.d_model),
        (f"rope scaling {cfg.rope_scaling!r}", cfg.rope_scaling not in ("none", "longrope")),
        ("layers without rope", bool(cfg.no_rope_layers)),
        (f"a sliding window on layers {', '.join(map(str, cfg.window_layers))} of {cfg.n_layer} (Phi-3's is on every "
         "layer)", bool(cfg.sliding_window and cfg.window_layers) and len(cfg.window_layers) != cfg.n_layer)) if bad]
    return out


PHI3 = Phi3("phi3", "Phi3ForCausalLM", "phi3", KEYS, hf_layout=HF_LAYOUT_PHI3, gguf_layout=GGUF_LAYOUT_PHI3,
            gguf_keys=frozenset(GGUF_KEYS_PHI3), partial_rope=True, gguf_side=frozenset(FACTORS.values()),
            windowed=True)
FAMILIES = (PHI3,)
