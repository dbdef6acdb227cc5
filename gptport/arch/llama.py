"""Llama (LlamaForCausalLM: q, k, v and o biases together under attention_bias, MLP biases under mlp_bias, Llama 3's
rope scaling, which llama.cpp's `llama` architecture takes as the frequency factors of rope_freqs.weight, its q and
k rows permuted to interleaved pairs) and Mistral (MistralForCausalLM: no biases, a sliding window on every layer
unless sliding_window is null; llama.cpp's converter writes it as `llama`, which has no window). Everything else is
base.py's."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gptport.arch.base import GGUF_LAYOUT, Family
from gptport.config import ModelConfig


@dataclass(frozen=True)
class Llama(Family):
    def hf_extra(self, cfg: ModelConfig) -> dict[str, Any]:
        return {"head_dim": cfg.head_dim, "attention_bias": cfg.has_qkv_bias, "mlp_bias": cfg.has_mlp_bias}


@dataclass(frozen=True)
class Mistral(Family):
    def hf_extra(self, cfg: ModelConfig) -> dict[str, Any]:
        return {"head_dim": cfg.head_dim, "sliding_window": cfg.sliding_window or None}  # on every layer


LLAMA = Llama("llama", "LlamaForCausalLM", "llama", frozenset({"attention_bias", "mlp_bias", "head_dim"}),
              gguf_layout=replace(GGUF_LAYOUT, permuted=True), rope_freqs=True)
MISTRAL = Mistral("mistral", "MistralForCausalLM", None, frozenset({"head_dim", "sliding_window"}), windowed=True)
FAMILIES = (LLAMA, MISTRAL)
