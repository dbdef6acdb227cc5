"""SmolLM3 (SmolLM3ForCausalLM): the Llama family's decoder in which some layers do not rotate q and k. Its
config.json's no_rope_layers is one flag per layer, 1 where the layer USES rope and 0 where it does not (the name
says the opposite); without it, every no_rope_layer_interval-th layer (the 4th, 8th, ...) goes without. gptport's
no_rope_layers lists the indices of the layers without. A sliding window (use_sliding_window) is taken only where
it covers the whole context (gptport's attention has no window yet). Everything else is base.py's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptport.arch.base import Family, Specials, number
from gptport.arch.phi3 import refuse_window
from gptport.config import ModelConfig
from gptport.errors import InputError

DEFAULT_THETA = 2000000.0
KEYS = frozenset({"attention_bias", "mlp_bias", "no_rope_layers", "no_rope_layer_interval", "use_sliding_window",
                  "sliding_window", "layer_types", "max_window_layers"})


@dataclass(frozen=True)
class SmolLM3(Family):
    def model_config(self, hf: Mapping[str, Any], vocab_size: int, tokens: Specials, where: Path) -> ModelConfig:
        params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        if "rope_theta" not in hf and not (isinstance(params, dict) and "rope_theta" in params):
            hf = {**hf, "rope_theta": DEFAULT_THETA}  # SmolLM3Config's default_theta
        return super().model_config(hf, vocab_size, tokens, where)

    def _n_ctx(self, hf: Mapping[str, Any], where: Path) -> int:
        odd = [t for t in hf.get("layer_types") or [] if t not in ("full_attention", "sliding_attention")]
        if odd:
            raise InputError(f"{where}: layer type {odd[0]!r} is not one gptport has")
        if not hf.get("use_sliding_window"):  # transformers applies no window without it
            return number(hf, "max_position_embeddings", where)
        return refuse_window(hf, where)

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
        return {"attention_bias": cfg.has_qkv_bias, "mlp_bias": cfg.has_mlp_bias, "use_sliding_window": False,
                "sliding_window": None, "no_rope_layers": uses, "layer_types": ["full_attention"] * cfg.n_layer,
                "pad_token_id": None}  # SmolLM3Config's default 128004 is no id of a smaller vocabulary


SMOLLM3 = SmolLM3("smollm3", "SmolLM3ForCausalLM", None, KEYS)
FAMILIES = (SMOLLM3,)
