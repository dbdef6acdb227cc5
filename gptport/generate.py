"""The generation loop over any step function: an onnxruntime session or the torch model.

A step function takes (input_ids (B, T), attention_mask (B, P+T), position_ids (B, T), past) as
int64 numpy arrays and the flattened KV cache [k0, v0, k1, v1, ...] of (B, H, P, hd) arrays, and
returns the logits (B, T, V) and the present cache. It knows only token ids. No torch here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Past = list[np.ndarray]
StepFn = Callable[[np.ndarray, np.ndarray, np.ndarray, Past], tuple[np.ndarray, Past]]


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded ids (B, T) and attention mask (B, T) for prompts of different lengths."""
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), pad_id, dtype=np.int64)  # (B, T)
    mask = np.zeros((len(prompts), width), dtype=np.int64)  # (B, T)
    for row, p in enumerate(prompts):
        if len(p):
            ids[row, width - len(p):] = p
            mask[row, width - len(p):] = 1
    return ids, mask


def positions(mask: np.ndarray) -> np.ndarray:
    """Positions that skip left padding: (B, T) mask -> (B, T) positions."""
    return np.clip(np.cumsum(mask, axis=1) - 1, 0, None).astype(np.int64)


FLOAT32 = np.dtype(np.float32)


def empty_past(batch: int, n_layer: int, n_head: int, head_dim: int, dtype: np.dtype = FLOAT32) -> Past:
    """A zero-length KV cache: (B, H, 0, hd) per key and value of each layer."""
    return [np.zeros((batch, n_head, 0, head_dim), dtype=dtype) for _ in range(2 * n_layer)]


def greedy(step: StepFn, prompts: Sequence[Sequence[int]], max_new_tokens: int, past: Past) -> list[list[int]]:
    """Greedy decoding of a left-padded batch: one prefill, then one token per step through the cache.
    Returns the new tokens of each prompt (no stop condition: exactly max_new_tokens each)."""
    ids, mask = left_pad(prompts)
    pos = positions(mask)
    logits, past = step(ids, mask, pos, past)
    out: list[list[int]] = [[] for _ in prompts]
    for i in range(max_new_tokens):
        nxt = logits[:, -1].argmax(axis=-1).astype(np.int64)  # (B,)
        for row, tok in enumerate(nxt):
            out[row].append(int(tok))
        if i == max_new_tokens - 1:
            break
        mask = np.concatenate([mask, np.ones((len(prompts), 1), dtype=np.int64)], axis=1)  # (B, P+1)
        pos = pos[:, -1:] + 1  # (B, 1)
        logits, past = step(nxt[:, None], mask, pos, past)
    return out
