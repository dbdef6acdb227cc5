"""Gemma 3's family (gptport/arch/gemma3.py) without torch: its plans name transformers' and llama.cpp's tensors
(four norms a layer, q/k norms), the HF one folds 1 into the norms on import and takes it off on export (the
GGUF one stores 1 + w as gptport does), and its config.json, written by export-hf, reads back as the same
ModelConfig: the window, its layers, both RoPE bases, the softmax scale."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gptport import arch
from gptport.arch.base import Specials, assemble, gptport_shapes, split
from gptport.config import ModelConfig
from gptport.errors import UsageError

TOKENS = Specials(2, True, (1,), 1)
CFG = ModelConfig(vocab_size=50, n_ctx=64, d_model=16, n_layer=4, n_head=4, n_kv_head=2, head_dim=8, d_ff=24,
                  norm="rmsnorm", mlp="geglu", pos_encoding="rope", bias=False, qk_norm=True, post_norms=True,
                  embed_scale=4.0, attn_scale=0.25, sliding_window=8, window_layers=(0, 1, 3), rope_theta=1e6,
                  rope_local_theta=1e4, bos_id=2, add_bos=True, eos_ids=(1,))


def test_the_plans_name_four_norms_a_layer() -> None:
    family = arch.family("gemma3_text")
    assert arch.from_hf({"architectures": ["Gemma3ForCausalLM"]}) is family and arch.from_gguf("gemma3") is family
    hf = {p.name: p for p in family.hf_plan(CFG, 50)}
    assert set(hf) == set(gptport_shapes(CFG))
    names = {n: hf[f"h.1.{n}.weight"].parts[0] for n in ("ln_1", "ln_1_post", "ln_2", "ln_2_post", "attn.q_norm")}
    assert [p.name for p in names.values()] == [
        "model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight",
        "model.layers.1.pre_feedforward_layernorm.weight", "model.layers.1.post_feedforward_layernorm.weight",
        "model.layers.1.self_attn.q_norm.weight"]
    assert all(p.plus_one for p in names.values()) and hf["ln_f.weight"].parts[0].plus_one
    assert not hf["h.1.mlp.c_gate.weight"].parts[0].plus_one
    gguf = {p.name: p for p in family.gguf_plan(CFG, 50)}
    assert [gguf[f"h.0.{n}.weight"].parts[0].name for n in ("ln_1_post", "ln_2", "ln_2_post", "attn.k_norm")] == [
        "blk.0.post_attention_norm.weight", "blk.0.ffn_norm.weight", "blk.0.post_ffw_norm.weight",
        "blk.0.attn_k_norm.weight"]
    assert not any(part.plus_one for p in gguf.values() for part in p.parts)  # llama.cpp stores 1 + w


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_split_then_assemble_gives_back_every_tensor(fmt: str) -> None:
    """Exact both ways where 1 + w lies in [0.5, 2] (Sterbenz: (1 + w) - 1 is exact there), as trained norms' do."""
    family = arch.family("gemma3_text")
    rng = np.random.default_rng(0)
    ours = {n: (rng.uniform(0.5, 2.0, s) if n.endswith("norm.weight") or ".ln_" in n or n.startswith("ln_f")
                else rng.standard_normal(s)).astype(np.float32) for n, s in gptport_shapes(CFG).items()}
    planned = family.hf_plan(CFG, 50) if fmt == "hf" else family.gguf_plan(CFG, 50)
    theirs = dict(pair for p in planned for pair in split(p, ours[p.name]))
    if fmt == "hf":
        assert np.array_equal(theirs["model.norm.weight"], ours["ln_f.weight"] - np.float32(1))
    for p in planned:
        assert np.array_equal(assemble(p, theirs.__getitem__), ours[p.name]), p.name


def test_export_hfs_config_reads_back_as_the_same_model() -> None:
    family = arch.family("gemma3_text")
    written = family.hf_config(CFG, [1])
    assert written["query_pre_attn_scalar"] == 16 and written["hidden_activation"] == "gelu_pytorch_tanh"
    assert written["layer_types"] == ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    back = family.model_config(written, 50, TOKENS, Path("config.json"))
    assert back == ModelConfig(**{**CFG.__dict__, "embed_scale": math.sqrt(16), "attn_scale": 0.25})


def test_gemma_3_270ms_config_json() -> None:
    """google/gemma-3-270m's config.json (transformers 4.55's keys) read without its weights."""
    hf = {"_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"], "attention_bias": False,
          "attention_dropout": 0.0, "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1,
          "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
          "hidden_size": 640, "initializer_range": 0.02, "intermediate_size": 2048,
          "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
          "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
          "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
          "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None, "rope_theta": 1000000.0,
          "sliding_window": 512, "torch_dtype": "bfloat16", "transformers_version": "4.55.0.dev0",
          "use_bidirectional_attention": False, "use_cache": True, "vocab_size": 262144}
    cfg = arch.family("gemma3_text").model_config(hf, 262144, TOKENS, Path("config.json"))
    assert (cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.q_width, cfg.attn_scale) == (4, 1, 256, 1024, 1 / 16)
    assert cfg.window_layers == tuple(i for i in range(18) if i % 6 != 5) and cfg.n_ctx == 32768
    assert 268e6 < cfg.n_params() < 269e6  # Gemma 3 270M: 268,098,176


def test_model_config_refuses_a_window_layer_it_does_not_have() -> None:
    with pytest.raises(UsageError, match="model.window_layers: layer 4 is not one of the 4 layers"):
        ModelConfig(**{**CFG.__dict__, "window_layers": (4,)})
    with pytest.raises(UsageError, match="model.sliding_window must be 0"):
        ModelConfig(**{**CFG.__dict__, "sliding_window": -1})
    assert "window_layers" in ModelConfig(vocab_size=50).inert()
