"""The torch GPT: the KV cache reproduces a full forward, padding is masked, shapes and init are GPT-2's; the
Llama family's choices (RoPE, grouped key/value heads, RMSNorm, SwiGLU, q/k norm, split biases) keep all that."""

from __future__ import annotations

import math

import pytest
import torch

from gptport.config import ModelConfig
from gptport.training.model import GPT, attention_mask_4d

VARIANTS = [
    {"pos_encoding": "learned", "tie_embeddings": True},
    {"pos_encoding": "sinusoidal", "tie_embeddings": False},
    {"pos_encoding": "learned", "tie_embeddings": False, "bias": False, "gelu": "exact"},
    {"pos_encoding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "n_kv_head": 2, "bias": False,
     "tie_embeddings": False},  # Llama
    {"pos_encoding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "n_kv_head": 1, "bias": False, "qkv_bias": True,
     "rope_theta": 1e6},  # Qwen2's biases, multi-query
    {"pos_encoding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "n_kv_head": 2, "head_dim": 16, "bias": False,
     "qk_norm": True, "out_bias": True, "mlp_bias": True, "rope_scaling": "llama3", "rope_factor": 8.0,
     "rope_original_n_ctx": 16},  # Qwen3's q/k norm, heads wider than d_model, Llama 3.1's scaling
]


def tiny(**kw: object) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=101, n_ctx=32, d_model=32, n_layer=2, n_head=4, **kw)  # type: ignore[arg-type]
    return GPT(cfg).eval()


@pytest.mark.parametrize("variant", VARIANTS)
def test_prefill_then_decode_equals_one_full_forward(variant: dict[str, object]) -> None:
    model = tiny(**variant)
    ids = torch.randint(0, 101, (3, 20))
    with torch.no_grad():
        full, _ = model(ids)
        logits, past = model(ids[:, :7])
        steps = [logits]
        for t in range(7, 20):
            step, past = model(ids[:, t:t + 1], attention_mask=torch.ones(3, t + 1, dtype=torch.long), past=past)
            steps.append(step)
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= 1e-5
    cfg = model.cfg
    assert past[0][0].shape == past[0][1].shape == (3, cfg.n_kv_head, 20, cfg.head_dim)  # (B, Hkv, T, hd)


@pytest.mark.parametrize("variant", VARIANTS)
def test_left_padded_row_matches_the_row_alone(variant: dict[str, object]) -> None:
    model = tiny(**variant)
    long_row = torch.randint(1, 101, (1, 12))
    short_row = torch.randint(1, 101, (1, 8))
    pad = 4
    ids = torch.cat([long_row, torch.cat([torch.zeros(1, pad, dtype=torch.long), short_row], dim=1)])  # (2, 12)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :pad] = 0
    nxt = torch.randint(1, 101, (2, 5))
    with torch.no_grad():
        batch_logits, past = model(ids, attention_mask=mask)
        decoded = []
        for t in range(5):
            mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
            step, past = model(nxt[:, t:t + 1], attention_mask=mask, past=past)
            decoded.append(step)
        alone, _ = model(torch.cat([short_row, nxt[1:]], dim=1))  # (1, 13, V), no padding at all
    assert torch.isfinite(batch_logits).all()
    assert (batch_logits[1, pad:] - alone[0, :8]).abs().max().item() <= 1e-5
    assert (torch.cat(decoded, dim=1)[1] - alone[0, 8:]).abs().max().item() <= 1e-5


def test_last_only_is_the_last_column_of_a_full_forward() -> None:
    model = tiny()
    ids = torch.randint(1, 101, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding: the last column is still every row's last token
    with torch.no_grad():
        full, past = model(ids, attention_mask=mask)
        last, last_past = model(ids, attention_mask=mask, last_only=True)
    assert last.shape == (2, 1, 101) and (last - full[:, -1:]).abs().max().item() <= 1e-6
    assert all(torch.equal(a, b) for pa, pb in zip(past, last_past, strict=True) for a, b in zip(pa, pb, strict=True))


def test_training_loss_equals_cross_entropy_of_forward() -> None:
    model = tiny()
    ids = torch.randint(0, 101, (2, 16))
    with torch.no_grad():
        logits, _ = model(ids[:, :-1])
        expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 101), ids[:, 1:].reshape(-1))
        assert abs(model.loss(ids[:, :-1], ids[:, 1:]).item() - expected.item()) < 1e-5


def test_mask_is_bottom_right_causal_and_hides_padding() -> None:
    attn = torch.tensor([[0, 1, 1, 1, 1]])  # past 3 (first padded), then 2 queries
    mask = attention_mask_4d(attn, q_len=2)[0, 0]
    assert mask.tolist() == [[False, True, True, True, False], [False, True, True, True, True]]


@pytest.mark.parametrize("variant", VARIANTS)
def test_parameter_count_and_tying(variant: dict[str, object]) -> None:
    model = tiny(**variant)
    assert sum(p.numel() for p in model.parameters()) == model.cfg.n_params()
    assert (model.lm_head.weight is model.wte.weight) == model.cfg.tie_embeddings


def test_gpt2_initialisation() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=512, n_ctx=64, d_model=256, n_layer=8, n_head=4)
    model = GPT(cfg)
    assert abs(model.h[0].attn.c_attn.weight.std().item() - 0.02) < 0.002
    assert abs(model.h[0].mlp.c_proj.weight.std().item() - 0.02 / math.sqrt(16)) < 0.001
    assert model.h[0].attn.c_attn.bias.abs().max().item() == 0.0


def test_config_refuses_bad_shapes() -> None:
    from gptport.errors import UsageError

    with pytest.raises(UsageError, match="divisible"):
        ModelConfig(vocab_size=10, d_model=30, n_head=4)
    with pytest.raises(UsageError, match="pos_encoding"):
        ModelConfig(vocab_size=10, pos_encoding="rotary")  # type: ignore[arg-type]
    assert ModelConfig(vocab_size=10, d_model=64, n_head=4).d_ff == 256


def test_gqa_equals_multi_head_attention_with_each_kv_head_copied() -> None:
    """A grouped model computes what a multi-head one does whose query heads h read kv head h // (H / Hkv):
    the same model with its k and v projections' heads repeated that way."""
    grouped = tiny(pos_encoding="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=2, bias=False)
    full = tiny(pos_encoding="rope", norm="rmsnorm", mlp="swiglu", bias=False)
    state = dict(grouped.state_dict())
    for i in range(2):
        w = state[f"h.{i}.attn.c_attn.weight"]  # (H*hd + 2*Hkv*hd, D)
        q, k, v = w.split([32, 16, 16])
        k, v = (t.view(2, 8, 32).repeat_interleave(2, dim=0).reshape(32, 32) for t in (k, v))  # kv head h // 2
        state[f"h.{i}.attn.c_attn.weight"] = torch.cat([q, k, v])
    full.load_state_dict(state)
    ids = torch.randint(0, 101, (2, 12))
    with torch.no_grad():
        assert (grouped(ids)[0] - full(ids)[0]).abs().max().item() <= 1e-5


def test_rope_attention_depends_on_relative_positions_only() -> None:
    """Shifting every position by the same offset leaves RoPE's logits unchanged (up to float32 rounding):
    q.k depends on the positions' difference only, and nothing else sees the positions."""
    model = tiny(pos_encoding="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=2, bias=False)
    ids = torch.randint(0, 101, (1, 10))
    pos = torch.arange(10)[None]
    with torch.no_grad():
        base, _ = model(ids, position_ids=pos)
        shifted, _ = model(ids, position_ids=pos + 7)
        learned = tiny()
        moved = (learned(ids, position_ids=pos)[0] - learned(ids, position_ids=pos + 7)[0]).abs().max().item()
    assert (base - shifted).abs().max().item() <= 1e-4 and moved > 1e-3


def test_rope_frequencies_are_transformers_llama3_scaling() -> None:
    """Llama 3.1's scaling (factor 8, low 1, high 4, original context 8192) on head_dim 64, theta 500000:
    high frequencies kept, low ones divided by 8, the middle band smoothed between the two."""
    from gptport.training.layers import rope_inv_freq

    cfg = ModelConfig(vocab_size=10, d_model=256, n_head=4, pos_encoding="rope", rope_theta=500000.0,
                      rope_scaling="llama3", rope_factor=8.0)
    plain = rope_inv_freq(ModelConfig(vocab_size=10, d_model=256, n_head=4, pos_encoding="rope", rope_theta=500000.0))
    scaled = rope_inv_freq(cfg)
    wavelen = 2 * math.pi / plain
    assert torch.equal(scaled[wavelen < 8192 / 4], plain[wavelen < 8192 / 4])
    assert torch.allclose(scaled[wavelen > 8192], plain[wavelen > 8192] / 8)
    middle = (wavelen >= 8192 / 4) & (wavelen <= 8192)
    assert middle.any() and ((scaled[middle] < plain[middle]) & (scaled[middle] > plain[middle] / 8)).all()
    linear = ModelConfig(vocab_size=10, d_model=256, n_head=4, pos_encoding="rope", rope_theta=500000.0,
                         rope_scaling="linear", rope_factor=4.0)
    assert torch.equal(rope_inv_freq(linear), plain / 4)


def test_rope_and_rmsnorm_models_have_no_position_table_and_no_norm_bias() -> None:
    model = tiny(pos_encoding="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=2, bias=False, qkv_bias=True)
    names = set(model.state_dict())
    assert "wpe.weight" not in names and "inv_freq" not in names  # computed from the config, never saved
    assert "h.0.ln_1.bias" not in names and "h.0.attn.c_proj.bias" not in names and "h.0.mlp.c_fc.bias" not in names
    assert {"h.0.attn.c_attn.bias", "h.0.mlp.c_gate.weight", "h.0.ln_1.weight"} <= names
    assert model.h[0].attn.c_attn.weight.shape == (32 + 2 * 16, 32)  # [q | k | v]: 4 query heads, 2 kv heads of 8
