"""A GGUF file's model as gptport's: the architecture's metadata (llama.cpp's `llama`, `qwen2`, `qwen3` and `gpt2`)
as a ModelConfig, each `{arch}.*` key used, ignored because it does not change what the model computes, or refused
by name (as hf_llama.py does with config.json), and the plan of gptport's tensors, each made of the file's tensors:
q, k and v stacked into c_attn, with llama.cpp's q/k row permutation undone for `llama` (its converter reorders
each head's rows so that its rotation pairs neighbours; gptport rotates halves, as transformers does, and as
llama.cpp's qwen2 and qwen3 do, whose rows are left as they are); qwen3's q/k norms. No torch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gptport.config import ModelConfig
from gptport.errors import ArtifactError, InputError, UsageError
from gptport.export.gguf_export import BLOCK_NAMES
from gptport.export.gguf_file import GGUFFile
from gptport.export.hf_files import Specials

ARCHS = ("llama", "qwen2", "qwen3", "gpt2")
ROTATE_HALVES = ("qwen2", "qwen3")  # llama.cpp's NEOX rotation, gptport's: their q and k rows are not permuted
USED = {
    "llama": {"context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
              "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.dimension_count",
              "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length", "rope.scale_linear",
              "attention.key_length", "attention.value_length", "vocab_size"},
    "gpt2": {"context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
             "attention.layer_norm_epsilon", "vocab_size"},
}
USED.update(dict.fromkeys(ROTATE_HALVES, USED["llama"]))  # the same keys, under the architecture's prefix
IGNORED = {"rope.scaling.finetuned", "tensor_data_layout"}  # a fine-tuning note; the layout every llama file has
ROPE_FREQS = "rope_freqs.weight"  # Llama 3's frequency factors, which llama.cpp's converter writes as a tensor
LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}  # Llama 3.1's and 3.2's, the ones checked against it
LLAMA_BLOCK = {"ln_1": "attn_norm", "ln_2": "ffn_norm", "attn.c_proj": "attn_output", "mlp.c_gate": "ffn_gate",
               "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}


@dataclass(frozen=True)
class Part:
    """One tensor of the file, rows cut to `rows` (None: all), its heads' rows un-permuted when `heads` is set."""

    name: str
    heads: int | None = None
    rows: int | None = None


@dataclass(frozen=True)
class Planned:
    """One tensor gptport's model.safetensors holds: its parts stacked along the first axis."""

    name: str
    shape: tuple[int, ...]
    parts: tuple[Part, ...]


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's LlamaModel.permute: each head's rows back from interleaved pairs to halves."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def architecture(f: GGUFFile) -> str:
    arch = f.text("general.architecture")
    if arch not in ARCHS:
        raise InputError(f"{f.path}: architecture {arch!r} is not one gptport imports ({', '.join(ARCHS)})")
    return arch


def _check_keys(f: GGUFFile, arch: str) -> None:
    prefix = f"{arch}."
    unknown = sorted(k for k in f.keys if k.startswith(prefix) and k[len(prefix):] not in USED[arch] | IGNORED)
    if unknown:
        raise InputError(f"{f.path}: metadata {unknown[0]} is not a key gptport knows for a {arch} model; refusing "
                         "rather than importing a model that may compute otherwise")


def _rope(f: GGUFFile, p: str, head_dim: int) -> dict[str, Any]:
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
    if ROPE_FREQS in f.tensors:
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


def model_config(f: GGUFFile, arch: str, vocab_size: int, tokens: Specials) -> ModelConfig:
    """The ModelConfig of the file's `arch` metadata (`vocab_size`: its tokenizer's)."""
    _check_keys(f, arch)
    p = f"{arch}."
    d_model, n_head = f.integer(p + "embedding_length"), f.integer(p + "attention.head_count")
    values: dict[str, Any] = {
        "vocab_size": vocab_size, "n_ctx": f.integer(p + "context_length"), "d_model": d_model,
        "n_layer": f.integer(p + "block_count"), "n_head": n_head, "d_ff": f.integer(p + "feed_forward_length"),
        "dropout": 0.0, "tie_embeddings": "output.weight" not in f.tensors,
        "bos_id": tokens.bos_id, "add_bos": tokens.add_bos, "eos_ids": tokens.eos_ids}
    if arch == "gpt2":
        values.update(bias=True, pos_encoding="learned", gelu="tanh",
                      ln_eps=f.number(p + "attention.layer_norm_epsilon"))
    else:
        head_dim = f.integer(p + "attention.key_length", d_model // n_head if n_head else 0)
        for key in ("attention.value_length", "rope.dimension_count"):
            if f.integer(p + key, head_dim) != head_dim:
                raise InputError(f"{f.path}: {p + key} {f.integer(p + key)} differs from the heads' width {head_dim} "
                                 "(gptport rotates and attends over whole heads)")
        blk = "blk.0."
        values.update(
            n_kv_head=f.integer(p + "attention.head_count_kv", n_head), head_dim=head_dim, norm="rmsnorm",
            mlp="swiglu", bias=False, ln_eps=f.number(p + "attention.layer_norm_rms_epsilon", 1e-5),
            qkv_bias=blk + "attn_q.bias" in f.tensors, out_bias=blk + "attn_output.bias" in f.tensors,
            mlp_bias=blk + "ffn_up.bias" in f.tensors, qk_norm=blk + "attn_q_norm.weight" in f.tensors,
            **_rope(f, p, head_dim))
    try:
        return ModelConfig(**values)
    except UsageError as e:  # a shape gptport's model cannot have, said by ModelConfig
        raise InputError(f"{f.path}: {e}") from e


def _llama_plan(cfg: ModelConfig, arch: str) -> list[tuple[str, tuple[Part, ...]]]:
    plan: list[tuple[str, tuple[Part, ...]]] = []
    kinds = ["weight", *(["bias"] if cfg.has_qkv_bias else [])]
    q_heads, kv_heads = (None, None) if arch in ROTATE_HALVES else (cfg.n_head, cfg.n_kv_head)
    for i in range(cfg.n_layer):
        blk, ours = f"blk.{i}.", f"h.{i}."
        for kind in kinds:  # [q | k | v] along the output, q and k back in halves order
            plan.append((f"{ours}attn.c_attn.{kind}", (Part(f"{blk}attn_q.{kind}", q_heads),
                                                        Part(f"{blk}attn_k.{kind}", kv_heads),
                                                        Part(f"{blk}attn_v.{kind}"))))
        if cfg.qk_norm:
            plan += [(f"{ours}attn.{x}_norm.weight", (Part(f"{blk}attn_{x}_norm.weight"),)) for x in "qk"]
        for mine, theirs in LLAMA_BLOCK.items():
            has_bias = mine.startswith("mlp.") and cfg.has_mlp_bias or mine == "attn.c_proj" and cfg.has_out_bias
            for kind in ["weight", *(["bias"] if has_bias else [])]:
                plan.append((f"{ours}{mine}.{kind}", (Part(f"{blk}{theirs}.{kind}"),)))
    return plan


def _gpt2_plan(cfg: ModelConfig) -> list[tuple[str, tuple[Part, ...]]]:
    plan: list[tuple[str, tuple[Part, ...]]] = [
        ("wpe.weight", (Part("position_embd.weight"),)), ("ln_f.bias", (Part("output_norm.bias"),))]
    for i in range(cfg.n_layer):
        for mine, theirs in BLOCK_NAMES.items():
            plan += [(f"h.{i}.{mine}.{kind}", (Part(f"blk.{i}.{theirs}.{kind}"),)) for kind in ("weight", "bias")]
    return plan


def _shape(name: str, cfg: ModelConfig) -> tuple[int, ...]:
    """The shape gptport's GPT gives tensor `name` under `cfg`."""
    d, f, q, kv = cfg.d_model, cfg.d_ff, cfg.q_width, cfg.kv_width
    module, _, kind = name.rpartition(".")
    sub = module.split(".", 2)[-1] if module.startswith("h.") else module
    rows = {"wte": cfg.vocab_size, "lm_head": cfg.vocab_size, "wpe": cfg.n_ctx, "attn.c_attn": q + 2 * kv,
            "attn.c_proj": d, "mlp.c_gate": f, "mlp.c_fc": f, "mlp.c_proj": d}.get(sub, d)
    cols = {"attn.c_proj": q, "mlp.c_proj": f}.get(sub, d)
    if sub in ("attn.q_norm", "attn.k_norm"):
        return (cfg.head_dim,)
    return (rows,) if kind == "bias" or sub.startswith("ln_") else (rows, cols)


def plan(f: GGUFFile, arch: str, cfg: ModelConfig) -> list[Planned]:
    """gptport's tensors, each from the file's; the embedding and an untied head cut to the tokenizer's
    vocabulary. A tensor missing, one left over or one of another shape than `cfg` implies is refused by name."""
    V = cfg.vocab_size
    rows: list[tuple[str, tuple[Part, ...]]] = [
        ("wte.weight", (Part("token_embd.weight", rows=V),)), ("ln_f.weight", (Part("output_norm.weight"),)),
        *([] if cfg.tie_embeddings else [("lm_head.weight", (Part("output.weight", rows=V),))]),
        *(_gpt2_plan(cfg) if arch == "gpt2" else _llama_plan(cfg, arch))]
    out, used = [], {ROPE_FREQS}
    for name, parts in rows:
        for part in parts:
            if part.name not in f.tensors:
                raise ArtifactError(f"{f.path}: no tensor {part.name}, which this {arch} model has")
            used.add(part.name)
        shapes = [f.shape(p.name) for p in parts]
        got = (sum(min(s[0], p.rows or s[0]) for s, p in zip(shapes, parts, strict=True)), *shapes[0][1:])
        want = _shape(name, cfg)
        if got != want or any(s[1:] != shapes[0][1:] for s in shapes):
            raise ArtifactError(f"{f.path}: tensor {parts[0].name} has shape {shapes[0]}; the model its metadata "
                                f"describes needs {want} for gptport's {name}")
        out.append(Planned(name, want, parts))
    left = sorted(set(f.tensors) - used)
    if left:
        raise ArtifactError(f"{f.path}: tensor {left[0]} is not one a {arch} model of this metadata has")
    return out
