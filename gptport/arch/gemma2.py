"""Gemma 2 (Gemma2ForCausalLM; llama.cpp's `gemma2`): Gemma 3's layers (gemma3.py: embeddings times
sqrt(hidden_size), (1 + w) norms, GeGLU, a norm after the attention and after the MLP, softmax scale
query_pre_attn_scalar^-0.5, sliding-window layers between global ones) without its q/k norm and with one RoPE
base, plus soft-capping: each attention score tanh(s / attn_logit_softcapping) * cap after the scale and before
the mask, each logit tanh(l / final_logit_softcapping) * cap (design record 0052). Without layer_types the even
layers (0, 2, ...) are the window ones, as transformers' Gemma2Config makes them. llama.cpp's `gemma2` holds both
caps (50 and 30 where absent), the window (4096) and its layers (every 2nd), always ties the head and derives the
softmax scale: gguf_values reads it, gguf_write writes it, gguf_mismatches names what it cannot hold."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gptport.arch.base import GGUF_KEYS, Family, Specials, number, refused
from gptport.arch.gemma3 import GELUS, GGUF, HF, gemma_keys, gguf_window_layers, llama_cpp_scale
from gptport.config import ModelConfig
from gptport.errors import InputError, UsageError

KEYS = frozenset({"head_dim", "attention_bias", "query_pre_attn_scalar", "sliding_window", "layer_types",
                  "final_logit_softcapping", "attn_logit_softcapping", "hidden_activation",
                  "use_bidirectional_attention", "cache_implementation"})
FIELDS = {"attn_softcap": "attn_logit_softcapping", "final_softcap": "final_logit_softcapping",
          "sliding_window": "sliding_window", "attn_scale": "query_pre_attn_scalar"}  # ModelConfig's -> config.json's
GGUF_KEYS_GEMMA2 = GGUF_KEYS | {"attn_logit_softcapping", "final_logit_softcapping", "attention.sliding_window",
                                "attention.sliding_window_pattern", "rope.freq_base_swa"}
LAYERS_27B = 46  # llama.cpp's gemma2 derives 27B's softmax scale from d_model / n_head


def claims(cfg: ModelConfig) -> bool:
    """Whether `cfg` is Gemma 2's rather than Gemma 3's (export-hf's pick): soft-capping, or GeGLU without q/k norm."""
    return cfg.attn_softcap > 0 or cfg.final_softcap > 0 or (cfg.mlp == "geglu" and not cfg.qk_norm)


def mismatches(cfg: ModelConfig) -> list[str]:
    """What keeps a gptport model from transformers' Gemma2ForCausalLM (empty when it computes it)."""
    wants = (("mlp", "geglu"), ("norm", "rmsnorm"), ("pos_encoding", "rope"), ("qk_norm", False), ("post_norms", True),
             ("pre_norms", True), ("mlp_bias", False), ("bias", False), ("residual_scale", 1.0),
             ("logits_divisor", 1.0), ("rope_local_theta", 0.0))
    out = [f"{name} is {getattr(cfg, name)!r} (Gemma 2's is {want!r})" for name, want in wants
           if getattr(cfg, name) != want]
    if cfg.embed_scale != math.sqrt(cfg.d_model):
        out.append(f"embed_scale is {cfg.embed_scale:g} (Gemma 2 scales by sqrt(d_model))")
    if cfg.has_qkv_bias != cfg.has_out_bias:
        out.append("q/k/v biases without an output bias (Gemma 2's attention_bias sets all four)")
    return out


def gguf_mismatches(cfg: ModelConfig) -> list[str]:
    """What keeps a gptport model from llama.cpp's gemma2 (empty when it computes it): Gemma 2's choices (a local
    RoPE base aside: llama.cpp reads rope.freq_base_swa), its tied head, no biases, GELU's tanh form, both caps
    (llama.cpp divides by each), the softmax scale it derives."""
    out = [m for m in mismatches(cfg) if not m.startswith("rope_local_theta")]
    if not cfg.tie_embeddings:
        out.append("an untied head (llama.cpp's gemma2 computes the logits with token_embd)")
    if cfg.has_qkv_bias or cfg.has_out_bias:
        out.append("attention biases (llama.cpp's gemma2 has no output bias)")
    if cfg.gelu != "tanh":
        out.append(f"gelu is {cfg.gelu!r} (llama.cpp's gemma2 takes GELU's tanh form)")
    out += [f"no {what} soft-cap (llama.cpp's gemma2 always caps)" for what, cap in
            (("attention", cfg.attn_softcap), ("final", cfg.final_softcap)) if cap == 0]
    want = llama_cpp_scale(cfg, LAYERS_27B)
    if not math.isclose(cfg.softmax_scale, want, rel_tol=1e-6):
        out.append(f"softmax scale {cfg.softmax_scale:g}, not the {want:g} llama.cpp's gemma2 derives")
    return out


def _window_layers(hf: Mapping[str, Any], n_layer: int, where: Path) -> tuple[int, ...]:
    """The sliding layers: layer_types', else the even ones (transformers' Gemma2Config default)."""
    types = hf.get("layer_types")
    if types is None:
        return tuple(range(0, n_layer, 2))
    if not isinstance(types, list) or len(types) != n_layer:
        raise InputError(f"{where}: layer_types must list the {n_layer} layers' types")
    odd = [t for t in types if t not in ("full_attention", "sliding_attention")]
    if odd:
        raise InputError(f"{where}: layer type {odd[0]!r} is not one gptport has")
    return tuple(i for i, t in enumerate(types) if t == "sliding_attention")


def _cap(hf: Mapping[str, Any], key: str, where: Path) -> float:
    """A soft-cap of config.json (null or absent: none, 0)."""
    return number(hf, key, where, 0.0, kind=float)


@dataclass(frozen=True)
class Gemma2(Family):
    def gguf_values(self, f: Any, values: dict[str, Any]) -> dict[str, Any]:
        """llama.cpp's gemma2 metadata, with its defaults: the caps (50, 30), the window (4096) on every 2nd layer
        (a window covering the context is none), their RoPE base (the global one); the scale it derives."""
        p = f"{self.gguf_arch}."
        if "output.weight" in f.tensors:
            raise InputError(f"{f.path}: tensor output.weight, which llama.cpp's gemma2 never reads (it ties the head "
                             "to token_embd); refusing rather than computing otherwise than llama.cpp")
        window = f.integer(p + "attention.sliding_window", 4096)
        layers = gguf_window_layers(f, p + "attention.sliding_window_pattern", values["n_layer"], 2)
        layers = layers if 0 < window < values["n_ctx"] else ()
        local = f.number(p + "rope.freq_base_swa", values["rope_theta"])
        out = {**values, "mlp": "geglu", "gelu": "tanh", "post_norms": True, "qk_norm": False,
               "embed_scale": math.sqrt(values["d_model"]), "sliding_window": window if layers else 0,
               "window_layers": layers, "rope_local_theta": local if layers and local != values["rope_theta"] else 0.0,
               "attn_softcap": f.number(p + "attn_logit_softcapping", 50.0),
               "final_softcap": f.number(p + "final_logit_softcapping", 30.0)}
        return {**out, "attn_scale": llama_cpp_scale(ModelConfig(**{**out, "attn_scale": 0.0}), LAYERS_27B)}

    def gguf_write(self, writer: Any, cfg: ModelConfig) -> None:
        """Both caps, and the window always (llama.cpp's default is 4096 on every 2nd layer): a model without one
        as a window of n_ctx, which masks nothing."""
        writer.add_attn_logit_softcapping(cfg.attn_softcap)
        writer.add_final_logit_softcapping(cfg.final_softcap)
        if not (cfg.sliding_window and cfg.window_layers):
            writer.add_sliding_window(cfg.n_ctx)

    def model_config(self, hf: Mapping[str, Any], vocab_size: int, tokens: Specials, where: Path) -> ModelConfig:
        if hf.get("use_bidirectional_attention"):
            raise InputError(f"{where}: use_bidirectional_attention is {hf['use_bidirectional_attention']!r}, which "
                             "gptport does not compute; refusing")
        act = hf.get("hidden_activation", hf.get("hidden_act", "gelu_pytorch_tanh"))
        if act not in GELUS:
            raise InputError(f"{where}: hidden_activation {act!r} is not a GELU gptport has")
        rest = {k: v for k, v in hf.items() if k not in KEYS and k != "hidden_act"}
        cfg = super().model_config({**rest, "head_dim": hf.get("head_dim"), "attention_bias": hf.get("attention_bias")},
                                   vocab_size, tokens, where)
        window = number(hf, "sliding_window", where, 0, positive=hf.get("sliding_window") is not None)
        layers = _window_layers(hf, cfg.n_layer, where) if window else ()
        scalar = number(hf, "query_pre_attn_scalar", where, cfg.head_dim, kind=float, positive=True)
        try:
            return replace(cfg, mlp="geglu", gelu=GELUS[act], post_norms=True,  # type: ignore[arg-type]
                           embed_scale=math.sqrt(cfg.d_model), attn_scale=scalar ** -0.5,
                           sliding_window=window if layers else 0, window_layers=layers,
                           attn_softcap=_cap(hf, "attn_logit_softcapping", where),
                           final_softcap=_cap(hf, "final_logit_softcapping", where),
                           tie_embeddings=bool(hf.get("tie_word_embeddings", True)))
        except UsageError as e:
            raise refused(e, FIELDS, where) from e

    def hf_config(self, cfg: ModelConfig, ends: list[int]) -> dict[str, Any]:
        out = super().hf_config(cfg, ends)
        del out["hidden_act"]  # Gemma's classes say hidden_activation (hf_keys)
        return out

    def hf_extra(self, cfg: ModelConfig) -> dict[str, Any]:
        return {**gemma_keys(cfg), "attn_logit_softcapping": cfg.attn_softcap or None,
                "final_logit_softcapping": cfg.final_softcap or None}


GEMMA2 = Gemma2("gemma2", "Gemma2ForCausalLM", "gemma2", KEYS, hf_layout=HF, gguf_layout=GGUF,
                gguf_keys=frozenset(GGUF_KEYS_GEMMA2), head_dim=256)
FAMILIES = (GEMMA2,)
