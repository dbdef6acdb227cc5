"""Phi-3, Phi-3.5 and Phi-4-mini (Phi3ForCausalLM): the Llama family's decoder with q|k|v fused in one qkv_proj
(gptport's c_attn as it is) and the gate and up projections in one gate_up_proj (the gate's rows, then up's: two
row blocks of one source, RowsOf), no biases, rope over the first partial_rotary_factor of each head (Phi-4-mini:
0.75) with LongRoPE's short and long factors ("longrope", Phi-3's "su"). Its sliding_window is taken only where it
covers the whole context (gptport's attention has no window yet: a shorter one is refused by name). The dropout
keys change nothing at inference. Everything else is base.py's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gptport.arch.base import HF_LAYOUT, Family, RowsOf, Specials, number
from gptport.config import ModelConfig
from gptport.errors import InputError

HF_LAYOUT_PHI3 = replace(HF_LAYOUT, modules={
    **HF_LAYOUT.modules, "attn.c_attn": "self_attn.qkv_proj", "mlp.c_gate": RowsOf("mlp.gate_up_proj", 0, 2),
    "mlp.c_fc": RowsOf("mlp.gate_up_proj", 1, 2)})
KEYS = frozenset({"resid_pdrop", "embd_pdrop", "original_max_position_embeddings", "partial_rotary_factor",
                  "sliding_window"})


def refuse_window(hf: Mapping[str, Any], where: Path, key: str = "sliding_window") -> int:
    """max_position_embeddings, with a sliding window refused unless it covers it (a window shorter than the
    context is no full attention, and gptport's has no window yet)."""
    n_ctx = number(hf, "max_position_embeddings", where)
    window = hf.get(key)
    if window is not None and number(hf, key, where, positive=True) < n_ctx:
        raise InputError(f"{where}: {key} {window} is shorter than max_position_embeddings {n_ctx}; gptport's "
                         "attention has no sliding window (refusing rather than computing full attention)")
    return n_ctx


@dataclass(frozen=True)
class Phi3(Family):
    def _n_ctx(self, hf: Mapping[str, Any], where: Path) -> int:
        return refuse_window(hf, where)

    def model_config(self, hf: Mapping[str, Any], vocab_size: int, tokens: Specials, where: Path) -> ModelConfig:
        if hf.get("attention_bias") or hf.get("mlp_bias"):  # Phi3's layers have none (nor read these keys)
            raise InputError(f"{where}: Phi3ForCausalLM has no biases")
        return super().model_config(hf, vocab_size, tokens, where)

    def hf_extra(self, cfg: ModelConfig) -> dict[str, Any]:
        partial = cfg.rotary_width / cfg.head_dim
        if int(cfg.head_dim * partial) != cfg.rotary_width:  # what transformers will compute back
            raise InputError(f"rotary_dim {cfg.rotary_width} is no partial_rotary_factor of head_dim {cfg.head_dim}")
        extra: dict[str, Any] = {"partial_rotary_factor": partial, "sliding_window": None, "resid_pdrop": 0.0,
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
        ("layers without rope", bool(cfg.no_rope_layers))) if bad]
    return out


PHI3 = Phi3("phi3", "Phi3ForCausalLM", None, KEYS, hf_layout=HF_LAYOUT_PHI3, partial_rope=True)
FAMILIES = (PHI3,)
