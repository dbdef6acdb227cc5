"""The Llama family's pieces of the torch model: RMSNorm, rotary positions (RoPE, in transformers'
rotate_half layout, partial or whole heads, frequencies from gptport/rope.py), key/value heads shared by groups of
query heads, and the SwiGLU MLP. model.py assembles them with GPT-2's pieces as ModelConfig says."""

from __future__ import annotations

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


def rope_inv_freq(cfg: ModelConfig, long: bool = False, local: bool = False) -> Tensor:
    """RoPE's (rotary_width / 2,) float32 inverse frequencies as cfg.rope_scaling says (`long`: LongRoPE's long
    set; `local`: the window layers', rope_local_theta unscaled): gptport/rope.py's numpy values, the ones the
    graphs take too."""
    from gptport import rope

    return torch.from_numpy(rope.inv_freq(cfg, long, local))


def rope_cos_sin(position_ids: Tensor, inv_freq: Tensor, dtype: torch.dtype, scale: float = 1.0
                 ) -> tuple[Tensor, Tensor]:
    """cos and sin of position * frequency, each frequency twice (the halves layout): (B, T) -> (B, T, rd) each,
    rd the rotated width. Computed in inv_freq's precision (float32; float64 for the exact reference), times
    `scale` (LongRoPE's attention factor) where it is not 1, then cast to `dtype`."""
    freqs = position_ids[..., None].to(inv_freq.dtype) * inv_freq  # (B, T, rd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, rd)
    cos, sin = emb.cos(), emb.sin()
    if scale != 1.0:  # transformers multiplies by its float32 cast
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), sin.to(dtype)


def model_rope(cfg: ModelConfig, position_ids: Tensor, freqs: tuple[Tensor, Tensor | None], dtype: torch.dtype
               ) -> tuple[Tensor, Tensor]:
    """The cos and sin of a call at `position_ids` (B, T): LongRoPE's long set (freqs[1]) for a row whose highest
    position reaches past rope_original_n_ctx (transformers' choice for a call of one row), else freqs[0]. Chosen
    per row, so a row computes what it computes alone (design record 0050)."""
    if freqs[1] is None or not position_ids.numel():
        return rope_cos_sin(position_ids, freqs[0], dtype, cfg.rope_attention_factor)
    long = position_ids.max(dim=-1, keepdim=True).values + 1 > cfg.rope_original_n_ctx  # (B, 1)
    inv = torch.where(long[..., None], freqs[1], freqs[0])  # (B, 1, rd/2)
    return rope_cos_sin(position_ids, inv, dtype, cfg.rope_attention_factor)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the last dimension's halves: transformers' layout, not interleaved pairs."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each head of x (B, H, T, hd) by its position's angles; cos, sin (B, T, rd): the first rd of each
    head rotate, the rest pass (partial rotary, rd < hd)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, T, rd)
    rd = cos.shape[-1]
    if rd == x.shape[-1]:
        return x * cos + rotate_half(x) * sin  # (B, H, T, hd)
    x_rot, x_pass = x[..., :rd], x[..., rd:]  # (B, H, T, rd), (B, H, T, hd - rd)
    return torch.cat([x_rot * cos + rotate_half(x_rot) * sin, x_pass], dim=-1)  # (B, H, T, hd)


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
