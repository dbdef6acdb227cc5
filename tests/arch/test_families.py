"""The architecture families (gptport/arch/), without torch: found by the registry from config.json and GGUF's names;
each family's plans name every gptport tensor's sources with their shapes (q|k|v stacked, a padded vocabulary cut,
GPT-2's Conv1D transposed, llama.cpp's q/k rows permuted) and carry out both ways (assemble on import, split on
export) to the same arrays; each family's config.json written by export-hf reads back as the same ModelConfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gptport import arch
from gptport.arch.base import (
    Family,
    Layout,
    Specials,
    assemble,
    gptport_shapes,
    permute,
    plan,
    split_all,
    unpermute,
)
from gptport.config import ModelConfig

TOKENS = Specials(1, True, (2, 3), 2)
ROTARY = {"norm": "rmsnorm", "mlp": "swiglu", "pos_encoding": "rope", "bias": False, "dropout": 0.0}
CONFIGS: dict[str, ModelConfig] = {  # a model each family's class computes (tied or not, biases, grouped heads)
    "gpt2": ModelConfig(vocab_size=50, n_ctx=16, d_model=16, n_layer=2, n_head=2, tie_embeddings=False),
    "llama": ModelConfig(vocab_size=50, n_ctx=32, d_model=16, n_layer=2, n_head=4, n_kv_head=2, d_ff=24,
                         qkv_bias=True, out_bias=True, mlp_bias=True, tie_embeddings=False, rope_scaling="llama3",
                         rope_factor=8.0, rope_original_n_ctx=16, bos_id=1, add_bos=True, eos_ids=(2, 3), **ROTARY),
    "mistral": ModelConfig(vocab_size=50, n_ctx=32, d_model=16, n_layer=2, n_head=4, n_kv_head=2, d_ff=24,
                           tie_embeddings=False, bos_id=1, add_bos=True, eos_ids=(2, 3), **ROTARY),
    "qwen2": ModelConfig(vocab_size=50, n_ctx=32, d_model=16, n_layer=2, n_head=4, n_kv_head=1, d_ff=24,
                         qkv_bias=True, bos_id=1, add_bos=True, eos_ids=(2, 3), **ROTARY),
    "qwen3": ModelConfig(vocab_size=50, n_ctx=32, d_model=16, n_layer=2, n_head=4, n_kv_head=2, head_dim=8, d_ff=24,
                         qk_norm=True, tie_embeddings=False, rope_scaling="linear", rope_factor=2.0, bos_id=1,
                         add_bos=True, eos_ids=(2, 3), **ROTARY),
    "phi3": ModelConfig(vocab_size=50, n_ctx=32, d_model=32, n_layer=2, n_head=2, n_kv_head=1, d_ff=24,
                        tie_embeddings=False, rotary_dim=12, rope_scaling="longrope", rope_original_n_ctx=8,
                        rope_short_factor=(1.0, 1.1, 1.2, 1.3, 1.4, 1.5), rope_long_factor=(2.0,) * 6,
                        rope_attention_factor=1.2, bos_id=1, add_bos=True, eos_ids=(2, 3), **ROTARY),
    "smollm3": ModelConfig(vocab_size=50, n_ctx=32, d_model=16, n_layer=4, n_head=4, n_kv_head=2, d_ff=24,
                           no_rope_layers=(3,), rope_theta=2e6, bos_id=1, add_bos=True, eos_ids=(2, 3), **ROTARY),
}


def test_the_registry_finds_each_family_by_its_names() -> None:
    assert [f.model_type for f in arch.FAMILIES] == ["gemma2", "gemma3_text", "gpt2", "granite", "llama", "mistral",
                                                     "olmo2", "phi3", "qwen2", "qwen3", "smollm3"]
    for f in arch.FAMILIES:
        assert arch.from_hf({"model_type": f.model_type}) is f
        assert arch.from_hf({"architectures": [f.hf_class]}) is f
        assert f.gguf_arch is None or arch.from_gguf(f.gguf_arch) is f
    assert arch.from_gguf("llama") is arch.family("llama")  # Mistral's GGUF is llama.cpp's `llama`
    assert arch.from_hf({"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]}) is None
    assert arch.from_gguf("mamba") is None
    assert arch.gguf_archs() == ["gemma2", "gemma3", "gpt2", "granite", "llama", "olmo2", "phi3", "qwen2", "qwen3",
                                 "smollm3"]


def test_the_llama_plan_names_every_source_and_how_it_combines() -> None:
    cfg = CONFIGS["llama"]
    planned = {p.name: p for p in arch.family("llama").hf_plan(cfg, vocab_rows=64)}
    assert set(planned) == set(gptport_shapes(cfg))
    qkv = planned["h.1.attn.c_attn.weight"]
    assert [(p.name, p.shape) for p in qkv.parts] == [("model.layers.1.self_attn.q_proj.weight", (16, 16)),
                                                      ("model.layers.1.self_attn.k_proj.weight", (8, 16)),
                                                      ("model.layers.1.self_attn.v_proj.weight", (8, 16))]
    assert [p.shape for p in planned["h.0.attn.c_attn.bias"].parts] == [(16,), (8,), (8,)]
    embedding = planned["wte.weight"].parts[0]  # a padded vocabulary: 64 rows held, the tokenizer's 50 kept
    assert (embedding.name, embedding.shape, embedding.rows) == ("model.embed_tokens.weight", (64, 16), 50)
    assert planned["h.0.mlp.c_gate.weight"].parts[0].name == "model.layers.0.mlp.gate_proj.weight"
    gguf = {p.name: p for p in arch.family("llama").gguf_plan(cfg, 50)}
    assert [(p.name, p.heads) for p in gguf["h.0.attn.c_attn.weight"].parts] == [
        ("blk.0.attn_q.weight", 4), ("blk.0.attn_k.weight", 2), ("blk.0.attn_v.weight", None)]
    assert gguf["wte.weight"].parts[0].rows is None  # as many rows as tokens: nothing to cut
    qwen2 = {p.name: p for p in arch.family("qwen2").gguf_plan(CONFIGS["qwen2"], 50)}
    assert all(p.heads is None for p in qwen2["h.0.attn.c_attn.weight"].parts)  # llama.cpp's qwen2 rotates halves


def test_gpt2s_conv1d_is_held_transposed_under_transformer() -> None:
    cfg = CONFIGS["gpt2"]
    planned = {p.name: p for p in arch.family("gpt2").hf_plan(cfg, 50)}
    fc = planned["h.0.mlp.c_fc.weight"].parts[0]
    assert (fc.name, fc.shape, fc.transposed, fc.out_rows) == ("transformer.h.0.mlp.c_fc.weight", (16, 64), True, 64)
    bias = planned["h.0.mlp.c_fc.bias"].parts[0]
    assert (bias.shape, bias.transposed) == ((64,), False)
    assert planned["lm_head.weight"].parts[0].name == "lm_head.weight"
    assert arch.family("gpt2").canonical("h.0.ln_1.weight") == "transformer.h.0.ln_1.weight"  # older checkpoints


@pytest.mark.parametrize("model_type", list(CONFIGS))
@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_split_then_assemble_gives_back_every_tensor(model_type: str, fmt: str) -> None:
    """Export's split and import's assemble are each other's inverse, for every family, in both formats."""
    family, cfg = arch.family(model_type), CONFIGS[model_type]
    if fmt == "gguf" and family.gguf_arch is None:
        family = arch.from_gguf("llama")  # type: ignore[assignment]
    rng = np.random.default_rng(0)
    ours = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in gptport_shapes(cfg).items()}
    planned = family.hf_plan(cfg, cfg.vocab_size) if fmt == "hf" else family.gguf_plan(cfg, cfg.vocab_size)
    theirs = dict(split_all(planned, ours.__getitem__))  # row blocks of one source (Phi-3's gate_up) joined
    shapes = {part.name: part.shape for p in planned for part in p.parts}
    assert {name: a.shape for name, a in theirs.items()} == shapes
    for p in planned:
        assert np.array_equal(assemble(p, theirs.__getitem__), ours[p.name]), p.name


def test_llama_cpps_permutation_is_undone() -> None:
    w = np.arange(4 * 8 * 3, dtype=np.float32).reshape(4 * 8, 3)  # 4 heads of 8 rows
    assert np.array_equal(unpermute(permute(w, 4), 4), w)
    assert not np.array_equal(permute(w, 4), w)
    head = permute(w, 4)[:8, 0] / 3  # a head's rows from halves (0..3 | 4..7) to pairs (0, 4, 1, 5, ...)
    assert head.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3", "phi3", "smollm3"])
def test_export_hfs_config_reads_back_as_the_same_model(model_type: str) -> None:
    family, cfg = arch.family(model_type), CONFIGS[model_type]
    written = family.hf_config(cfg, [2, 3])
    assert (written["model_type"], written["architectures"]) == (model_type, [family.hf_class])
    assert family.model_config(written, cfg.vocab_size, TOKENS, Path("config.json")) == cfg


def test_gpt2s_config_reads_back() -> None:
    family, cfg = arch.family("gpt2"), CONFIGS["gpt2"]
    assert family.model_config(family.hf_config(cfg, [0]), cfg.vocab_size, None, Path("c")) == cfg  # type: ignore


def test_a_key_another_family_reads_is_refused_for_this_one() -> None:
    """Each family's class reads its own keys: attention_bias is Llama's and Qwen3's, not Qwen2's."""
    from gptport.errors import InputError

    written: dict[str, Any] = arch.family("qwen2").hf_config(CONFIGS["qwen2"], [2])
    with pytest.raises(InputError, match="key 'attention_bias' is not one gptport knows for a qwen2 model"):
        arch.family("qwen2").model_config({**written, "attention_bias": True}, 50, TOKENS, Path("config.json"))
    qwen3 = arch.family("qwen3").model_config({**arch.family("qwen3").hf_config(CONFIGS["qwen3"], [2]),
                                               "head_dim": None}, 50, TOKENS, Path("c"))
    assert qwen3.head_dim == 128  # Qwen3's class default, not hidden_size / heads


def test_a_new_family_is_a_layout_and_a_few_fields() -> None:
    """What adding a family takes, shown on a made-up one: its own names for the same tensors, and the plan follows."""
    layout = Layout({"wte": "emb", "ln_f": "final_norm", "lm_head": "head"}, "layers.{i}.",
                    {"ln_1": "norm1", "ln_2": "norm2", "attn.c_attn": "qkv", "attn.c_proj": "out",
                     "mlp.c_gate": "w1", "mlp.c_fc": "w3", "mlp.c_proj": "w2"})
    toy = Family("toy", "ToyForCausalLM", None, frozenset(), hf_layout=layout)
    cfg = CONFIGS["mistral"]
    names = [part.name for p in plan(layout, cfg, 50) for part in p.parts]
    assert "layers.1.qkv.weight" in names and "head.weight" in names and len(names) == len(gptport_shapes(cfg))
    assert toy.hf_plan(cfg, 50)[0].parts[0].name == "emb.weight"
