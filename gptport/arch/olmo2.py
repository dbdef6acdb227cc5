"""OLMo 2 (Olmo2ForCausalLM; llama.cpp's `olmo2`): Llama's layers with the norms moved after the sublayers, x +
norm(attn(x)), then x + norm(mlp(x)) (ModelConfig's post_norms without pre_norms), and a q/k norm over all heads
of q and of k together, before the head split (qk_norm_span "all": one RMSNorm q_width wide, one kv_width wide).
q, k, v and o biases together under attention_bias. llama.cpp's `olmo2` has the same tensors (q/k rows in halves
order) but no biases and always an output tensor; its OLMo 3 window (attention.sliding_window) is refused as a key
gptport does not read. Everything else is base.py's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gptport.arch.base import GGUF_LAYOUT, HF_LAYOUT, Family, Specials
from gptport.config import ModelConfig

HF = replace(HF_LAYOUT, modules={**HF_LAYOUT.modules, "ln_1_post": "post_attention_layernorm",
                                 "ln_2_post": "post_feedforward_layernorm"})
GGUF = replace(GGUF_LAYOUT, modules={**GGUF_LAYOUT.modules, "ln_1_post": "post_attention_norm",
                                     "ln_2_post": "post_ffw_norm"})


def claims(cfg: ModelConfig) -> bool:
    """Whether `cfg` is OLMo 2's (export-hf's pick): no pre-norms, or a q/k norm over all heads."""
    return not cfg.pre_norms or (cfg.qk_norm and cfg.qk_norm_span == "all")


def mismatches(cfg: ModelConfig) -> list[str]:
    """What keeps a gptport model from transformers' Olmo2ForCausalLM (empty when it computes it)."""
    wants = (("mlp", "swiglu"), ("norm", "rmsnorm"), ("pos_encoding", "rope"), ("qk_norm", True),
             ("qk_norm_span", "all"), ("post_norms", True), ("pre_norms", False), ("mlp_bias", False),
             ("embed_scale", 1.0), ("attn_scale", 0.0), ("residual_scale", 1.0), ("logits_divisor", 1.0),
             ("attn_softcap", 0.0), ("final_softcap", 0.0))
    out = [f"{name} is {getattr(cfg, name)!r} (OLMo 2's is {want!r})" for name, want in wants
           if getattr(cfg, name) != want]
    if cfg.q_width != cfg.d_model:
        out.append(f"heads {cfg.q_width} wide over d_model {cfg.d_model} (OLMo 2's are d_model wide)")
    if cfg.has_qkv_bias != cfg.has_out_bias:
        out.append("q/k/v biases without an output bias (OLMo 2's attention_bias sets all four)")
    if cfg.sliding_window and cfg.window_layers:
        out.append(f"a sliding window of {cfg.sliding_window} (OLMo 2 has none)")
    return out


def gguf_mismatches(cfg: ModelConfig) -> list[str]:
    """What keeps a gptport model from llama.cpp's olmo2 (empty when it computes it)."""
    out = mismatches(cfg)
    if cfg.tie_embeddings:
        out.append("a tied head (llama.cpp's olmo2 reads the head from an output tensor of its own)")
    if cfg.has_qkv_bias or cfg.has_out_bias:
        out.append("attention biases (llama.cpp's olmo2 has no output bias)")
    return out


@dataclass(frozen=True)
class Olmo2(Family):
    def gguf_values(self, f: Any, values: dict[str, Any]) -> dict[str, Any]:
        """OLMo 2's norms: after the sublayers only, q and k normalised over all heads."""
        return {**values, "pre_norms": False, "post_norms": True, "qk_norm": True, "qk_norm_span": "all"}

    def model_config(self, hf: Mapping[str, Any], vocab_size: int, tokens: Specials, where: Path) -> ModelConfig:
        cfg = super().model_config(hf, vocab_size, tokens, where)
        return replace(cfg, pre_norms=False, post_norms=True, qk_norm=True, qk_norm_span="all")

    def hf_extra(self, cfg: ModelConfig) -> dict[str, Any]:
        return {"attention_bias": cfg.has_qkv_bias}


OLMO2 = Olmo2("olmo2", "Olmo2ForCausalLM", "olmo2", frozenset({"attention_bias"}), hf_layout=HF, gguf_layout=GGUF)
FAMILIES = (OLMO2,)
