"""Gemma 2's family (gptport/arch/gemma2.py) without torch: google/gemma-2-2b's config.json (no layer_types: the
even layers are the window ones) read as its model, soft-caps included; export-hf's config.json reads back as the
same ModelConfig; export-hf picks Gemma 2 for soft-capping or GeGLU without q/k norm, Gemma 3 otherwise."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from gptport import arch
from gptport.arch import gemma2
from gptport.arch.base import Specials
from gptport.config import ModelConfig
from gptport.errors import InputError, UsageError
from gptport.export.hf_llama_export import architecture

TOKENS = Specials(2, True, (1,), 1)
GEMMA_2_2B = {"architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
              "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
              "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
              "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2",
              "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
              "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
              "torch_dtype": "float32", "transformers_version": "4.42.4", "use_cache": True, "vocab_size": 256000}


def test_gemma_2_2bs_config_json() -> None:
    cfg = arch.family("gemma2").model_config(GEMMA_2_2B, 256000, TOKENS, Path("config.json"))
    assert (cfg.attn_softcap, cfg.final_softcap, cfg.attn_scale, cfg.embed_scale) == (50.0, 30.0, 1 / 16,
                                                                                      math.sqrt(2304))
    assert cfg.window_layers == tuple(range(0, 26, 2)) and cfg.sliding_window == 4096 and not cfg.qk_norm
    assert 2.6e9 < cfg.n_params() < 2.62e9  # Gemma 2 2B: 2,614,341,888


def test_export_hfs_config_reads_back_as_the_same_model() -> None:
    family = arch.family("gemma2")
    cfg = family.model_config(GEMMA_2_2B, 256000, TOKENS, Path("config.json"))
    written = family.hf_config(cfg, [1])
    assert written["attn_logit_softcapping"] == 50.0 and written["layer_types"][:2] == ["sliding_attention",
                                                                                         "full_attention"]
    assert family.model_config(written, 256000, TOKENS, Path("config.json")) == cfg


def test_export_hf_picks_the_gemma_family_by_its_choices() -> None:
    cfg = arch.family("gemma2").model_config(GEMMA_2_2B, 256000, TOKENS, Path("config.json"))
    assert architecture(cfg, {}) == "gemma2" and gemma2.claims(replace(cfg, attn_softcap=0.0, final_softcap=0.0))
    assert architecture(replace(cfg, attn_softcap=0.0, final_softcap=0.0, qk_norm=True), {}) == "gemma3_text"
    with pytest.raises(InputError, match="qk_norm is True \\(Gemma 2's is False\\)"):
        architecture(replace(cfg, qk_norm=True), {})


def test_model_config_refuses_a_negative_soft_cap() -> None:
    cfg = arch.family("gemma2").model_config(GEMMA_2_2B, 256000, TOKENS, Path("config.json"))
    with pytest.raises(UsageError, match="model.final_softcap must be a finite number >= 0"):
        replace(cfg, final_softcap=-1.0)
    assert ModelConfig(vocab_size=50).attn_softcap == 0.0


def test_export_gguf_writes_each_new_family_as_llama_cpps_and_refuses_what_it_cannot_compute() -> None:
    """llama.cpp has gemma2, granite and olmo2: Gemma 2 2B is written as gemma2; a model with a soft-cap that
    llama.cpp's gemma2 cannot compute is refused naming what differs, never written as gemma3 or llama."""
    from gptport.export.gguf_llama import architecture as gguf_architecture

    cfg = arch.family("gemma2").model_config(GEMMA_2_2B, 256000, TOKENS, Path("config.json"))
    assert gguf_architecture(cfg) == "gemma2"
    gemma3_like = replace(cfg, qk_norm=True, attn_softcap=0.0)
    with pytest.raises(InputError, match="logit soft-capping at 30.*qk_norm is True.*no attention soft-cap"):
        gguf_architecture(gemma3_like)
    assert gguf_architecture(ModelConfig(vocab_size=50, norm="rmsnorm", mlp="swiglu", pos_encoding="rope", bias=False,
                                         residual_scale=0.5)) == "granite"
