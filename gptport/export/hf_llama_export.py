"""export-hf of the Llama family: a gptport model written as the transformers class of its architecture, the
inverse of import-hf (each family's config.json and tensor names: gptport/arch/). LlamaForCausalLM (biases on q, k,
v and o together, MLP biases), Qwen2ForCausalLM (q/k/v biases only), Qwen3ForCausalLM (q/k norm),
MistralForCausalLM (a model import-hf read from one, or a window on every layer), Gemma3ForCausalLM (Gemma's
choices; 1 taken off its norms), Gemma2ForCausalLM (soft-capping, no q/k norm), GraniteForCausalLM (its
multipliers) and Olmo2ForCausalLM (norms after the sublayers only). config.json carries the shape, rope_theta and
rope_scaling (linear, llama3), num_key_value_heads, head_dim, rms_norm_eps, tie_word_embeddings, the sliding
window and the begin and end ids; model.safetensors holds transformers' names (c_attn split back into q_proj,
k_proj and v_proj). No torch: the weights are read and written with safetensors' numpy API."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from gptport import arch, atomic
from gptport import tokenizer as bpe
from gptport.arch import gemma2, gemma3, granite, olmo2
from gptport.arch.base import split_all
from gptport.config import ModelConfig
from gptport.errors import InputError
from gptport.export.hf_files import CHAT_TEMPLATE, GENERATION_CONFIG, SINGLE
from gptport.export.model_read import ModelFiles, read_weights
from gptport.paths import CHAT_TEMPLATES_DIR, CONFIG


def mismatches(cfg: ModelConfig) -> list[str]:
    """What keeps a gptport model from every Llama-family class of transformers (empty when one takes it)."""
    out = []
    for name, want in (("pos_encoding", "rope"), ("norm", "rmsnorm"), ("mlp", "swiglu")):
        if getattr(cfg, name) != want and not (name == "mlp" and cfg.mlp == "geglu"):  # geglu: Gemma's
            out.append(f"{name} is {getattr(cfg, name)!r} (the Llama family's is {want!r})")
    return out


def architecture(cfg: ModelConfig, source: dict[str, Any]) -> str:
    """The transformers architecture (model_type) whose class computes what `cfg` does: qwen3 for q/k norm,
    qwen2 for q/k/v biases alone, mistral for a model imported from MistralForCausalLM without biases, else
    llama; gemma3_text for Gemma's choices (GeGLU, post-norms, a window, ...); phi3 and smollm3 for their rope (or
    a model imported from theirs, each with its window); a combination no class has is refused naming it. A window
    alone is Mistral's (every layer, no biases), Qwen2's or Qwen3's (any layers)."""
    rope_class = rope_architecture(cfg, source)  # with its window (Phi-3's on every layer, SmolLM3's on any)
    if rope_class:
        return rope_class
    if replace(cfg, sliding_window=0).gemma_choices():  # Gemma's choices besides a window
        family = next((m for m in (gemma2, granite, olmo2) if m.claims(cfg)), gemma3)  # whose choices they are
        wrong = family.mismatches(cfg)
        if wrong:
            raise InputError(f"{', '.join(cfg.gemma_choices())} with {'; '.join(wrong)}: no transformers class "
                             "computes it")
        return family.FAMILIES[0].model_type
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
    if cfg.sliding_window and cfg.window_layers:
        if biased or len(cfg.window_layers) != cfg.n_layer:
            raise InputError(f"a sliding window of {cfg.sliding_window} on layers "
                             f"{', '.join(map(str, cfg.window_layers))} of {cfg.n_layer}"
                             f"{' with biases' if biased else ''} is no transformers class (Mistral's window is on "
                             "every layer, without biases; Qwen2's has q/k/v biases alone)")
        return "mistral"
    return "mistral" if source.get("architecture") == arch.family("mistral").hf_class and not biased else "llama"


def rope_architecture(cfg: ModelConfig, source: dict[str, Any]) -> str:
    """phi3 for partial rotary or LongRoPE, smollm3 for layers without rope, each also for a model imported from
    its class that it computes ("" for neither); refused naming why where the class cannot compute `cfg`."""
    from gptport.arch import phi3

    needs_phi3 = cfg.rotary_width != cfg.head_dim or cfg.rope_scaling == "longrope"
    if needs_phi3 or source.get("architecture") == phi3.PHI3.hf_class:
        bad = phi3.mismatches(cfg)
        if not bad:
            return "phi3"
        if needs_phi3:
            raise InputError(f"partial rotary or LongRoPE with {'; '.join(bad)} is no transformers class "
                             "(Phi3ForCausalLM's)")
    if cfg.no_rope_layers or source.get("architecture") == "SmolLM3ForCausalLM":
        bad = [what for what, used in (("q/k norm", cfg.qk_norm), ("q/k/v and output biases apart",
                                                                   cfg.has_qkv_bias != cfg.has_out_bias),
                                       (f"heads {cfg.q_width} wide over d_model {cfg.d_model}",
                                        cfg.q_width != cfg.d_model)) if used]
        if not bad:
            return "smollm3"
        if cfg.no_rope_layers:
            raise InputError(f"layers without rope with {'; '.join(bad)} are no transformers class "
                             "(SmolLM3ForCausalLM's)")
    return ""


def end_ids(cfg: ModelConfig, eot_id: int) -> list[int]:
    """The ids that end a sequence: config's eos_ids, the tokenizer's end-of-text for a model trained here."""
    return list(cfg.eos_ids) or [eot_id]


def hf_config(cfg: ModelConfig, model_type: str, eot_id: int) -> dict[str, Any]:
    """config.json of `model_type`'s class for `cfg` (the family's: gptport/arch/)."""
    return arch.family(model_type).hf_config(cfg, end_ids(cfg, eot_id))


def generation_config(cfg: ModelConfig, eot_id: int) -> dict[str, Any]:
    """generation_config.json: the begin id and every end id (transformers' generate stops on any)."""
    ends = end_ids(cfg, eot_id)
    return {"bos_token_id": cfg.bos_id, "eos_token_id": ends[0] if len(ends) == 1 else ends}


def hf_weights(state: dict[str, np.ndarray], cfg: ModelConfig, model_type: str = "llama") -> dict[str, np.ndarray]:
    """gptport's tensors (popped from `state`) under transformers' names, the family's plan split back: c_attn into
    q_proj, k_proj, v_proj; a tied head not stored (transformers ties it to the embedding)."""
    plan = arch.family(model_type).hf_plan(cfg, cfg.vocab_size)
    return dict(split_all(plan, state.pop))


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
    arch_name = architecture(cfg, model.source)
    state = hf_weights(read_weights(model.path, cfg), cfg, arch_name)
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
    atomic.write_text(out / CONFIG, json.dumps(hf_config(cfg, arch_name, eot_id), indent=2) + "\n")
    return [*written, *(out / n for n in names), out / GENERATION_CONFIG, out / CONFIG]
