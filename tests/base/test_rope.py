"""gptport/rope.py's inverse frequencies against transformers' rope init functions (default, linear, llama3,
longrope short and long, partial rotary): bit for bit once torch's float32 pow is made correctly rounded (the one
step rope.py rounds once from float64 by design), and never more than 1 ulp from torch's own pow."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from gptport import rope
from gptport.config import ModelConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@contextlib.contextmanager
def rounded_pow() -> Iterator[None]:
    """`python_float ** float32_tensor` computed in float64 from the base's float32 value, rounded once."""
    original = torch.Tensor.__rpow__

    def rpow(self: Any, other: float) -> Any:
        return (torch.tensor(np.float32(other), dtype=torch.float64) ** self.double()).float()

    torch.Tensor.__rpow__ = rpow
    try:
        yield
    finally:
        torch.Tensor.__rpow__ = original


SCALINGS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("default", {}, {}),
    ("linear", {"factor": 4.0}, {"rope_scaling": "linear", "rope_factor": 4.0}),
    ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256},
     {"rope_scaling": "llama3", "rope_factor": 8.0, "rope_original_n_ctx": 256}),
]


def _ulps(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32)).max())


@pytest.mark.parametrize("theta", [10000.0, 500000.0, 123456.7])
@pytest.mark.parametrize("head_dim", [16, 64, 96, 128])
@pytest.mark.parametrize("kind", [s[0] for s in SCALINGS])
def test_default_linear_and_llama3_are_transformers_bits(kind: str, head_dim: int, theta: float) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    _, params, ours = next(s for s in SCALINGS if s[0] == kind)
    hf = transformers.LlamaConfig(vocab_size=10, hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                                  rope_parameters={"rope_type": kind, "rope_theta": theta, **params})
    cfg = ModelConfig(vocab_size=10, d_model=2 * head_dim, n_head=2, pos_encoding="rope", rope_theta=theta, **ours)
    fn = LlamaRotaryEmbedding.compute_default_rope_parameters if kind == "default" else ROPE_INIT_FUNCTIONS[kind]
    with rounded_pow():
        want = fn(hf)[0].numpy()
    got = rope.inv_freq(cfg)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert _ulps(got, fn(hf)[0].numpy()) <= 1


@pytest.mark.parametrize("partial", [1.0, 0.75, 0.5])
def test_longrope_short_and_long_are_transformers_bits(partial: float) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    head_dim, n = 64, int(64 * partial) // 2
    short, long = [1.0 + 0.01 * i for i in range(n)], [1.0 + 0.37 * i for i in range(n)]
    hf = transformers.Phi3Config(vocab_size=10, hidden_size=2 * head_dim, num_attention_heads=2,
                                 max_position_embeddings=1024, original_max_position_embeddings=256,
                                 pad_token_id=None, eos_token_id=None, bos_token_id=None,
                                 rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": short,
                                                  "long_factor": long, "partial_rotary_factor": partial})
    cfg = ModelConfig(vocab_size=10, d_model=2 * head_dim, n_head=2, pos_encoding="rope",
                      rotary_dim=int(head_dim * partial), rope_scaling="longrope", rope_original_n_ctx=256,
                      rope_short_factor=tuple(short), rope_long_factor=tuple(long))
    with rounded_pow():
        want_short, factor = ROPE_INIT_FUNCTIONS["longrope"](hf)
        want_long, _ = ROPE_INIT_FUNCTIONS["longrope"](hf, seq_len=257)
    assert np.array_equal(rope.inv_freq(cfg), want_short.numpy())
    assert np.array_equal(rope.inv_freq(cfg, long=True), want_long.numpy())
    assert factor == pytest.approx((1 + np.log(4.0) / np.log(256.0)) ** 0.5)
    assert not rope.uses_long(cfg, 256) and rope.uses_long(cfg, 257)
