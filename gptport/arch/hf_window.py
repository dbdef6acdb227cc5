"""config.json's sliding window read into ModelConfig's (split from base.py) and written back: Mistral's on every
layer (unless sliding_window is null), Qwen2's and Qwen3's only with use_sliding_window, on layer_types' sliding
layers, else on those from max_window_layers on, as transformers reads them. No torch."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gptport.arch.values import number
from gptport.config import ModelConfig
from gptport.errors import InputError


def read(hf: Mapping[str, Any], n_layer: int, n_ctx: int, where: Path, every_layer: bool) -> dict[str, Any]:
    """ModelConfig's sliding_window and window_layers (`every_layer`: Mistral's, in effect without
    use_sliding_window); none where the window covers the whole context (no key is ever older than it: full
    attention computes the same)."""
    if not (every_layer or hf.get("use_sliding_window")) or hf.get("sliding_window") is None:
        return {}
    window = number(hf, "sliding_window", where, positive=True)
    types = hf.get("layer_types")
    if every_layer:
        layers = tuple(range(n_layer))
    elif types is not None:
        if not isinstance(types, list) or len(types) != n_layer:
            raise InputError(f"{where}: layer_types must list the {n_layer} layers' types")
        layers = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    else:
        start = number(hf, "max_window_layers", where, 28)  # transformers' Qwen2Config default
        if start < 0:
            raise InputError(f"{where}: max_window_layers must be 0 or more, not {start}")
        layers = tuple(range(start, n_layer))
    if window >= n_ctx or not layers:
        return {}
    return {"sliding_window": window, "window_layers": layers}


def written(cfg: ModelConfig) -> dict[str, Any]:
    """config.json's window keys as Qwen2 and Qwen3 read them (read gives back the same window)."""
    if not (cfg.sliding_window and cfg.window_layers):
        return {"use_sliding_window": False, "sliding_window": None, "max_window_layers": cfg.n_layer}
    suffix = cfg.window_layers == tuple(range(cfg.window_layers[0], cfg.n_layer))
    return {"use_sliding_window": True, "sliding_window": cfg.sliding_window,
            "max_window_layers": cfg.window_layers[0] if suffix else cfg.n_layer,
            "layer_types": ["sliding_attention" if cfg.windowed(i) else "full_attention" for i in range(cfg.n_layer)]}
