"""export-hf of the Llama family: a gptport model written as the transformers class of its architecture, the
inverse of hf_llama.py. LlamaForCausalLM (biases on q, k, v and o together, MLP biases), Qwen2ForCausalLM (q/k/v
biases only), Qwen3ForCausalLM (q/k norm) and MistralForCausalLM (a model import-hf read from one). config.json
carries the shape, rope_theta and rope_scaling (linear, llama3), num_key_value_heads, head_dim, rms_norm_eps,
tie_word_embeddings and the begin and end ids; model.safetensors holds transformers' names (c_attn split back
into q_proj, k_proj and v_proj). No torch: the weights are read and written with safetensors' numpy API."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from gptport import atomic
from gptport import tokenizer as bpe
from gptport.config import ModelConfig
from gptport.errors import InputError
from gptport.export.hf_files import CHAT_TEMPLATE, GENERATION_CONFIG, SINGLE
from gptport.export.hf_llama import FAMILY
from gptport.export.model_read import ModelFiles, read_weights
from gptport.paths import CHAT_TEMPLATES_DIR, CONFIG


def mismatches(cfg: ModelConfig) -> list[str]:
    """What keeps a gptport model from every Llama-family class of transformers (empty when one takes it)."""
    out = []
    for name, want in (("pos_encoding", "rope"), ("norm", "rmsnorm"), ("mlp", "swiglu")):
        if getattr(cfg, name) != want:
            out.append(f"{name} is {getattr(cfg, name)!r} (the Llama family's is {want!r})")
    return out


def architecture(cfg: ModelConfig, source: dict[str, Any]) -> str:
    """The transformers architecture (model_type) whose class computes what `cfg` does: qwen3 for q/k norm,
    qwen2 for q/k/v biases alone, mistral for a model imported from MistralForCausalLM without biases, else
    llama; a combination no class has is refused naming it."""
    if cfg.qk_norm:
        if cfg.has_qkv_bias != cfg.has_out_bias or cfg.has_mlp_bias:
            raise InputError("q/k norm with these biases (q/k/v "
                             f"{cfg.has_qkv_bias}, output {cfg.has_out_bias}, MLP {cfg.has_mlp_bias}) is no "
                             "transformers class: Qwen3's attention_bias sets q, k, v and o together, no MLP bias")
        return "qwen3"
    if cfg.has_qkv_bias and not cfg.has_out_bias and not cfg.has_mlp_bias:
        if cfg.q_width != cfg.d_model:
            raise InputError(f"q/k/v biases with heads {cfg.q_width} wide over d_model {cfg.d_model} are no "
                             "transformers class (Qwen2's heads are d_model wide; Llama's biases include o)")
        return "qwen2"
    if cfg.has_qkv_bias != cfg.has_out_bias:
        raise InputError("an output-projection bias without q/k/v biases is no transformers class (Llama's "
                         "attention_bias sets all four)")
    biased = cfg.has_qkv_bias or cfg.has_mlp_bias
    return "mistral" if source.get("architecture") == FAMILY["mistral"] and not biased else "llama"


def _rope_scaling(cfg: ModelConfig) -> dict[str, Any] | None:
    """config.json's rope_scaling, as transformers 4.x writes it (5.x reads it into rope_parameters)."""
    if cfg.rope_scaling == "linear":
        return {"rope_type": "linear", "factor": cfg.rope_factor}
    if cfg.rope_scaling == "llama3":
        return {"rope_type": "llama3", "factor": cfg.rope_factor, "low_freq_factor": cfg.rope_low_freq_factor,
                "high_freq_factor": cfg.rope_high_freq_factor,
                "original_max_position_embeddings": cfg.rope_original_n_ctx}
    return None


def end_ids(cfg: ModelConfig, eot_id: int) -> list[int]:
    """The ids that end a sequence: config's eos_ids, the tokenizer's end-of-text for a model trained here."""
    return list(cfg.eos_ids) or [eot_id]


def hf_config(cfg: ModelConfig, arch: str, eot_id: int) -> dict[str, Any]:
    """config.json of `arch`'s class for `cfg` (every key hf_llama.py reads back to the same ModelConfig)."""
    ends = end_ids(cfg, eot_id)
    out: dict[str, Any] = {
        "architectures": [FAMILY[arch]], "model_type": arch, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_kv_head,
        "max_position_embeddings": cfg.n_ctx, "hidden_act": "silu", "rms_norm_eps": cfg.ln_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": _rope_scaling(cfg), "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": cfg.bos_id, "eos_token_id": ends[0] if len(ends) == 1 else ends,
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True, "torch_dtype": "float32"}
    if arch in ("llama", "mistral", "qwen3"):
        out["head_dim"] = cfg.head_dim
    if arch in ("llama", "qwen3"):
        out["attention_bias"] = cfg.has_qkv_bias
    if arch == "llama":
        out["mlp_bias"] = cfg.has_mlp_bias
    if arch == "mistral":
        out["sliding_window"] = None  # import-hf cut n_ctx to the window, inside which attention is whole
    if arch in ("qwen2", "qwen3"):
        out.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.n_layer)
    return out


def generation_config(cfg: ModelConfig, eot_id: int) -> dict[str, Any]:
    """generation_config.json: the begin id and every end id (transformers' generate stops on any)."""
    ends = end_ids(cfg, eot_id)
    return {"bos_token_id": cfg.bos_id, "eos_token_id": ends[0] if len(ends) == 1 else ends}


def hf_weights(state: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """gptport's tensors under transformers' names: c_attn split into q_proj, k_proj, v_proj; a tied head not
    stored (transformers ties it to the embedding)."""
    out = {"model.embed_tokens.weight": state["wte.weight"], "model.norm.weight": state["ln_f.weight"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"]
    q, kv = cfg.q_width, cfg.kv_width
    for i in range(cfg.n_layer):
        ours, hf = f"h.{i}.", f"model.layers.{i}."
        out[hf + "input_layernorm.weight"] = state[ours + "ln_1.weight"]
        out[hf + "post_attention_layernorm.weight"] = state[ours + "ln_2.weight"]
        for kind in ["weight", *(["bias"] if cfg.has_qkv_bias else [])]:
            w = state[f"{ours}attn.c_attn.{kind}"]
            for x, part in zip("qkv", (w[:q], w[q:q + kv], w[q + kv:]), strict=True):
                out[f"{hf}self_attn.{x}_proj.{kind}"] = part
        for kind in ["weight", *(["bias"] if cfg.has_out_bias else [])]:
            out[f"{hf}self_attn.o_proj.{kind}"] = state[f"{ours}attn.c_proj.{kind}"]
        if cfg.qk_norm:
            out[hf + "self_attn.q_norm.weight"] = state[ours + "attn.q_norm.weight"]
            out[hf + "self_attn.k_norm.weight"] = state[ours + "attn.k_norm.weight"]
        for mine, theirs in (("c_gate", "gate_proj"), ("c_fc", "up_proj"), ("c_proj", "down_proj")):
            for kind in ["weight", *(["bias"] if cfg.has_mlp_bias else [])]:
                out[f"{hf}mlp.{theirs}.{kind}"] = state[f"{ours}mlp.{mine}.{kind}"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def tokenizer_files(model_dir: Path) -> list[str]:
    """The tokenizer's files transformers reads, as the model directory holds them (relative paths):
    tokenizer.json, tokenizer_config.json, chat_template.jinja and additional_chat_templates/NAME.jinja."""
    names = [bpe.TOKENIZER_FILE, bpe.HF_CONFIG_FILE, CHAT_TEMPLATE]
    named = model_dir / CHAT_TEMPLATES_DIR
    if named.is_dir():
        names += [f"{CHAT_TEMPLATES_DIR}/{p.name}" for p in sorted(named.glob("*.jinja")) if p.is_file()]
    return [n for n in names if (model_dir / n).is_file()]


def export(model: ModelFiles, out: Path) -> list[Path]:
    """Write `model` into `out` as transformers' directory of its architecture's class (each file atomically;
    config.json last, so a directory with config.json has every file before it)."""
    from safetensors.numpy import save_file

    cfg = model.cfg
    arch = architecture(cfg, model.source)
    state = hf_weights(read_weights(model.path, cfg), cfg)
    eot_id = model.tok.eot_id
    out.mkdir(parents=True, exist_ok=True)
    with atomic.atomic_path(out / SINGLE) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    written = [out / SINGLE]
    names = tokenizer_files(model.path)
    if (out / CHAT_TEMPLATES_DIR).is_dir():
        shutil.rmtree(out / CHAT_TEMPLATES_DIR)  # the named templates of an earlier export, replaced whole
    for name in names:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        atomic.write_bytes(out / name, (model.path / name).read_bytes())
    gen = model.path / GENERATION_CONFIG
    text = gen.read_text(encoding="utf-8") if gen.is_file() else json.dumps(generation_config(cfg, eot_id), indent=2)
    atomic.write_text(out / GENERATION_CONFIG, text if text.endswith("\n") else text + "\n")
    atomic.write_text(out / CONFIG, json.dumps(hf_config(cfg, arch, eot_id), indent=2) + "\n")
    return [*written, *(out / n for n in names), out / GENERATION_CONFIG, out / CONFIG]
