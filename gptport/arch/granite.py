"""Granite (GraniteForCausalLM; llama.cpp's `granite`): Llama's layers with four multipliers, each where
transformers applies it: the embeddings times embedding_multiplier (ModelConfig.embed_scale), the scores times
attention_multiplier in place of 1/sqrt(head_dim) (attn_scale), each attention and MLP output times
residual_multiplier before its residual add (residual_scale), the logits divided by logits_scaling
(logits_divisor). q, k, v and o biases together under attention_bias, MLP biases under mlp_bias. llama.cpp's
`granite` holds them as logit_scale (required), residual_scale, embedding_scale and attention.scale (0 or absent:
none), q and k rows permuted as its `llama`'s, Llama 3's scaling as rope_freqs.weight, and rope switched off by a
false rope.scaling.finetuned (refused)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gptport.arch.base import GGUF_KEYS, GGUF_LAYOUT, Family, Specials, number, refused
from gptport.config import ModelConfig
from gptport.errors import InputError, UsageError

MULTIPLIERS = {"embed_scale": "embedding_multiplier", "attn_scale": "attention_multiplier",
               "residual_scale": "residual_multiplier", "logits_divisor": "logits_scaling"}  # ModelConfig's -> theirs
KEYS = frozenset({"attention_bias", "mlp_bias", *MULTIPLIERS.values()})
GGUF_SCALES = {"embed_scale": "embedding_scale", "attn_scale": "attention.scale", "residual_scale": "residual_scale",
               "logits_divisor": "logit_scale"}  # ModelConfig's -> llama.cpp's granite.* (0 or absent: none)


def claims(cfg: ModelConfig) -> bool:
    """Whether `cfg` is Granite's (export-hf's pick): a residual or logit multiplier, or a Llama model's layers
    with an embedding or attention multiplier."""
    llama_layers = cfg.mlp == "swiglu" and cfg.pre_norms and not cfg.post_norms
    return cfg.residual_scale != 1.0 or cfg.logits_divisor != 1.0 or (
        llama_layers and (cfg.embed_scale != 1.0 or cfg.attn_scale != 0.0))


def mismatches(cfg: ModelConfig) -> list[str]:
    """What keeps a gptport model from transformers' GraniteForCausalLM (empty when it computes it)."""
    wants = (("mlp", "swiglu"), ("norm", "rmsnorm"), ("pos_encoding", "rope"), ("qk_norm", False),
             ("post_norms", False), ("pre_norms", True), ("attn_softcap", 0.0), ("final_softcap", 0.0))
    out = [f"{name} is {getattr(cfg, name)!r} (Granite's is {want!r})" for name, want in wants
           if getattr(cfg, name) != want]
    if cfg.q_width != cfg.d_model:
        out.append(f"heads {cfg.q_width} wide over d_model {cfg.d_model} (Granite's are d_model wide)")
    if cfg.has_qkv_bias != cfg.has_out_bias:
        out.append("q/k/v biases without an output bias (Granite's attention_bias sets all four)")
    if cfg.sliding_window and cfg.window_layers:
        out.append(f"a sliding window of {cfg.sliding_window} (Granite has none)")
    return out


def gguf_mismatches(cfg: ModelConfig) -> list[str]:
    """What keeps a gptport model from llama.cpp's granite (empty when it computes it): Granite's choices (its
    heads d_model wide, rope over whole heads, as llama.cpp asserts)."""
    return mismatches(cfg)


@dataclass(frozen=True)
class Granite(Family):
    def gguf_values(self, f: Any, values: dict[str, Any]) -> dict[str, Any]:
        """llama.cpp's granite multipliers (a scale of 0 or absent is none, as llama.cpp reads it; logit_scale
        required); a false rope.scaling.finetuned (no rope at all) refused by name."""
        p = f"{self.gguf_arch}."
        if f.value(p + "rope.scaling.finetuned", True) is not True:
            raise InputError(f"{f.path}: {p}rope.scaling.finetuned is false, which switches llama.cpp's granite "
                             "rope off; gptport's Granite rotates every layer")
        read = {ours: f.number(p + key, 0.0) for ours, key in GGUF_SCALES.items() if ours != "logits_divisor"}
        return {**values, "embed_scale": read["embed_scale"] or 1.0, "attn_scale": read["attn_scale"],
                "residual_scale": read["residual_scale"] or 1.0, "logits_divisor": f.number(p + "logit_scale")}

    def gguf_write(self, writer: Any, cfg: ModelConfig) -> None:
        """The four multipliers (the softmax scale only where it is not 1/sqrt(head_dim))."""
        writer.add_logit_scale(cfg.logits_divisor)
        writer.add_residual_scale(cfg.residual_scale)
        writer.add_embedding_scale(cfg.embed_scale)
        if cfg.attn_scale:
            writer.add_attention_scale(cfg.attn_scale)

    def model_config(self, hf: Mapping[str, Any], vocab_size: int, tokens: Specials, where: Path) -> ModelConfig:
        cfg = super().model_config(hf, vocab_size, tokens, where)
        values = {ours: number(hf, theirs, where, 1.0, kind=float) for ours, theirs in MULTIPLIERS.items()}
        try:
            return replace(cfg, **values)
        except UsageError as e:  # a multiplier of 0, or not finite
            raise refused(e, MULTIPLIERS, where) from e

    def hf_extra(self, cfg: ModelConfig) -> dict[str, Any]:
        return {"attention_bias": cfg.has_qkv_bias, "mlp_bias": cfg.has_mlp_bias,
                "embedding_multiplier": cfg.embed_scale, "attention_multiplier": cfg.softmax_scale,
                "residual_multiplier": cfg.residual_scale, "logits_scaling": cfg.logits_divisor}


GRANITE = Granite("granite", "GraniteForCausalLM", "granite", KEYS, gguf_layout=replace(GGUF_LAYOUT, permuted=True),
                  gguf_keys=GGUF_KEYS | set(GGUF_SCALES.values()), rope_freqs=True)
FAMILIES = (GRANITE,)
