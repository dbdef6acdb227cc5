"""A GGUF file's model as gptport's: the architecture's metadata (llama.cpp's `llama`, `qwen2`, `qwen3` and `gpt2`,
each a family of gptport/arch/) as a ModelConfig, each `{arch}.*` key used (the family's gguf_keys), ignored because
it does not change what the model computes, or refused by name (as import-hf does with config.json), and the
family's plan of gptport's tensors checked against the file's: every tensor present with the shape the metadata
implies, none left over (q, k and v stacked into c_attn, llama.cpp's q/k row permutation undone for `llama`, whose
converter reorders each head's rows so that its rotation pairs neighbours; qwen2 and qwen3 rotate halves, as
gptport does). No torch."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gptport import arch
from gptport.arch.base import Family, Planned, Specials
from gptport.arch.gpt2 import GPT2_FAMILY
from gptport.config import ModelConfig
from gptport.errors import ArtifactError, InputError, UsageError
from gptport.export.gguf_file import GGUFFile

IGNORED = {"rope.scaling.finetuned", "tensor_data_layout"}  # a fine-tuning note; the layout every llama file has
ROPE_FREQS = "rope_freqs.weight"  # Llama 3's frequency factors, which llama.cpp's converter writes as a tensor
LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}  # Llama 3.1's and 3.2's, the ones checked against it


def architecture(f: GGUFFile) -> Family:
    """The family of the file's general.architecture; any other is refused naming it."""
    name = f.text("general.architecture")
    family = arch.from_gguf(name)
    if family is None:
        raise InputError(f"{f.path}: architecture {name!r} is not one gptport imports ({', '.join(arch.gguf_archs())})")
    return family


def _check_keys(f: GGUFFile, family: Family) -> None:
    prefix = f"{family.gguf_arch}."
    unknown = sorted(k for k in f.keys if k.startswith(prefix) and k[len(prefix):] not in family.gguf_keys | IGNORED)
    if unknown:
        raise InputError(f"{f.path}: metadata {unknown[0]} is not a key gptport knows for a {family.gguf_arch} model; "
                         "refusing rather than importing a model that may compute otherwise")


def _rope(f: GGUFFile, p: str, head_dim: int, rope_freqs: bool) -> dict[str, Any]:
    """rope_theta and its scaling (keys under the architecture's prefix `p`): none, linear (rope.scaling.type or
    the older rope.scale_linear) or Llama 3's, read back from the frequency factors of rope_freqs.weight (refused
    unless they are Llama 3's formula's)."""
    out: dict[str, Any] = {"pos_encoding": "rope", "rope_theta": f.number(p + "rope.freq_base", 10000.0)}
    kind = f.text(p + "rope.scaling.type", "none")
    linear = f.number(p + "rope.scale_linear", 1.0)
    if kind not in ("none", "linear"):
        raise InputError(f"{f.path}: {p}rope.scaling.type {kind!r} is not one gptport has (none, linear)")
    if kind == "linear" or linear != 1.0:
        factor = f.number(p + "rope.scaling.factor") if kind == "linear" else linear
        out.update(rope_scaling="linear", rope_factor=factor)
    if rope_freqs and ROPE_FREQS in f.tensors:
        freqs = f.dequantize(ROPE_FREQS).astype(np.float64)
        if freqs.shape != (head_dim // 2,):
            raise ArtifactError(f"{f.path}: {ROPE_FREQS} has shape {freqs.shape}, not ({head_dim // 2},)")
        if not np.all(freqs == 1.0):
            if "rope_scaling" in out:
                raise InputError(f"{f.path}: both {ROPE_FREQS} and linear rope scaling")
            out.update(_llama3(f, p, freqs, out["rope_theta"], head_dim))
    return out


def _llama3(f: GGUFFile, p: str, freqs: np.ndarray, theta: float, head_dim: int) -> dict[str, Any]:
    """The llama3 scaling whose frequency factors (as llama.cpp's converter computes them) are `freqs`."""
    factor = float(str(np.float32(freqs.max())))
    original = f.integer(p + "rope.scaling.original_context_length", 8192)
    low, high = LLAMA3["low_freq_factor"], LLAMA3["high_freq_factor"]
    expected = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        smooth = (original / wavelen - low) / (high - low)
        expected.append(1.0 if wavelen < original / high else factor if wavelen > original / low
                        else 1 / ((1 - smooth) / factor + smooth))
    if not np.allclose(freqs, expected, rtol=1e-5, atol=0):
        raise InputError(f"{f.path}: {ROPE_FREQS} holds frequency factors gptport cannot express (not Llama 3's "
                         f"scaling with factor {factor}, low/high frequency factors {low}/{high}, original context "
                         f"{original})")
    return {"rope_scaling": "llama3", "rope_factor": factor, "rope_low_freq_factor": low,
            "rope_high_freq_factor": high, "rope_original_n_ctx": original}


def model_config(f: GGUFFile, family: Family, vocab_size: int, tokens: Specials) -> ModelConfig:
    """The ModelConfig of the file's metadata for `family` (`vocab_size`: its tokenizer's)."""
    _check_keys(f, family)
    p = f"{family.gguf_arch}."
    d_model, n_head = f.integer(p + "embedding_length"), f.integer(p + "attention.head_count")
    values: dict[str, Any] = {
        "vocab_size": vocab_size, "n_ctx": f.integer(p + "context_length"), "d_model": d_model,
        "n_layer": f.integer(p + "block_count"), "n_head": n_head, "d_ff": f.integer(p + "feed_forward_length"),
        "dropout": 0.0, "tie_embeddings": "output.weight" not in f.tensors,
        "bos_id": tokens.bos_id, "add_bos": tokens.add_bos, "eos_ids": tokens.eos_ids}
    if family is GPT2_FAMILY:
        values.update(bias=True, pos_encoding="learned", gelu="tanh",
                      ln_eps=f.number(p + "attention.layer_norm_epsilon"))
    else:
        head_dim = f.integer(p + "attention.key_length", d_model // n_head if n_head else 0)
        for key in ("attention.value_length",) + (() if family.partial_rope else ("rope.dimension_count",)):
            if f.integer(p + key, head_dim) != head_dim:
                raise InputError(f"{f.path}: {p + key} {f.integer(p + key)} differs from the heads' width {head_dim} "
                                 "(gptport rotates and attends over whole heads)")
        blk = "blk.0."
        values.update(
            n_kv_head=f.integer(p + "attention.head_count_kv", n_head), head_dim=head_dim, norm="rmsnorm",
            mlp="swiglu", bias=False, ln_eps=f.number(p + "attention.layer_norm_rms_epsilon", 1e-5),
            qkv_bias=blk + "attn_q.bias" in f.tensors, out_bias=blk + "attn_output.bias" in f.tensors,
            mlp_bias=blk + "ffn_up.bias" in f.tensors, qk_norm=blk + "attn_q_norm.weight" in f.tensors,
            **_rope(f, p, head_dim, family.rope_freqs))
        values = family.gguf_values(f, values)  # the family's own keys (gemma3's window, phi3's rotary width)
    try:
        return ModelConfig(**values)
    except UsageError as e:  # a shape gptport's model cannot have, said by ModelConfig
        raise InputError(f"{f.path}: {e}") from e


def plan(f: GGUFFile, family: Family, cfg: ModelConfig) -> list[Planned]:
    """gptport's tensors, each from the file's (the family's plan); the embedding and an untied head cut to the
    tokenizer's vocabulary. A tensor missing, one left over or one of another shape than `cfg` implies is refused
    by name."""
    embd = family.gguf_layout.globals["wte"] + ".weight"
    rows = f.shape(embd)[0] if embd in f.tensors and f.shape(embd) else cfg.vocab_size
    if rows < cfg.vocab_size:
        raise ArtifactError(f"{f.path}: tensor {embd} has {rows} rows, fewer than the {cfg.vocab_size} tokens of the "
                            "file's tokenizer")
    planned = family.gguf_plan(cfg, rows)
    used = ({ROPE_FREQS} if family.rope_freqs else set()) | (family.gguf_side & set(f.tensors))
    for p in planned:
        for part in p.parts:
            if part.name not in f.tensors:
                raise ArtifactError(f"{f.path}: no tensor {part.name}, which this {family.gguf_arch} model has")
            if f.shape(part.name) != part.shape:
                raise ArtifactError(f"{f.path}: tensor {part.name} has shape {f.shape(part.name)}; the model its "
                                    f"metadata describes needs {part.shape} for gptport's {p.name}")
            used.add(part.name)
    left = sorted(set(f.tensors) - used)
    if left:
        raise ArtifactError(f"{f.path}: tensor {left[0]} is not one a {family.gguf_arch} model of this metadata has")
    return planned
