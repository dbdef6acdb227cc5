"""Qwen2 (Qwen2ForCausalLM): q, k and v always biased (o and the MLP never), a sliding window only where
use_sliding_window says (on layer_types' sliding layers, else from max_window_layers on); llama.cpp's `qwen2`
keeps q and k rows in halves order, as gptport rotates them, and applies no rope_freqs (nor a window).
Everything else is base.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gptport.arch import hf_window
from gptport.arch.base import Family
from gptport.config import ModelConfig

WINDOW_KEYS = frozenset({"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"})


@dataclass(frozen=True)
class Qwen2(Family):
    def hf_extra(self, cfg: ModelConfig) -> dict[str, Any]:
        return hf_window.written(cfg)


QWEN2 = Qwen2("qwen2", "Qwen2ForCausalLM", "qwen2", WINDOW_KEYS | {"use_mrope"}, qkv_bias=True)
FAMILIES = (QWEN2,)
