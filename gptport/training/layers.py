"""The Llama family's pieces of the torch model: RMSNorm, rotary positions (RoPE, in transformers'
rotate_half layout, with linear and Llama 3.1 frequency scaling), key/value heads shared by groups of
query heads, and the SwiGLU MLP. model.py assembles them with GPT-2's pieces as ModelConfig says."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gptport.config import ModelConfig


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, over the last dimension: no mean subtracted, no bias. Computed in
    float32 at least (bf16 inputs widened, as transformers' LlamaRMSNorm; float64 kept for the exact reference)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))  # (dim,)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.to(torch.promote_types(x.dtype, torch.float32))  # (..., dim)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., dim)
        return self.weight * h.to(x.dtype)  # (..., dim)


def make_norm(cfg: ModelConfig, dim: int) -> nn.Module:
    """The norm ModelConfig.norm names: LayerNorm (with a bias when cfg.bias) or RMSNorm, epsilon ln_eps."""
    if cfg.norm == "rmsnorm":
        return RMSNorm(dim, cfg.ln_eps)
    return nn.LayerNorm(dim, eps=cfg.ln_eps, bias=cfg.bias)


def rope_inv_freq(cfg: ModelConfig, local: bool = False) -> Tensor:
    """RoPE's (head_dim / 2,) float32 inverse frequencies theta^(-2i/head_dim), scaled as cfg.rope_scaling
    says; the same float32 operations as transformers' _compute_default_rope_parameters,
    _compute_linear_scaling_rope_parameters and _compute_llama3_parameters, so the values are the same.
    `local`: the window layers' (rope_local_theta, unscaled), where the model has them."""
    dim = cfg.head_dim
    theta = cfg.rope_local_theta if local and cfg.rope_local_theta > 0 else cfg.rope_theta
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))  # (hd/2,)
    if local and cfg.rope_local_theta > 0:
        return inv_freq
    if cfg.rope_scaling == "linear":
        return inv_freq / cfg.rope_factor
    if cfg.rope_scaling != "llama3":
        return inv_freq
    factor, low, high = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    old_context_len = cfg.rope_original_n_ctx
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    wavelen = 2 * math.pi / inv_freq  # (hd/2,)
    # long wavelengths (beyond the pretraining context / low): divided by factor; short ones kept
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    # in between: interpolated between the two with a smooth factor
    smooth_factor = (old_context_len / wavelen - low) / (high - low)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rope_cos_sin(position_ids: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin of position * frequency, each frequency twice (the halves layout): (B, T) -> (B, T, hd) each.
    Computed in inv_freq's precision (float32; float64 for the exact reference), then cast to `dtype`."""
    freqs = position_ids[..., None].to(inv_freq.dtype) * inv_freq  # (B, T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, hd)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the last dimension's halves: transformers' layout, not interleaved pairs."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each head of x (B, H, T, hd) by its position's angles; cos, sin (B, T, hd)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, T, hd)
    return x * cos + rotate_half(x) * sin  # (B, H, T, hd)


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """Each key/value head repeated for the n_rep query heads that share it: (B, Hkv, S, hd) -> (B, Hkv*n_rep,
    S, hd), query head h reading kv head h // n_rep (transformers' repeat_kv)."""
    if n_rep == 1:
        return x
    B, H_kv, S, hd = x.shape
    return x[:, :, None].expand(B, H_kv, n_rep, S, hd).reshape(B, H_kv * n_rep, S, hd)


class SwiGLU(nn.Module):
    """c_proj(silu(c_gate(x)) * c_fc(x)): Llama's MLP (gate_proj, up_proj, down_proj); with mlp "geglu",
    c_proj(gelu(c_gate(x)) * c_fc(x)), GELU as cfg.gelu says (Gemma's: tanh)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.c_gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.has_mlp_bias)
        self.c_fc = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.has_mlp_bias)
        self.c_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.has_mlp_bias)
        self.gelu = None if cfg.mlp == "swiglu" else "tanh" if cfg.gelu == "tanh" else "none"

    def forward(self, x: Tensor) -> Tensor:
        gate = self.c_gate(x)  # (B, T, F)
        act = F.silu(gate) if self.gelu is None else F.gelu(gate, approximate=self.gelu)
        return self.c_proj(act * self.c_fc(x))  # (B, T, D)
