"""OLMo 2's family (gptport/arch/olmo2.py) without torch: allenai/OLMo-2-0425-1B's config.json read as its
model, the plan naming transformers' and llama.cpp's tensors (no input norms, two post-norms, q/k norms as wide
as all heads), export-hf's config.json read back as the same ModelConfig, and a block without any norm refused."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gptport import arch
from gptport.arch.base import Specials, gptport_shapes
from gptport.errors import UsageError
from gptport.export.hf_llama_export import architecture

TOKENS = Specials(None, False, (100257,), 100257)
OLMO_2_1B = {"architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
             "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
             "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "olmo2",
             "num_attention_heads": 16, "num_hidden_layers": 16, "num_key_value_heads": 16, "pad_token_id": 100277,
             "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 500000, "tie_word_embeddings": False,
             "torch_dtype": "float32", "transformers_version": "4.48.3", "use_cache": True, "vocab_size": 100352}


def test_olmo_2_1bs_config_json_and_its_plans() -> None:
    family = arch.family("olmo2")
    cfg = family.model_config(OLMO_2_1B, 100352, TOKENS, Path("config.json"))
    assert (cfg.pre_norms, cfg.post_norms, cfg.qk_norm_span) == (False, True, "all")
    assert 1.48e9 < cfg.n_params() < 1.49e9  # OLMo 2 1B: 1,484,916,736
    hf = {p.name: p.parts[0] for p in family.hf_plan(cfg, 100352) if len(p.parts) == 1}
    assert set(p.name for p in family.hf_plan(cfg, 100352)) == set(gptport_shapes(cfg))
    assert (hf["h.3.ln_1_post.weight"].name, hf["h.3.attn.q_norm.weight"].shape) == (
        "model.layers.3.post_attention_layernorm.weight", (2048,))
    gguf = {p.name: p.parts[0].name for p in family.gguf_plan(cfg, 100352) if len(p.parts) == 1}
    assert gguf["h.0.ln_2_post.weight"] == "blk.0.post_ffw_norm.weight" and "h.0.ln_1.weight" not in gguf


def test_export_hfs_config_reads_back_and_picks_olmo_2() -> None:
    family = arch.family("olmo2")
    cfg = family.model_config(OLMO_2_1B, 100352, TOKENS, Path("config.json"))
    assert family.model_config(family.hf_config(cfg, [100257]), 100352, TOKENS, Path("config.json")) == cfg
    assert architecture(cfg, {}) == "olmo2"
    with pytest.raises(UsageError, match="model.pre_norms and model.post_norms are both false"):
        replace(cfg, post_norms=False)
