"""Granite's family (gptport/arch/granite.py) without torch: ibm-granite/granite-3.1-2b-instruct's config.json
read as its model (the four multipliers in ModelConfig's fields), export-hf's config.json read back as the same
ModelConfig, and export-hf picking Granite for a multiplier and Llama without one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gptport import arch
from gptport.arch import granite
from gptport.arch.base import Specials
from gptport.export.hf_llama_export import architecture

TOKENS = Specials(0, False, (0,), 0)
GRANITE_2B = {"architectures": ["GraniteForCausalLM"], "attention_bias": False, "attention_dropout": 0.1,
              "attention_multiplier": 0.015625, "bos_token_id": 0, "embedding_multiplier": 12.0, "eos_token_id": 0,
              "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
              "logits_scaling": 8.0, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "granite",
              "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "pad_token_id": 0,
              "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 5000000.0,
              "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.47.0",
              "use_cache": True, "vocab_size": 49155}


def test_granite_3_1_2bs_config_json() -> None:
    cfg = arch.family("granite").model_config(GRANITE_2B, 49155, TOKENS, Path("config.json"))
    assert (cfg.embed_scale, cfg.attn_scale, cfg.residual_scale, cfg.logits_divisor) == (12.0, 0.015625, 0.22, 8.0)
    assert (cfg.n_kv_head, cfg.head_dim, cfg.tie_embeddings) == (8, 64, True)
    assert 2.53e9 < cfg.n_params() < 2.54e9  # granite-3.1-2b: 2,533,531,648


def test_export_hfs_config_reads_back_and_picks_granite() -> None:
    family = arch.family("granite")
    cfg = family.model_config(GRANITE_2B, 49155, TOKENS, Path("config.json"))
    assert family.model_config(family.hf_config(cfg, [0]), 49155, TOKENS, Path("config.json")) == cfg
    assert architecture(cfg, {}) == "granite" and granite.claims(replace(cfg, residual_scale=1.0, logits_divisor=1.0))
    plain = replace(cfg, embed_scale=1.0, attn_scale=0.0, residual_scale=1.0, logits_divisor=1.0)
    assert not granite.claims(plain) and architecture(plain, {}) == "llama"
