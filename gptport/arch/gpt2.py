"""GPT-2 (GPT2LMHeadModel; llama.cpp's `gpt2`): LayerNorm with biases, GELU, learned positions, a key and value
head per query head, biases everywhere. transformers holds each Linear as a Conv1D, the transpose of gptport's
(out, in) matrix, under `transformer.` (older checkpoints without the prefix, and with causal-mask buffers);
llama.cpp stacks q|k|v as gptport does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptport.arch.base import Family, Layout, Specials, number, refused
from gptport.config import ModelConfig
from gptport.errors import InputError, UsageError

MODULES = ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")
GELU_NAMES = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "exact"}
KEYS = {"n_ctx": "n_positions", "d_model": "n_embd", "n_layer": "n_layer", "n_head": "n_head", "d_ff": "n_inner",
        "ln_eps": "layer_norm_epsilon"}  # ModelConfig's field -> GPT-2's config.json key
HF_LAYOUT = Layout({"wte": "transformer.wte", "wpe": "transformer.wpe", "ln_f": "transformer.ln_f",
                    "lm_head": "lm_head"}, "transformer.h.{i}.", {m: m for m in MODULES},
                   transposed=frozenset(MODULES[1:3] + MODULES[4:]))
GGUF_LAYOUT = Layout({"wte": "token_embd", "wpe": "position_embd", "ln_f": "output_norm", "lm_head": "output"},
                     "blk.{i}.", {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
                                  "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"})


def mismatches(cfg: ModelConfig) -> list[str]:
    """What keeps a gptport model from being a transformers GPT-2 (empty when it is one)."""
    out = []
    if cfg.pos_encoding != "learned":
        out.append(f"pos_encoding is {cfg.pos_encoding!r} (GPT-2 learns its positions)")
    if cfg.gelu != "tanh":
        out.append(f"gelu is {cfg.gelu!r} (GPT-2 uses the tanh approximation)")
    if not cfg.bias:
        out.append("bias is false (GPT-2 has biases in every Linear and LayerNorm)")
    for name, gpt2 in (("norm", "layernorm"), ("mlp", "gelu")):
        if getattr(cfg, name) != gpt2:
            out.append(f"{name} is {getattr(cfg, name)!r} (GPT-2's is {gpt2!r})")
    if cfg.n_kv_head != cfg.n_head:
        out.append(f"n_kv_head is {cfg.n_kv_head} (GPT-2 has a key and value head per query head)")
    if cfg.q_width != cfg.d_model:
        out.append(f"n_head * head_dim is {cfg.q_width}, not d_model {cfg.d_model}")
    if cfg.qk_norm:
        out.append("qk_norm is true (GPT-2 does not normalise q and k)")
    return out


@dataclass(frozen=True)
class GPT2(Family):
    def canonical(self, name: str) -> str:
        return name if name.startswith("transformer.") or name == "lm_head.weight" else f"transformer.{name}"

    def model_config(self, hf: Mapping[str, Any], vocab_size: int, tokens: Specials | None, where: Path
                     ) -> ModelConfig:
        act = hf.get("activation_function", "gelu_new")
        if act not in GELU_NAMES:
            raise InputError(f"{where}: activation_function {act!r} is not a GELU gptport has")
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
            if hf.get(flag):
                raise InputError(f"{where}: {flag} is set; gptport's GPT does not have it")
        shape = {key: number(hf, key, where, positive=True) for key in ("n_positions", "n_embd", "n_layer", "n_head")}
        try:
            return ModelConfig(vocab_size=vocab_size, n_ctx=shape["n_positions"], d_model=shape["n_embd"],
                               n_layer=shape["n_layer"], n_head=shape["n_head"],
                               d_ff=number(hf, "n_inner", where, 4 * shape["n_embd"], positive=True), dropout=0.0,
                               bias=True, pos_encoding="learned", tie_embeddings=bool(hf.get("tie_word_embeddings",
                                                                                             True)),
                               ln_eps=number(hf, "layer_norm_epsilon", where, 1e-5, kind=float),
                               gelu=GELU_NAMES[act])  # type: ignore[arg-type]
        except UsageError as e:  # a shape gptport's model cannot have, said by ModelConfig with config.json's keys
            raise refused(e, KEYS, where) from e

    def hf_config(self, cfg: ModelConfig, ends: list[int]) -> dict[str, Any]:
        """transformers' GPT2Config (also what transformers.js reads of export-web's bundle)."""
        return {
            "architectures": [self.hf_class], "model_type": self.model_type, "vocab_size": cfg.vocab_size,
            "n_positions": cfg.n_ctx, "n_embd": cfg.d_model, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
            "n_inner": cfg.d_ff, "activation_function": "gelu_new", "layer_norm_epsilon": cfg.ln_eps,
            "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.dropout,
            "initializer_range": 0.02, "scale_attn_weights": True, "use_cache": True,
            "tie_word_embeddings": cfg.tie_embeddings, "bos_token_id": ends[0], "eos_token_id": ends[0]}


GPT2_FAMILY = GPT2("gpt2", "GPT2LMHeadModel", "gpt2", hf_layout=HF_LAYOUT, gguf_layout=GGUF_LAYOUT,
                   hf_skipped=(".attn.bias", ".attn.masked_bias"),
                   gguf_keys=frozenset({"context_length", "embedding_length", "block_count", "feed_forward_length",
                                        "attention.head_count", "attention.layer_norm_epsilon", "vocab_size"}))
FAMILIES = (GPT2_FAMILY,)
