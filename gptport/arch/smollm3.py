"""SmolLM3 (SmolLM3ForCausalLM): the Llama family's decoder in which some layers do not rotate q and k. Its
config.json's no_rope_layers is one flag per layer, 1 where the layer USES rope and 0 where it does not (the name
says the opposite); without it, every no_rope_layer_interval-th layer (the 4th, 8th, ...) goes without. gptport's
no_rope_layers lists the indices of the layers without. Its sliding window is on layer_types' "sliding_attention"
layers (without the list: with use_sliding_window and a sliding_window, the layers without rope), as transformers
5.24 applies it (q - window < k <= q: hf_window.py); sliding layers without use_sliding_window are refused
(transformers' eager and sdpa attention apply the window there, its flash attention does not). llama.cpp's `smollm3`
has no key for the layers without rope: it skips rope on every 4th layer (3, 7, ...), so only that pattern is written
(others refused by name); its q and k rows are permuted as its `llama`'s. Everything else is base.py's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gptport.arch.base import GGUF_LAYOUT, Family, Specials, number
from gptport.config import ModelConfig
from gptport.errors import InputError

DEFAULT_THETA = 2000000.0
KEYS = frozenset({"attention_bias", "mlp_bias", "no_rope_layers", "no_rope_layer_interval", "use_sliding_window",
                  "sliding_window", "layer_types", "max_window_layers"})


def llama_cpp_no_rope(n_layer: int) -> tuple[int, ...]:
    """The layers llama.cpp's smollm3 does not rotate: every 4th (its n_no_rope_layer_step, fixed)."""
    return tuple(i for i in range(n_layer) if (i + 1) % 4 == 0)


def gguf_mismatches(cfg: ModelConfig) -> list[str]:
    """What keeps a gptport model from llama.cpp's smollm3 (empty when it computes it)."""
    out = []
    if cfg.no_rope_layers != llama_cpp_no_rope(cfg.n_layer):
        out.append(f"layers without rope {list(cfg.no_rope_layers)} (llama.cpp's smollm3 skips rope on every 4th "
                   f"layer: {list(llama_cpp_no_rope(cfg.n_layer))})")
    if cfg.sliding_window and cfg.window_layers:
        out.append(f"a sliding window of {cfg.sliding_window} (llama.cpp's smollm3 attends to every position)")
    if cfg.has_out_bias or cfg.has_mlp_bias or cfg.has_qkv_bias:
        out.append("biases (llama.cpp's smollm3 has neither an output nor MLP biases)")
    if cfg.rotary_width != cfg.head_dim or cfg.rope_scaling not in ("none", "linear"):
        out.append(f"rope over {cfg.rotary_width} of {cfg.head_dim} or rope scaling {cfg.rope_scaling!r} "
                   "(llama.cpp's smollm3 rotates whole heads, without frequency factors)")
    wants = (("mlp", "swiglu"), ("norm", "rmsnorm"), ("qk_norm", False), ("pre_norms", True), ("post_norms", False),
             ("embed_scale", 1.0), ("attn_scale", 0.0), ("residual_scale", 1.0), ("logits_divisor", 1.0),
             ("attn_softcap", 0.0), ("final_softcap", 0.0))
    return out + [f"{name} is {getattr(cfg, name)!r} (SmolLM3's is {want!r})" for name, want in wants
                  if getattr(cfg, name) != want]


@dataclass(frozen=True)
class SmolLM3(Family):
    def gguf_values(self, f: Any, values: dict[str, Any]) -> dict[str, Any]:
        return {**values, "no_rope_layers": llama_cpp_no_rope(values["n_layer"])}

    def model_config(self, hf: Mapping[str, Any], vocab_size: int, tokens: Specials, where: Path) -> ModelConfig:
        params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        if "rope_theta" not in hf and not (isinstance(params, dict) and "rope_theta" in params):
            hf = {**hf, "rope_theta": DEFAULT_THETA}  # SmolLM3Config's default_theta
        return super().model_config(window_keys(hf, self.layer_choices(hf, where)["no_rope_layers"], where),
                                    vocab_size, tokens, where)

    def layer_choices(self, hf: Mapping[str, Any], where: Path) -> dict[str, Any]:
        n_layer = number(hf, "num_hidden_layers", where, positive=True)
        flags = hf.get("no_rope_layers")
        if flags is None:  # SmolLM3Config's default
            interval = number(hf, "no_rope_layer_interval", where, 4, positive=True)
            flags = [int((i + 1) % interval != 0) for i in range(n_layer)]
        if not isinstance(flags, list) or len(flags) != n_layer or any(f not in (0, 1) or isinstance(f, float)
                                                                       for f in flags):
            raise InputError(f"{where}: no_rope_layers must be {n_layer} flags of 0 or 1 (1: the layer uses rope), "
                             f"not {flags!r:.60}")
        return {"no_rope_layers": tuple(i for i, uses in enumerate(flags) if not uses)}

    def hf_extra(self, cfg: ModelConfig) -> dict[str, Any]:
        uses = [int(i not in cfg.no_rope_layers) for i in range(cfg.n_layer)]  # 1: the layer uses rope
        window = bool(cfg.sliding_window and cfg.window_layers)
        return {"attention_bias": cfg.has_qkv_bias, "mlp_bias": cfg.has_mlp_bias, "use_sliding_window": window,
                "sliding_window": cfg.sliding_window if window else None, "no_rope_layers": uses,
                "layer_types": ["sliding_attention" if cfg.windowed(i) else "full_attention"
                                for i in range(cfg.n_layer)],
                "pad_token_id": None}  # SmolLM3Config's default 128004 is no id of a smaller vocabulary


def window_keys(hf: Mapping[str, Any], no_rope: tuple[int, ...], where: Path) -> dict[str, Any]:
    """config.json with layer_types as SmolLM3Config fills it in (the layers without rope slide, given
    use_sliding_window and a sliding_window), for hf_window.read; sliding layers transformers' attention
    implementations disagree on, or without a window, refused."""
    types = hf.get("layer_types")
    if types is None:
        slide = bool(hf.get("use_sliding_window")) and hf.get("sliding_window") is not None
        return {**hf, "layer_types": ["sliding_attention" if slide and i in no_rope else "full_attention"
                                      for i in range(number(hf, "num_hidden_layers", where, positive=True))]}
    if isinstance(types, list) and "sliding_attention" in types:
        if hf.get("sliding_window") is None:
            raise InputError(f"{where}: layer_types has sliding_attention layers but sliding_window is null")
        if not hf.get("use_sliding_window"):
            raise InputError(f"{where}: layer_types has sliding_attention layers but use_sliding_window is false "
                             "(transformers' eager and sdpa attention apply the window, its flash attention does "
                             "not): refusing rather than choosing one")
    return hf


SMOLLM3 = SmolLM3("smollm3", "SmolLM3ForCausalLM", "smollm3", KEYS, gguf_layout=replace(GGUF_LAYOUT, permuted=True))
FAMILIES = (SMOLLM3,)
