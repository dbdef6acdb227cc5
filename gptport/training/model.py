"""The GPT in torch: pre-norm decoder blocks, causal attention with an explicit KV cache.

`GPT.forward(input_ids, attention_mask, position_ids, past)` has the ONNX graph's contract: it
returns the logits and the present KV cache, so export and the torch reference path share it.
Module names follow GPT-2's (wte, wpe, h.{i}.ln_1, attn.c_attn, attn.c_proj, mlp.c_fc, ...). The Llama
family's choices (RMSNorm, RoPE, grouped key/value heads, SwiGLU, q/k norms) come from layers.py; at
ModelConfig's defaults the module and its graph are GPT-2's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gptport.config import ModelConfig
from gptport.training.layers import (
    RMSNorm,
    SwiGLU,
    apply_rope,
    make_norm,
    model_rope,
    repeat_kv,
    rope_cos_sin,
    rope_inv_freq,
)

KV = tuple[Tensor, Tensor]  # (B, Hkv, T, hd) each: n_kv_head heads (n_head unless grouped)
Rope = tuple[Tensor, Tensor]  # cos, sin: (B, T, hd) each


def attention_mask_4d(attention_mask: Tensor, q_len: int, window: int = 0) -> Tensor:
    """Boolean (B, 1, T, P+T) mask, True = may attend: bottom-right causal AND key not padded (AND, with a
    `window`, key within the last `window` positions: q - window < k, transformers' sliding window).

    Query j of this call sits at absolute position P + j and sees keys 0..P + j. It always sees
    itself, so a padded query row is never empty (its output is unused, but it stays finite).
    """
    k_len = attention_mask.shape[1]  # P + T
    past = k_len - q_len
    q_pos = torch.arange(q_len, device=attention_mask.device) + past  # (T,)
    k_pos = torch.arange(k_len, device=attention_mask.device)  # (P+T,)
    causal = k_pos[None, :] <= q_pos[:, None]  # (T, P+T)
    if window:
        causal = causal & (k_pos[None, :] > q_pos[:, None] - window)  # (T, P+T)
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
    """Causal attention over n_head query heads and n_kv_head key/value heads (each shared by n_head /
    n_kv_head query heads); q, k and v from one fused projection c_attn, [q | k | v] along its output."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.widths = [cfg.q_width, cfg.kv_width, cfg.kv_width]
        self.c_attn = nn.Linear(cfg.d_model, sum(self.widths), bias=cfg.has_qkv_bias)
        self.c_proj = nn.Linear(cfg.q_width, cfg.d_model, bias=cfg.has_out_bias)
        self.span = cfg.qk_norm_span  # "head": each head's hd values; "all": every head's together (OLMo 2)
        q_dim, k_dim = (cfg.head_dim, cfg.head_dim) if self.span == "head" else (cfg.q_width, cfg.kv_width)
        self.q_norm = RMSNorm(q_dim, cfg.ln_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(k_dim, cfg.ln_eps) if cfg.qk_norm else None
        self.dropout = cfg.dropout
        self.scale = cfg.attn_scale or None  # None: SDPA's 1/sqrt(hd)
        self.softcap = cfg.attn_softcap  # > 0: scores capped by tanh (Gemma 2), which SDPA does not do

    def forward(self, x: Tensor, mask: Tensor | None, past: KV | None, rope: Rope | None = None) -> tuple[Tensor, KV]:
        """mask None: plain causal attention without padding or cache (the training path, where
        SDPA's fused causal kernel applies). Returns the output and this layer's cache (B, Hkv, P+T, hd)."""
        B, T, _ = x.shape
        qkv = self.c_attn(x)  # (B, T, H*hd + 2*Hkv*hd)
        if self.n_kv_head == self.n_head:
            q, k, v = qkv.split(self.widths[0], dim=2)  # (B, T, H*hd) each
        else:
            q, k, v = qkv.split(self.widths, dim=2)  # (B, T, H*hd), (B, T, Hkv*hd) twice
        if self.span == "all" and self.q_norm is not None and self.k_norm is not None:  # before the head split
            q, k = self.q_norm(q), self.k_norm(k)  # (B, T, H*hd), (B, T, Hkv*hd)
        head_norms = self.span == "head"
        q = self._heads(q, self.n_head, self.q_norm if head_norms else None)  # (B, H, T, hd)
        k = self._heads(k, self.n_kv_head, self.k_norm if head_norms else None)  # (B, Hkv, T, hd)
        v = self._heads(v, self.n_kv_head, None)  # (B, Hkv, T, hd)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)  # (B, H, T, hd), (B, Hkv, T, hd)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)  # (B, Hkv, P+T, hd)
            v = torch.cat([past[1], v], dim=2)  # (B, Hkv, P+T, hd)
        n_rep = self.n_head // self.n_kv_head
        if self.softcap > 0:
            y = self._capped(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask)  # (B, H, T, hd)
        else:
            y = F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask=mask,
                                               is_causal=mask is None,
                                               dropout_p=self.dropout if self.training else 0.0,
                                               scale=self.scale)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim)  # (B, T, H*hd)
        return self.c_proj(y), (k, v)

    def _capped(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """softmax(tanh(q k^T * scale / cap) * cap + mask) v, in transformers' Gemma 2 order (the cap before the
        mask, the softmax in float32): q (B, H, T, hd), k and v (B, H, P+T, hd) -> (B, H, T, hd)."""
        scores = torch.matmul(q, k.transpose(2, 3)) * (self.scale or self.head_dim ** -0.5)  # (B, H, T, P+T)
        scores = torch.tanh(scores / self.softcap) * self.softcap
        if mask is None:  # the training path: causal
            T = q.shape[2]
            mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()  # (T, T)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool else (
            scores + mask)
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)  # (B, H, T, P+T)
        return torch.matmul(F.dropout(probs, self.dropout, self.training), v)  # (B, H, T, hd)

    def _heads(self, x: Tensor, n: int, norm: nn.Module | None) -> Tensor:
        """(B, T, n*hd) -> (B, n, T, hd), each head normalised over hd first when `norm` (q/k norm)."""
        B, T, _ = x.shape
        x = x.view(B, T, n, self.head_dim)  # (B, T, n, hd)
        if norm is not None:
            x = norm(x)
        return x.transpose(1, 2)  # (B, n, T, hd)


class MLP(nn.Module):
    """GPT-2's MLP: c_proj(gelu(c_fc(x))), d_ff wide."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.has_mlp_bias)
        self.gelu = nn.GELU(approximate="tanh" if cfg.gelu == "tanh" else "none")
        self.c_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.has_mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))  # (B, T, D)


class Block(nn.Module):
    """Pre-norm: x + attn(ln_1(x)), then x + mlp(ln_2(x)); the norms LayerNorm or RMSNorm, the MLP GELU, SwiGLU or
    GeGLU; with post_norms, x + ln_1_post(attn(ln_1(x))), then x + ln_2_post(mlp(ln_2(x))) (Gemma's). The caller
    hands each layer its own mask and rotation (a window layer's: GPT.layer_inputs)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = make_norm(cfg, cfg.d_model) if cfg.pre_norms else nn.Identity()
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = make_norm(cfg, cfg.d_model) if cfg.pre_norms else nn.Identity()
        self.mlp: nn.Module = MLP(cfg) if cfg.mlp == "gelu" else SwiGLU(cfg)
        self.ln_1_post = make_norm(cfg, cfg.d_model) if cfg.post_norms else None
        self.ln_2_post = make_norm(cfg, cfg.d_model) if cfg.post_norms else None
        self.drop = nn.Dropout(cfg.dropout)
        self.residual_scale = cfg.residual_scale

    def forward(self, x: Tensor, mask: Tensor | None, past: KV | None, rope: Rope | None = None) -> tuple[Tensor, KV]:
        a, present = self.attn(self.ln_1(x), mask, past, rope)
        x = x + self._scaled(self.drop(a if self.ln_1_post is None else self.ln_1_post(a)))
        m = self.mlp(self.ln_2(x))  # (B, T, D)
        x = x + self._scaled(self.drop(m if self.ln_2_post is None else self.ln_2_post(m)))
        return x, present

    def _scaled(self, delta: Tensor) -> Tensor:
        """A sublayer's output times residual_scale (Granite's residual_multiplier, a float32 multiply)."""
        return delta if self.residual_scale == 1.0 else delta * self.residual_scale  # (B, T, D)


def layer_inputs(cfg: ModelConfig, layer: int, masks: tuple[Tensor | None, Tensor | None],
                 ropes: tuple[Rope | None, Rope | None]) -> tuple[Tensor | None, Rope | None]:
    """Layer `layer`'s mask and rotation from the model's (full, window) masks and (global, local) rotations (none
    in a layer without rope: SmolLM3's)."""
    rope = None if layer in cfg.no_rope_layers else ropes[1] if cfg.local_rope(layer) else ropes[0]
    return (masks[1] if cfg.windowed(layer) else masks[0]), rope


def additive(keep: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask as an additive one with a finite floor: 0 where kept, dtype's lowest elsewhere."""
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)


def scaled_embeddings(x: Tensor, cfg: ModelConfig) -> Tensor:
    """The token embeddings times cfg.embed_scale as float32 (transformers' Gemma: a float32 buffer)."""
    if cfg.embed_scale == 1.0:
        return x
    return x * torch.tensor(cfg.embed_scale, dtype=torch.float32, device=x.device).to(x.dtype)  # (B, T, D)


def finished_logits(logits: Tensor, cfg: ModelConfig) -> Tensor:
    """The head's output as the model returns it: divided by logits_divisor (Granite), then soft-capped by
    final_softcap (Gemma 2), each as transformers computes it."""
    if cfg.logits_divisor != 1.0:
        logits = logits / cfg.logits_divisor  # (B, T, V)
    if cfg.final_softcap > 0:
        logits = torch.tanh(logits / cfg.final_softcap) * cfg.final_softcap  # (B, T, V)
    return logits


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.n_ctx, cfg.d_model) if cfg.pos_encoding == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = make_norm(cfg, cfg.d_model)
        if cfg.pos_encoding == "rope":  # not a weight: computed from the config, never saved
            self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)  # (rd/2,)
            if cfg.rope_scaling == "longrope":  # the set for a call past rope_original_n_ctx
                self.register_buffer("inv_freq_long", rope_inv_freq(cfg, long=True), persistent=False)  # (rd/2,)
        if cfg.rope_local_theta > 0:  # the window layers' own
            self.register_buffer("local_inv_freq", rope_inv_freq(cfg, local=True), persistent=False)  # (hd/2,)
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
        past: list[KV] | None = None,  # per layer (B, Hkv, P, hd) each
        last_only: bool = False,  # logits of the last position only (left padding: every row's last token)
    ) -> tuple[Tensor, list[KV]]:
        B, T = input_ids.shape
        P = 0 if not past else past[0][0].shape[2]
        if attention_mask is None:
            attention_mask = torch.ones(B, P + T, dtype=torch.long, device=input_ids.device)
        if position_ids is None:
            position_ids = default_position_ids(attention_mask, T)
        # An additive mask with a finite floor, not a boolean one: exp(min - max) is exactly 0 in float32,
        # so the logits are the same, and the exported graph needs no Where(IsNaN(softmax)) guard, which
        # OpenVINO does not take and WebGPU runs on the CPU (every row sees itself: no row is all masked).
        dtype = self.wte.weight.dtype
        mask = additive(attention_mask_4d(attention_mask, T), dtype)  # (B, 1, T, P+T)
        window = additive(attention_mask_4d(attention_mask, T, self.cfg.sliding_window), dtype) if (
            self.cfg.window_layers and self.cfg.sliding_window) else None
        x, present = self._trunk(input_ids, position_ids, (mask, window), past)
        if last_only:
            x = x[:, -1:]  # (B, 1, D)
        return finished_logits(self.lm_head(x), self.cfg), present  # (B, T, V), or (B, 1, V)

    def loss(self, input_ids: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
        """Next-token cross-entropy (nats) of a batch without padding or cache: the mean, or
        (B*T,) per-token losses with reduction="none"."""
        B, T = input_ids.shape
        position_ids = torch.arange(T, device=input_ids.device).expand(B, T)  # (B, T)
        window = None  # a window layer's mask; the others' is SDPA's causal one
        if self.cfg.window_layers and self.cfg.sliding_window:
            ones = torch.ones(B, T, dtype=torch.long, device=input_ids.device)
            window = attention_mask_4d(ones, T, self.cfg.sliding_window)  # (B, 1, T, T)
        x, _ = self._trunk(input_ids, position_ids, (None, window), None)
        logits = finished_logits(self.lm_head(x), self.cfg)  # (B, T, V)
        return F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(B * T), reduction=reduction)

    def _trunk(self, input_ids: Tensor, position_ids: Tensor, masks: tuple[Tensor | None, Tensor | None],
               past: list[KV] | None) -> tuple[Tensor, list[KV]]:
        """Embeddings, blocks and the final norm: (B, T) ids -> (B, T, D) and the present cache. `masks`: the
        full layers' and the window layers' (None: causal, SDPA's own)."""
        x = scaled_embeddings(self.wte(input_ids), self.cfg)  # (B, T, D)
        rope: Rope | None = None
        local: Rope | None = None
        if self.wpe is not None:
            x = x + self.wpe(position_ids)
        elif self.cfg.pos_encoding == "sinusoidal":
            x = x + sinusoidal(position_ids, self.cfg.d_model).to(x.dtype)
        else:  # rope: each attention rotates its q and k by these (but the layers without rope)
            rope = model_rope(self.cfg, position_ids, (self.inv_freq, getattr(self, "inv_freq_long", None)),
                              x.dtype)  # (B, T, rd) each
            if self.cfg.rope_local_theta > 0:
                local = rope_cos_sin(position_ids, self.local_inv_freq, x.dtype)  # (B, T, hd) each
        x = self.drop(x)
        present: list[KV] = []
        for i, block in enumerate(self.h):
            mask, layer_rope = layer_inputs(self.cfg, i, masks, (rope, local))
            x, kv = block(x, mask, past[i] if past else None, layer_rope)
            present.append(kv)
        return self.ln_f(x), present
