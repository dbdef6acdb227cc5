"""config.json's rope keys read into ModelConfig's (split from base.py): rope_parameters (transformers 5) or
rope_theta + rope_scaling (4.x); default, linear and llama3 for every family, partial_rotary_factor and LongRoPE
("longrope", Phi-3's "su") for a family with partial_rope. No torch."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from gptport.arch.values import number
from gptport.errors import InputError


class Family(Protocol):
    """What rope() reads of a family (base.Family has it)."""

    partial_rope: bool
    hf_class: str


ROPE_KEYS = {"rope_theta", "rope_type", "type", "factor", "low_freq_factor", "high_freq_factor",
             "original_max_position_embeddings", "partial_rotary_factor", "short_factor", "long_factor",
             "attention_factor"}
ROPE_TYPES = {"default": "none", "linear": "linear", "llama3": "llama3"}
LONGROPE_TYPES = {"longrope": "longrope", "su": "longrope"}  # a family with partial_rope reads these too

def rope(hf: Mapping[str, Any], where: Path, family: Family) -> dict[str, Any]:
    """rope_parameters (transformers 5) or rope_theta + rope_scaling (4.x) as ModelConfig's rope keys; a family
    with partial_rope also reads partial_rotary_factor and LongRoPE (transformers' _compute_longrope_parameters)."""
    params = hf.get("rope_parameters")
    if params is None:
        params = {"rope_theta": hf.get("rope_theta", 10000.0), **(hf.get("rope_scaling") or {})}
    if not isinstance(params, dict):
        raise InputError(f"{where}: rope_parameters must be an object, not {params!r}")
    params = {"rope_theta": hf.get("rope_theta", 10000.0), **params}
    if family.partial_rope and "partial_rotary_factor" in hf:  # Phi-4-mini's, outside rope_scaling
        params.setdefault("partial_rotary_factor", hf["partial_rotary_factor"])
    unknown = sorted(set(params) - ROPE_KEYS)
    if unknown:
        raise InputError(f"{where}: rope key {unknown[0]!r} is not one gptport knows")
    kind = params.get("rope_type", params.get("type", "default"))
    types = {**ROPE_TYPES, **(LONGROPE_TYPES if family.partial_rope else {})}
    if kind not in types:
        raise InputError(f"{where}: rope type {kind!r} is not one gptport has for {family.hf_class} "
                         f"({', '.join(types)})")
    out: dict[str, Any] = {"pos_encoding": "rope", "rope_theta": number(params, "rope_theta", where, kind=float),
                           "rope_scaling": types[kind]}
    partial = number(params, "partial_rotary_factor", where, 1.0, kind=float, positive=True)
    if partial != 1.0:
        if not family.partial_rope:
            raise InputError(f"{where}: partial_rotary_factor {partial} ({family.hf_class} rotates whole heads)")
        head_dim = hf.get("head_dim") or number(hf, "hidden_size", where) // number(hf, "num_attention_heads", where)
        out["rotary_dim"] = int(head_dim * partial)  # transformers' int(head_dim * partial_rotary_factor)
    if kind in ("linear", "llama3"):
        out["rope_factor"] = number(params, "factor", where, kind=float)
    if kind == "llama3":
        out["rope_low_freq_factor"] = number(params, "low_freq_factor", where, kind=float)
        out["rope_high_freq_factor"] = number(params, "high_freq_factor", where, kind=float)
        out["rope_original_n_ctx"] = number(params, "original_max_position_embeddings", where,
                                             hf.get("max_position_embeddings"))
    if types[kind] == "longrope":
        out |= _longrope(hf, params, where)
    return out


def _longrope(hf: Mapping[str, Any], params: Mapping[str, Any], where: Path) -> dict[str, Any]:
    """LongRoPE's keys: both factor lists, the original context (Phi-3's config.json keeps it outside
    rope_scaling, where Phi3Config reads it, 4096 when absent, over any inside) and the attention factor (given, or
    sqrt(1 + ln(factor) / ln(original)) with factor max_position_embeddings / original, 1 when that is <= 1)."""
    lists = {}
    for key in ("short_factor", "long_factor"):
        values = params.get(key)
        if not isinstance(values, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                   for v in values):
            raise InputError(f"{where}: rope {key} must be a list of numbers, not {values!r:.60}")
        lists[f"rope_{key}"] = tuple(float(v) for v in values)
    original = number(hf, "original_max_position_embeddings", where, 4096, positive=True)
    factor = params.get("factor")
    factor = number(hf, "max_position_embeddings", where) / original if factor is None else number(
        params, "factor", where, kind=float, positive=True)
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    else:
        attention = number(params, "attention_factor", where, kind=float, positive=True)
    return {**lists, "rope_original_n_ctx": original, "rope_attention_factor": attention}
