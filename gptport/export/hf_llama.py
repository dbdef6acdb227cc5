"""The Llama family in transformers' format, mapped to gptport's: LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM (q/k/v biases) and Qwen3ForCausalLM (q/k norm). config.json's keys become a ModelConfig
(each key is used, ignored because it does not change what the model computes, or refused by name), and
the weights' names become gptport's (q, k and v stacked into c_attn, gate/up/down into c_gate/c_fc/c_proj).
No torch at import; the weight mapping takes the tensors it is given."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptport.config import ModelConfig
from gptport.errors import ArtifactError, InputError, UsageError, escaped

if TYPE_CHECKING:
    import torch

    from gptport.export.hf_files import Specials

FAMILY = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
          "qwen3": "Qwen3ForCausalLM"}
SHAPE = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "max_position_embeddings")  # required
USED = {*SHAPE, "architectures", "model_type", "num_key_value_heads", "rms_norm_eps", "rope_theta", "rope_scaling",
        "rope_parameters", "tie_word_embeddings", "hidden_act", "bos_token_id", "eos_token_id"}
EXTRA = {  # the keys each architecture's transformers class reads besides USED
    "llama": {"attention_bias", "mlp_bias", "head_dim"},
    "mistral": {"head_dim", "sliding_window"},
    "qwen2": {"sliding_window", "use_sliding_window", "max_window_layers", "layer_types", "use_mrope"},
    "qwen3": {"attention_bias", "head_dim", "sliding_window", "use_sliding_window", "max_window_layers",
              "layer_types"},
}
IGNORED = {  # keys that do not change what the model computes at inference
    "initializer_range", "attention_dropout", "use_cache", "torch_dtype", "dtype", "transformers_version",
    "pad_token_id", "pretraining_tp", "_name_or_path", "output_attentions", "output_hidden_states", "return_dict",
}
ROPE_KEYS = {"rope_theta", "rope_type", "type", "factor", "low_freq_factor", "high_freq_factor",
             "original_max_position_embeddings", "partial_rotary_factor"}
ROPE_TYPES = {"default": "none", "linear": "linear", "llama3": "llama3"}
SKIPPED = ("rotary_emb.inv_freq",)  # buffers older checkpoints saved: computed from the config here
KEYS = {"n_ctx": "max_position_embeddings", "d_model": "hidden_size", "n_layer": "num_hidden_layers",
        "n_head": "num_attention_heads", "n_kv_head": "num_key_value_heads", "head_dim": "head_dim",
        "d_ff": "intermediate_size", "ln_eps": "rms_norm_eps", "rope_theta": "rope_theta", "rope_factor": "factor",
        "rope_low_freq_factor": "low_freq_factor", "rope_high_freq_factor": "high_freq_factor",
        "rope_original_n_ctx": "original_max_position_embeddings"}  # ModelConfig's field -> config.json's key


def family(hf: dict[str, Any]) -> str | None:
    """The Llama-family architecture config.json declares (its model_type or its architectures), else None."""
    if hf.get("model_type") in FAMILY:
        return str(hf["model_type"])
    archs = hf.get("architectures") or []
    return next((k for k, v in FAMILY.items() if isinstance(archs, list) and v in archs), None)


def number(hf: dict[str, Any], key: str, where: Path, default: Any = None, kind: type = int,
           positive: bool = False) -> Any:
    """config.json's `key` (or `default` when absent or null) as an int or a float, refused naming the key (and
    refused when not above 0, where `positive`)."""
    value = hf.get(key)
    if value is None:
        value = default
    if value is None:
        raise InputError(f"{where}: no {key}")
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise InputError(f"{where}: {key} must be {'a number' if kind is float else 'an integer'}, not {value!r:.40}")
    if positive and not value > 0:
        raise InputError(f"{where}: {key} must be positive, not {value}")
    return kind(value)


def refused(e: UsageError, keys: dict[str, str], where: Path) -> InputError:
    """ModelConfig's refusal of a config.json's shape, said with the file's own keys (`keys`: ModelConfig's
    field -> config.json's key): "num_hidden_layers must be at most 4,096", not "model.n_layer ..."."""
    return InputError(f"{where}: " + re.sub(r"model\.(\w+)", lambda m: keys.get(m[1], m[0]), str(e)))


def _check_keys(hf: dict[str, Any], arch: str, where: Path) -> None:
    unknown = sorted(set(hf) - USED - EXTRA[arch] - IGNORED)
    if unknown:
        raise InputError(f"{where}: key {unknown[0]!r} is not one gptport knows for a {arch} model "
                         f"({FAMILY[arch]}); refusing rather than importing a model that may compute otherwise")
    archs = hf.get("architectures")
    if archs is not None and archs != [FAMILY[arch]]:
        raise InputError(f"{where}: architectures {archs} is not [{FAMILY[arch]!r}] (a causal language model)")
    if hf.get("hidden_act", "silu") != "silu":
        raise InputError(f"{where}: hidden_act {hf['hidden_act']!r} is not silu (SwiGLU's)")
    if hf.get("use_mrope"):
        raise InputError(f"{where}: use_mrope is true (multimodal rotary positions), which gptport does not have")


def _rope(hf: dict[str, Any], where: Path) -> dict[str, Any]:
    """rope_parameters (transformers 5) or rope_theta + rope_scaling (4.x) as ModelConfig's rope keys."""
    params = hf.get("rope_parameters")
    if params is None:
        params = {"rope_theta": hf.get("rope_theta", 10000.0), **(hf.get("rope_scaling") or {})}
    if not isinstance(params, dict):
        raise InputError(f"{where}: rope_parameters must be an object, not {params!r}")
    params = {"rope_theta": hf.get("rope_theta", 10000.0), **params}
    unknown = sorted(set(params) - ROPE_KEYS)
    if unknown:
        raise InputError(f"{where}: rope key {unknown[0]!r} is not one gptport knows")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise InputError(f"{where}: rope type {kind!r} is not one gptport has ({', '.join(ROPE_TYPES)})")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise InputError(f"{where}: partial_rotary_factor {params['partial_rotary_factor']} (gptport rotates whole "
                         "heads)")
    out: dict[str, Any] = {"pos_encoding": "rope", "rope_theta": number(params, "rope_theta", where, kind=float),
                           "rope_scaling": ROPE_TYPES[kind]}
    if kind in ("linear", "llama3"):
        out["rope_factor"] = number(params, "factor", where, kind=float)
    if kind == "llama3":
        out["rope_low_freq_factor"] = number(params, "low_freq_factor", where, kind=float)
        out["rope_high_freq_factor"] = number(params, "high_freq_factor", where, kind=float)
        out["rope_original_n_ctx"] = number(params, "original_max_position_embeddings", where,
                                             hf.get("max_position_embeddings"))
    return out


def _n_ctx(hf: dict[str, Any], arch: str, where: Path) -> int:
    """max_position_embeddings, or the sliding window where one is in effect: within it every layer sees
    its whole context, so gptport's full attention computes the same."""
    n_ctx = number(hf, "max_position_embeddings", where)
    layer_types = hf.get("layer_types") or []
    odd = [t for t in layer_types if t not in ("full_attention", "sliding_attention")]
    if odd:
        raise InputError(f"{where}: layer type {odd[0]!r} is not one gptport has")
    window = hf.get("sliding_window") if arch == "mistral" or hf.get("use_sliding_window") else None
    return n_ctx if window is None else min(n_ctx, number(hf, "sliding_window", where, positive=True))


def model_config(hf: dict[str, Any], arch: str, vocab_size: int, tokens: Specials, where: Path) -> ModelConfig:
    """The ModelConfig of a Llama-family config.json (`vocab_size`: the tokenizer's, which may be smaller)."""
    _check_keys(hf, arch, where)
    for key in SHAPE:
        number(hf, key, where, positive=True)
    n_head = number(hf, "num_attention_heads", where)
    d_model = number(hf, "hidden_size", where)
    default_hd = 128 if arch == "qwen3" else d_model // n_head  # each class's default when head_dim is absent
    attention_bias = bool(hf.get("attention_bias", False))
    values: dict[str, Any] = {
        "vocab_size": vocab_size, "n_ctx": _n_ctx(hf, arch, where), "d_model": d_model,
        "n_layer": number(hf, "num_hidden_layers", where), "n_head": n_head,
        "n_kv_head": number(hf, "num_key_value_heads", where, n_head, positive=True),
        "head_dim": number(hf, "head_dim", where, default_hd, positive=True),
        "d_ff": number(hf, "intermediate_size", where),
        "dropout": 0.0, "bias": False, "norm": "rmsnorm", "mlp": "swiglu",
        "ln_eps": number(hf, "rms_norm_eps", where, 1e-6, kind=float),
        "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "qkv_bias": arch == "qwen2" or attention_bias, "out_bias": attention_bias,
        "mlp_bias": bool(hf.get("mlp_bias", False)), "qk_norm": arch == "qwen3",
        "bos_id": tokens.bos_id, "add_bos": tokens.add_bos, "eos_ids": tokens.eos_ids, **_rope(hf, where)}
    try:
        return ModelConfig(**values)
    except UsageError as e:  # a shape gptport's model cannot have, said by ModelConfig with config.json's keys
        raise refused(e, KEYS, where) from e


def gptport_weights(state: dict[str, torch.Tensor], cfg: ModelConfig, where: Path) -> dict[str, torch.Tensor]:
    """transformers' tensors under gptport's names (q, k, v stacked in c_attn; the embedding and an untied
    head cut to the tokenizer's vocabulary). A tensor missing, or one left over, is refused by name."""
    import torch

    src = {k: v for k, v in state.items() if not k.endswith(SKIPPED)}

    def take(name: str) -> torch.Tensor:
        if name not in src:
            raise ArtifactError(f"{where}: no tensor {name}, which this config.json's model has")
        return src.pop(name)

    V = cfg.vocab_size
    out = {"wte.weight": take("model.embed_tokens.weight")[:V], "ln_f.weight": take("model.norm.weight")}
    if cfg.tie_embeddings:
        src.pop("lm_head.weight", None)  # a tied head saved anyway: the embedding is the one read
    else:
        out["lm_head.weight"] = take("lm_head.weight")[:V]
    for i in range(cfg.n_layer):
        hf, ours = f"model.layers.{i}.", f"h.{i}."
        out[ours + "ln_1.weight"] = take(hf + "input_layernorm.weight")
        out[ours + "ln_2.weight"] = take(hf + "post_attention_layernorm.weight")
        kinds = ["weight", *(["bias"] if cfg.has_qkv_bias else [])]
        for kind in kinds:  # [q | k | v] along the output: (H*hd + 2*Hkv*hd, D)
            out[f"{ours}attn.c_attn.{kind}"] = torch.cat([take(f"{hf}self_attn.{x}_proj.{kind}") for x in "qkv"])
        for kind in ["weight", *(["bias"] if cfg.has_out_bias else [])]:
            out[f"{ours}attn.c_proj.{kind}"] = take(f"{hf}self_attn.o_proj.{kind}")
        if cfg.qk_norm:
            out[ours + "attn.q_norm.weight"] = take(hf + "self_attn.q_norm.weight")
            out[ours + "attn.k_norm.weight"] = take(hf + "self_attn.k_norm.weight")
        for theirs, mine in (("gate_proj", "c_gate"), ("up_proj", "c_fc"), ("down_proj", "c_proj")):
            for kind in ["weight", *(["bias"] if cfg.has_mlp_bias else [])]:
                out[f"{ours}mlp.{mine}.{kind}"] = take(f"{hf}mlp.{theirs}.{kind}")
    if src:
        raise ArtifactError(f"{where}: tensor {escaped(sorted(src)[0])} is not one this config.json's model has")
    return out
