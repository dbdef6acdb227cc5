"""PyTorch's own best at batch-1 decoding of the same model: gptport's GPT (its weights and modules) decoding
one token at a time into a static KV cache preallocated at n_ctx (written in place with index_copy_, attended
with scaled_dot_product_attention under a mask of each row's length), the step compiled with
torch.compile(mode="reduce-overhead") so that it is replayed as a CUDA graph; greedy choice on the device, no
host round trip per token. The baseline of benchmarks/gpu/static_decode.py. GPT-2's layers (learned or
sinusoidal positions, one kv head per query head)."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gptport.training.model import GPT, sinusoidal


class StaticDecoder(nn.Module):
    """One decode step of `model` over a static cache of `batch` rows: (B, 1) ids at (B,) positions -> logits
    (B, V); every layer's key and value written at the position, in place."""

    def __init__(self, model: GPT, batch: int) -> None:
        super().__init__()
        cfg = model.cfg
        if cfg.pos_encoding == "rope" or cfg.n_kv_head != cfg.n_head:
            raise ValueError("the static torch decoder is written for GPT-2's layers")
        self.model, self.cfg = model, cfg
        p = next(model.parameters())
        shape = (cfg.n_layer, batch, cfg.n_head, cfg.n_ctx, cfg.head_dim)  # (L, B, H, C, hd)
        self.register_buffer("keys", torch.zeros(shape, dtype=p.dtype, device=p.device), persistent=False)
        self.register_buffer("values", torch.zeros(shape, dtype=p.dtype, device=p.device), persistent=False)
        self.register_buffer("slots", torch.arange(cfg.n_ctx, device=p.device), persistent=False)
        for cache in (self.keys, self.values):  # written in place by the replayed graph: fixed addresses
            torch._dynamo.mark_static_address(cache)

    def fill(self, present: list[tuple[Tensor, Tensor]]) -> None:
        """The prompt's cache (the torch model's present: (B, H, P, hd) per layer) into positions 0..P-1."""
        for i, (k, v) in enumerate(present):
            self.keys[i, :, :, :k.shape[2]] = k
            self.values[i, :, :, :v.shape[2]] = v

    def forward(self, ids: Tensor, pos: Tensor) -> Tensor:
        m, cfg = self.model, self.cfg
        B = ids.shape[0]
        x = m.wte(ids)  # (B, 1, D)
        x = x + (m.wpe(pos)[:, None] if m.wpe is not None else sinusoidal(pos[:, None], cfg.d_model).to(x.dtype))
        mask = (self.slots[None, :] <= pos[:, None])[:, None, None, :]  # (B, 1, 1, C): each row's positions so far
        rows = torch.arange(B, device=ids.device)
        for i, block in enumerate(m.h):
            q, k, v = block.attn.c_attn(block.ln_1(x)).split(cfg.d_model, dim=2)  # (B, 1, D) each
            q, k, v = (t.view(B, cfg.n_head, cfg.head_dim) for t in (q, k, v))  # one token: (B, H, hd)
            self.keys[i, rows, :, pos] = k  # in place, at each row's position
            self.values[i, rows, :, pos] = v
            y = F.scaled_dot_product_attention(q[:, :, None], self.keys[i], self.values[i], attn_mask=mask)
            x = x + block.attn.c_proj(y.reshape(B, 1, cfg.d_model))
            x = x + block.mlp(block.ln_2(x))
        return m.lm_head(m.ln_f(x))[:, 0]  # (B, V)


@torch.no_grad()
def greedy(model: GPT, prompt: list[int], new: int, compiled: bool, dtype: torch.dtype = torch.float32
           ) -> dict[str, Any]:
    """Greedy decoding of `new` tokens after `prompt` (batch 1): the tokens and the decode tok/s (the steps
    after the first token, timed between device synchronisations)."""
    model = model.to(dtype).eval()
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    logits, present = model(ids, last_only=True)
    dec = StaticDecoder(model, 1)
    dec.fill(present)
    step = torch.compile(dec, mode="reduce-overhead", fullgraph=True) if compiled else dec
    tok = logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)
    pos = torch.tensor([len(prompt)], device=device)
    out = [tok]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3 if compiled else 0):  # compile and record the graph on a scratch copy of the cache
        step(tok, pos.clone())
    dec.fill(present)
    sync()
    t0 = time.perf_counter()
    for _ in range(new - 1):
        tok = step(tok, pos).argmax(-1, keepdim=True)  # (1, 1), on the device
        out.append(tok)
        pos = pos + 1
    sync()
    took = time.perf_counter() - t0
    from torch._dynamo.utils import counters

    skips = dict(counters["inductor"].get("cudagraph_skips", {})) if compiled else {}
    return {"tokens": torch.cat(out, dim=1)[0].tolist(), "decode_tok_s": (new - 1) / took, "compiled": compiled,
            "dtype": str(dtype).removeprefix("torch."), "cudagraph_skips": skips}
