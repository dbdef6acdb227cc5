"""The Llama family as llama.cpp's GGUF architectures, as its convert_hf_to_gguf.py writes them: `llama` (Llama,
Mistral, SmolLM, a model trained here with --preset llama-tiny; biases where the model has them), `qwen2` (q/k/v
biases alone), `qwen3` (q/k norm), `gemma3` (Gemma's choices: gptport/arch/gemma3.py) and `gemma2`, `granite` and
`olmo2` (each family module's gguf_mismatches and gguf_write). The tensors are the
family's GGUF plan split back (gptport/arch/: for
`llama`, each q and k head's rows permuted from halves order to interleaved pairs, biases too). Llama 3's rope
scaling goes in as the frequency factors of rope_freqs.weight, computed as the converter computes them; linear
scaling as rope.scaling.type and factor. No torch."""

from __future__ import annotations

import math
from dataclasses import replace

import gguf
import numpy as np

from gptport import arch
from gptport.arch import gemma2, gemma3, granite, olmo2, phi3, smollm3
from gptport.arch.base import split_all
from gptport.config import ModelConfig
from gptport.errors import InputError

ROPE_FREQS = "rope_freqs.weight"


def architecture(cfg: ModelConfig) -> str:
    """The llama.cpp architecture that computes what `cfg` does (as the converter picks it for the transformers
    class export-hf writes); a combination none of them has is refused naming it (a window but Gemma's: llama.cpp's
    llama, qwen2, qwen3, phi3 and smollm3 attend to every position)."""
    name = _pick(cfg)
    family = arch.from_gguf(name)
    if cfg.rope_scaling == "llama3" and not (family is not None and family.rope_freqs):
        raise InputError(f"Llama 3's rope scaling: llama.cpp's {name} architecture applies no rope_freqs")
    return name


def note(cfg: ModelConfig, arch_name: str) -> str:
    """When llama.cpp computes what gptport does, where not always ('' where always: Phi-3's LongRoPE)."""
    return phi3.gguf_note(cfg) if arch_name == "phi3" else ""


def _pick(cfg: ModelConfig) -> str:
    special = ((phi3, cfg.rotary_width != cfg.head_dim or cfg.rope_scaling == "longrope"),
               (smollm3, bool(cfg.no_rope_layers)), *((m, m.claims(cfg)) for m in (gemma2, granite, olmo2)))
    family = next((m for m, claimed in special if claimed), None)
    if family is not None:  # llama.cpp's phi3, smollm3, gemma2, granite and olmo2 (records 0050, 0052)
        name, wrong = family.FAMILIES[0].gguf_arch, family.gguf_mismatches(cfg)
        if wrong:
            chosen = ", ".join(cfg.gemma_choices()) or f"{family.FAMILIES[0].hf_class}'s choices"
            raise InputError(f"{chosen} with {'; '.join(wrong)}: llama.cpp's {name} does not compute it")
        return str(name)
    if replace(cfg, sliding_window=0).gemma_choices():  # Gemma's choices besides a window
        wrong = gemma3.gguf_mismatches(cfg)
        if wrong:
            raise InputError(f"{', '.join(cfg.gemma_choices())} with {'; '.join(wrong)}: no llama.cpp architecture "
                             "computes it")
        return "gemma3"
    biased = cfg.has_qkv_bias or cfg.has_out_bias or cfg.has_mlp_bias
    if cfg.sliding_window and cfg.window_layers:
        raise InputError(f"a sliding window of {cfg.sliding_window} (layers {', '.join(map(str, cfg.window_layers))}): "
                         "llama.cpp's llama, qwen2 and qwen3 architectures have none (they attend to every position); "
                         "refusing rather than writing a model that computes otherwise past the window")
    if cfg.qk_norm:
        if biased:
            raise InputError("q/k norm with biases: llama.cpp's qwen3 architecture has neither q/k/v, output nor MLP "
                             "biases")
        arch = "qwen3"
    elif cfg.has_qkv_bias and not cfg.has_out_bias and not cfg.has_mlp_bias and cfg.q_width == cfg.d_model \
            and cfg.rope_scaling != "llama3":
        arch = "qwen2"
    else:
        if cfg.has_qkv_bias and cfg.q_width != cfg.d_model:
            raise InputError(f"q/k/v biases with heads {cfg.q_width} wide over d_model {cfg.d_model}: llama.cpp's "
                             "llama architecture takes q biases d_model wide")
        return "llama"
    if cfg.rope_scaling == "llama3":
        raise InputError(f"Llama 3's rope scaling with {'q/k norm' if cfg.qk_norm else 'q/k/v biases'}: llama.cpp's "
                         f"{arch} architecture applies no rope_freqs")
    return arch


def llama3_factors(cfg: ModelConfig) -> np.ndarray:
    """rope_freqs.weight: Llama 3's frequency factors, as LlamaModel.generate_extra_tensors computes them (llama.cpp
    divides each frequency by its factor)."""
    dim = cfg.head_dim
    freqs = 1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    old, low, high = cfg.rope_original_n_ctx, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq  # float32, as the converter's torch scalars
        smooth = (old / wavelen - low) / (high - low)
        out.append(1.0 if wavelen < old / high else cfg.rope_factor if wavelen > old / low
                   else 1 / ((1 - smooth) / cfg.rope_factor + smooth))
    return np.array(out, dtype=np.float32)


def tensors(state: dict[str, np.ndarray], cfg: ModelConfig, arch_name: str) -> list[tuple[str, np.ndarray]]:
    """gptport's tensors (popped from `state` as they are taken) under the architecture's GGUF names (GPT-2's `gpt2`
    too), its family's plan split back (c_attn into attn_q, attn_k and attn_v, permuted for `llama`; GPT-2's kept
    whole as attn_qkv), rope_freqs.weight for Llama 3's scaling (where the architecture applies it)."""
    family = arch.from_gguf(arch_name)
    if family is None:
        raise InputError(f"llama.cpp's {arch_name} is no architecture gptport writes")
    out = []
    if cfg.rope_scaling == "llama3" and family.rope_freqs:
        out.append((ROPE_FREQS, llama3_factors(cfg)))
    if cfg.rope_scaling == "longrope":  # phi3's factor tensors, as its converter writes them
        out += [(name, np.array(getattr(cfg, ours), dtype=np.float32)) for ours, name in phi3.FACTORS.items()]
    out += split_all(family.gguf_plan(cfg, cfg.vocab_size), state.pop)
    if state:
        raise InputError(f"tensor {sorted(state)[0]} has no place in llama.cpp's {arch_name} architecture")
    return [(name, np.ascontiguousarray(a, dtype=np.float32)) for name, a in out]


def add_metadata(writer: gguf.GGUFWriter, cfg: ModelConfig) -> None:
    """The architecture's hyperparameters (writer.arch's prefix): shape, heads, RMSNorm's epsilon, RoPE."""
    writer.add_block_count(cfg.n_layer)
    writer.add_context_length(cfg.n_ctx)
    writer.add_embedding_length(cfg.d_model)
    writer.add_feed_forward_length(cfg.d_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_kv_head)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.ln_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_rope_dimension_count(cfg.rotary_width)
    if cfg.window_layers and cfg.sliding_window:  # gemma3's window: its size, its layers, their RoPE base
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_sliding_window_pattern([cfg.windowed(i) for i in range(cfg.n_layer)])
        writer.add_rope_freq_base_swa(cfg.rope_local_theta or cfg.rope_theta)
    if cfg.q_width != cfg.d_model or writer.arch in ("gemma2", "gemma3"):  # heads wider than d_model / n_head
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
    family = arch.from_gguf(writer.arch)
    if family is not None:
        family.gguf_write(writer, cfg)  # the family's own keys (gemma2's caps, granite's multipliers)
    if cfg.rope_scaling == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(cfg.rope_factor)
    elif cfg.rope_scaling == "llama3":  # the factors are rope_freqs.weight; the context import-gguf reads them with
        writer.add_rope_scaling_orig_ctx_len(cfg.rope_original_n_ctx)
