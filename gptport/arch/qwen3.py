"""Qwen3 (Qwen3ForCausalLM): RMSNorm on each head's q and k before the rotation, heads 128 wide unless head_dim
says otherwise (so n_head * head_dim may differ from hidden_size), q, k, v and o biases together under
attention_bias; llama.cpp's `qwen3` keeps q and k rows in halves order. Everything else is base.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gptport.arch import hf_window
from gptport.arch.base import Family
from gptport.arch.qwen2 import WINDOW_KEYS
from gptport.config import ModelConfig


@dataclass(frozen=True)
class Qwen3(Family):
    def hf_extra(self, cfg: ModelConfig) -> dict[str, Any]:
        return {"head_dim": cfg.head_dim, "attention_bias": cfg.has_qkv_bias, **hf_window.written(cfg)}


QWEN3 = Qwen3("qwen3", "Qwen3ForCausalLM", "qwen3", WINDOW_KEYS | {"attention_bias", "head_dim"}, qk_norm=True,
              head_dim=128)
FAMILIES = (QWEN3,)
