"""The GPT in torch: pre-LN decoder blocks, causal attention with an explicit KV cache.

`GPT.forward(input_ids, attention_mask, position_ids, past)` has the ONNX graph's contract: it
returns the logits and the present KV cache, so export and the torch reference path share it.
Module names follow GPT-2's (wte, wpe, h.{i}.ln_1, attn.c_attn, attn.c_proj, mlp.c_fc, ...).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gptport.config import ModelConfig

KV = tuple[Tensor, Tensor]  # (B, H, T, hd) each


def attention_mask_4d(attention_mask: Tensor, q_len: int) -> Tensor:
    """Boolean (B, 1, T, P+T) mask, True = may attend: bottom-right causal AND key not padded.

    Query j of this call sits at absolute position P + j and sees keys 0..P + j. It always sees
    itself, so a padded query row is never empty (its output is unused, but it stays finite).
    """
    k_len = attention_mask.shape[1]  # P + T
    past = k_len - q_len
    q_pos = torch.arange(q_len, device=attention_mask.device) + past  # (T,)
    k_pos = torch.arange(k_len, device=attention_mask.device)  # (P+T,)
    causal = k_pos[None, :] <= q_pos[:, None]  # (T, P+T)
    diagonal = k_pos[None, :] == q_pos[:, None]  # (T, P+T)
    keep = attention_mask[:, None, None, :].bool() & causal  # (B, 1, T, P+T)
    return keep | diagonal


def default_position_ids(attention_mask: Tensor, q_len: int) -> Tensor:
    """Positions that skip left padding: cumulative count of real tokens, minus one, for the last T."""
    pos = attention_mask.long().cumsum(-1) - 1  # (B, P+T)
    return pos.clamp(min=0)[:, -q_len:]  # (B, T)


def sinusoidal(position_ids: Tensor, d_model: int) -> Tensor:
    """Fixed sin/cos encodings of arbitrary positions: (B, T) -> (B, T, D)."""
    half = d_model // 2
    inv_freq = torch.exp(torch.arange(half, device=position_ids.device, dtype=torch.float32)
                         * (-math.log(10000.0) / half))  # (D/2,)
    angles = position_ids.float()[..., None] * inv_freq  # (B, T, D/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (B, T, D)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: Tensor, mask: Tensor | None, past: KV | None) -> tuple[Tensor, KV]:
        """mask None: plain causal attention without padding or cache (the training path, where
        SDPA's fused causal kernel applies)."""
        B, T, D = x.shape
        q, k, v = self.c_attn(x).split(D, dim=2)  # (B, T, D) each
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)  # (B, H, P+T, hd)
            v = torch.cat([past[1], v], dim=2)  # (B, H, P+T, hd)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           dropout_p=self.dropout if self.training else 0.0)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return self.c_proj(y), (k, v)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.gelu = nn.GELU(approximate="tanh" if cfg.gelu == "tanh" else "none")
        self.c_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))  # (B, T, D)


class Block(nn.Module):
    """Pre-LN: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps, bias=cfg.bias)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor | None, past: KV | None) -> tuple[Tensor, KV]:
        a, present = self.attn(self.ln_1(x), mask, past)
        x = x + self.drop(a)
        x = x + self.drop(self.mlp(self.ln_2(x)))
        return x, present


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.n_ctx, cfg.d_model) if cfg.pos_encoding == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: residual projections scaled by 1/sqrt(2 n_layer)
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self,
        input_ids: Tensor,  # (B, T) int64
        attention_mask: Tensor | None = None,  # (B, P+T), 1 = real token
        position_ids: Tensor | None = None,  # (B, T)
        past: list[KV] | None = None,  # per layer (B, H, P, hd) each
        last_only: bool = False,  # logits of the last position only (left padding: every row's last token)
    ) -> tuple[Tensor, list[KV]]:
        B, T = input_ids.shape
        P = 0 if not past else past[0][0].shape[2]
        if attention_mask is None:
            attention_mask = torch.ones(B, P + T, dtype=torch.long, device=input_ids.device)
        if position_ids is None:
            position_ids = default_position_ids(attention_mask, T)
        keep = attention_mask_4d(attention_mask, T)  # (B, 1, T, P+T)
        # An additive mask with a finite floor, not a boolean one: exp(min - max) is exactly 0 in float32,
        # so the logits are the same, and the exported graph needs no Where(IsNaN(softmax)) guard, which
        # OpenVINO does not take and WebGPU runs on the CPU (every row sees itself: no row is all masked).
        dtype = self.wte.weight.dtype
        mask = torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)
        x, present = self._trunk(input_ids, position_ids, mask, past)
        if last_only:
            x = x[:, -1:]  # (B, 1, D)
        return self.lm_head(x), present  # (B, T, V), or (B, 1, V)

    def loss(self, input_ids: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
        """Next-token cross-entropy (nats) of a batch without padding or cache: the mean, or
        (B*T,) per-token losses with reduction="none"."""
        B, T = input_ids.shape
        position_ids = torch.arange(T, device=input_ids.device).expand(B, T)  # (B, T)
        x, _ = self._trunk(input_ids, position_ids, None, None)
        logits = self.lm_head(x)  # (B, T, V)
        return F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(B * T), reduction=reduction)

    def _trunk(self, input_ids: Tensor, position_ids: Tensor, mask: Tensor | None,
               past: list[KV] | None) -> tuple[Tensor, list[KV]]:
        """Embeddings, blocks and the final LayerNorm: (B, T) ids -> (B, T, D) and the present cache."""
        x = self.wte(input_ids)  # (B, T, D)
        if self.wpe is not None:
            x = x + self.wpe(position_ids)
        else:
            x = x + sinusoidal(position_ids, self.cfg.d_model).to(x.dtype)
        x = self.drop(x)
        present: list[KV] = []
        for i, block in enumerate(self.h):
            x, kv = block(x, mask, past[i] if past else None)
            present.append(kv)
        return self.ln_f(x), present
