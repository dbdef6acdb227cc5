"""Gemma 3, text only (Gemma3ForCausalLM, model_type gemma3_text; llama.cpp's `gemma3`): embeddings times
sqrt(hidden_size), RMSNorm computing x * (1 + w) (the 1 folded into gptport's stored weight on import, taken
off on export-hf; llama.cpp stores 1 + w already), GeGLU (GELU's tanh form), q/k norm, a norm after the
attention and after the MLP, softmax scale query_pre_attn_scalar^-0.5, and sliding-window layers (layer_types)
with their own RoPE base (rope_local_base_freq) between global ones. Soft-capping and bidirectional attention
are refused by name (design record 0049)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gptport.arch.base import GGUF_KEYS, GGUF_LAYOUT, HF_LAYOUT, Family, Specials, number, refused
from gptport.config import ModelConfig
from gptport.errors import InputError, UsageError

NORMS = frozenset({"ln_1", "ln_1_post", "ln_2", "ln_2_post", "attn.q_norm", "attn.k_norm", "ln_f"})
HF = replace(HF_LAYOUT, modules={**HF_LAYOUT.modules, "ln_1_post": "post_attention_layernorm",
                                 "ln_2": "pre_feedforward_layernorm", "ln_2_post": "post_feedforward_layernorm"},
             plus_one=NORMS)
GGUF = replace(GGUF_LAYOUT, modules={**GGUF_LAYOUT.modules, "ln_1_post": "post_attention_norm",
                                     "ln_2_post": "post_ffw_norm"})
GELUS = {"gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu": "exact"}
KEYS = frozenset({"head_dim", "attention_bias", "query_pre_attn_scalar", "sliding_window", "layer_types",
                  "rope_local_base_freq", "final_logit_softcapping", "attn_logit_softcapping", "hidden_activation",
                  "use_bidirectional_attention", "sliding_window_pattern", "_sliding_window_pattern"})
REFUSED = ("final_logit_softcapping", "attn_logit_softcapping", "use_bidirectional_attention")
GGUF_KEYS_GEMMA3 = GGUF_KEYS | {"attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base_swa"}


def _rope(hf: Mapping[str, Any], where: Path) -> tuple[dict[str, Any], float]:
    """The global layers' rope parameters (flat, as base.py reads them) and the window layers' base: from
    transformers 5's rope_parameters per layer type, or 4.x's rope_theta, rope_scaling, rope_local_base_freq."""
    params = hf.get("rope_parameters")
    if isinstance(params, Mapping) and ("full_attention" in params or "sliding_attention" in params):
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
        if not isinstance(full, Mapping) or not isinstance(local, Mapping):
            raise InputError(f"{where}: rope_parameters' layer types must be objects")
        if local.get("rope_type", "default") != "default":
            raise InputError(f"{where}: the sliding layers' rope type {local['rope_type']!r} is not one gptport has")
        theta = number(local, "rope_theta", where, 10000.0, kind=float, positive=True)
        return {"rope_theta": full.get("rope_theta", 1e6), "rope_parameters": dict(full)}, theta
    theta = number(hf, "rope_local_base_freq", where, 10000.0, kind=float, positive=True)
    return {"rope_theta": hf.get("rope_theta", 1e6), "rope_scaling": hf.get("rope_scaling"),
            "rope_parameters": params}, theta


def _window_layers(hf: Mapping[str, Any], n_layer: int, where: Path) -> tuple[int, ...]:
    """The sliding layers: layer_types', else every layer but each sliding_window_pattern-th (transformers')."""
    types = hf.get("layer_types")
    if types is None:
        pattern = number(hf, "sliding_window_pattern", where, hf.get("_sliding_window_pattern", 6), positive=True)
        return tuple(i for i in range(n_layer) if (i + 1) % pattern)
    if not isinstance(types, list) or len(types) != n_layer:
        raise InputError(f"{where}: layer_types must list the {n_layer} layers' types")
    return tuple(i for i, t in enumerate(types) if t == "sliding_attention")


def mismatches(cfg: ModelConfig) -> list[str]:
    """What keeps a gptport model from transformers' Gemma3ForCausalLM (empty when it computes it)."""
    wants = (("mlp", "geglu"), ("norm", "rmsnorm"), ("pos_encoding", "rope"), ("qk_norm", True), ("post_norms", True),
             ("mlp_bias", False), ("bias", False))
    out = [f"{name} is {getattr(cfg, name)!r} (Gemma 3's is {want!r})" for name, want in wants
           if getattr(cfg, name) != want]
    if cfg.embed_scale != math.sqrt(cfg.d_model):
        out.append(f"embed_scale is {cfg.embed_scale:g} (Gemma 3 scales by sqrt(d_model))")
    if cfg.has_qkv_bias != cfg.has_out_bias:
        out.append("q/k/v biases without an output bias (Gemma 3's attention_bias sets all four)")
    if cfg.rope_scaling != "none" and cfg.rope_local_theta == 0 and cfg.window_layers:
        out.append("window layers rotating with rope scaling (Gemma 3 scales its global layers only)")
    return out


def llama_cpp_scale(cfg: ModelConfig, layers_27b: int = 62) -> float:
    """The softmax scale llama.cpp's gemma3 (and gemma2) derives (no metadata holds it): 1/sqrt(head_dim), 27B's
    (`layers_27b` layers: gemma3's 62, gemma2's 46) 1/sqrt(d_model / n_head)."""
    return 1 / math.sqrt(cfg.d_model // cfg.n_head if cfg.n_layer == layers_27b else cfg.head_dim)


def gguf_mismatches(cfg: ModelConfig) -> list[str]:
    """What keeps a gptport model from llama.cpp's gemma3 (empty when it computes it)."""
    out = mismatches(cfg)
    if cfg.has_qkv_bias:
        out.append("attention biases (llama.cpp's gemma3 has none)")
    if cfg.gelu != "tanh":
        out.append(f"gelu is {cfg.gelu!r} (llama.cpp's gemma3 takes GELU's tanh form)")
    if not math.isclose(cfg.softmax_scale, llama_cpp_scale(cfg), rel_tol=1e-6):
        out.append(f"softmax scale {cfg.softmax_scale:g}, not the {llama_cpp_scale(cfg):g} llama.cpp's gemma3 derives")
    return out


def gguf_window_layers(f: Any, key: str, n_layer: int, default: int) -> tuple[int, ...]:
    """The sliding layers of llama.cpp's `key`: a list of per-layer flags, or a number n (layer i slides where
    i % n < n - 1, its set_swa_pattern; 0: every layer), `default` where absent."""
    pattern = f.value(key, default)
    if isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise InputError(f"{f.path}: {key} lists {len(pattern)} layers, not {n_layer}")
        return tuple(i for i, swa in enumerate(pattern) if swa)
    n = f.integer(key, default)
    return tuple(i for i in range(n_layer) if n == 0 or i % n < n - 1)


@dataclass(frozen=True)
class Gemma3(Family):
    def gguf_values(self, f: Any, values: dict[str, Any]) -> dict[str, Any]:
        """llama.cpp's gemma3 metadata: the window, its layers (a list of flags, or every n-th layer global: 6 by
        default) and their RoPE base (10,000 by default); the softmax scale as llama.cpp derives it."""
        p = f"{self.gguf_arch}."
        window = f.integer(p + "attention.sliding_window", 0)
        layers = gguf_window_layers(f, p + "attention.sliding_window_pattern", values["n_layer"], 6)
        layers = layers if window > 0 else ()
        out = {**values, "mlp": "geglu", "gelu": "tanh", "post_norms": True,
               "embed_scale": math.sqrt(values["d_model"]), "sliding_window": window if layers else 0,
               "window_layers": layers,
               "rope_local_theta": f.number(p + "rope.freq_base_swa", 10000.0) if layers else 0.0}
        shape = ModelConfig(**{**out, "attn_scale": 0.0})
        return {**out, "attn_scale": llama_cpp_scale(shape)}


    def model_config(self, hf: Mapping[str, Any], vocab_size: int, tokens: Specials, where: Path) -> ModelConfig:
        for key in REFUSED:
            if hf.get(key):
                raise InputError(f"{where}: {key} is {hf[key]!r}, which gptport does not compute "
                                 "(soft-capping, bidirectional attention); refusing")
        act = hf.get("hidden_activation", hf.get("hidden_act", "gelu_pytorch_tanh"))
        if act not in GELUS:
            raise InputError(f"{where}: hidden_activation {act!r} is not a GELU gptport has")
        flat, local_theta = _rope(hf, where)
        rest = {k: v for k, v in hf.items() if k not in KEYS and k not in ("hidden_act", "rope_scaling")}
        cfg = super().model_config({**rest, **{k: v for k, v in flat.items() if v is not None},
                                    "head_dim": hf.get("head_dim"), "attention_bias": hf.get("attention_bias")},
                                   vocab_size, tokens, where)
        window = number(hf, "sliding_window", where, 0, positive=hf.get("sliding_window") is not None)
        layers = _window_layers(hf, cfg.n_layer, where) if window else ()
        scalar = number(hf, "query_pre_attn_scalar", where, cfg.head_dim, kind=float, positive=True)
        try:
            return replace(cfg, mlp="geglu", gelu=GELUS[act], qk_norm=True, post_norms=True,  # type: ignore[arg-type]
                           embed_scale=math.sqrt(cfg.d_model), attn_scale=scalar ** -0.5,
                           sliding_window=window if layers else 0, window_layers=layers,
                           rope_local_theta=local_theta if layers else 0.0,
                           tie_embeddings=bool(hf.get("tie_word_embeddings", True)))
        except UsageError as e:
            raise refused(e, {"sliding_window": "sliding_window"}, where) from e

    def hf_config(self, cfg: ModelConfig, ends: list[int]) -> dict[str, Any]:
        out = super().hf_config(cfg, ends)
        del out["hidden_act"]  # Gemma's classes say hidden_activation (hf_keys)
        return out

    def hf_extra(self, cfg: ModelConfig) -> dict[str, Any]:
        return {**gemma_keys(cfg), "rope_local_base_freq": cfg.rope_local_theta or cfg.rope_theta,
                "final_logit_softcapping": None, "attn_logit_softcapping": None}


def gemma_keys(cfg: ModelConfig) -> dict[str, Any]:
    """config.json's keys Gemma 2's and Gemma 3's classes share: heads, activation, softmax scale, window."""
    scalar = cfg.softmax_scale ** -2
    return {"head_dim": cfg.head_dim, "attention_bias": cfg.has_qkv_bias,
            "hidden_activation": "gelu_pytorch_tanh" if cfg.gelu == "tanh" else "gelu",
            "query_pre_attn_scalar": round(scalar) if abs(scalar - round(scalar)) < 1e-6 else scalar,
            "sliding_window": cfg.sliding_window or None,
            "layer_types": ["sliding_attention" if cfg.windowed(i) else "full_attention" for i in range(cfg.n_layer)]}

GEMMA3 = Gemma3("gemma3_text", "Gemma3ForCausalLM", "gemma3", KEYS, hf_layout=HF, gguf_layout=GGUF,
                gguf_keys=frozenset(GGUF_KEYS_GEMMA3), qk_norm=True, head_dim=256)
FAMILIES = (GEMMA3,)
