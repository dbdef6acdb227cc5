"""The engine interface: what the generation loop, the server's slots, evaluation and the bench need
of a model, and the array helpers they share. A step function takes input_ids (B, T), attention_mask
(B, P+T) and position_ids (B, T) as int64 numpy arrays and the KV cache (a list, [k0, v0, k1, v1, ...],
each (B, H, P, hd), in whatever form the engine keeps it), and returns the logits (B, T, V) as numpy and
the present cache. Engines: onnx_engine.OnnxModel (onnxruntime) and torch_engine.TorchEngine. No torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from gptport.config import ModelConfig

Past = list[Any]
StepFn = Callable[[np.ndarray, np.ndarray, np.ndarray, Past], tuple[np.ndarray, Past]]
FLOAT32 = np.dtype(np.float32)


class Engine(Protocol):
    """What the loop needs of a model: its context length, its config (vocabulary, special tokens), a step
    function and an empty cache."""

    @property
    def n_ctx(self) -> int: ...

    @property
    def config(self) -> ModelConfig: ...

    def step(self, last_only: bool = False) -> StepFn: ...

    def empty_past(self, batch: int) -> Past: ...


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


def empty_past(batch: int, n_layer: int, n_kv_head: int, head_dim: int, dtype: np.dtype = FLOAT32) -> Past:
    """A zero-length numpy KV cache: (B, Hkv, 0, hd) per key and value of each layer (Hkv: the config's
    n_kv_head, which is n_head but for grouped key/value heads)."""
    return [np.zeros((batch, n_kv_head, 0, head_dim), dtype=dtype) for _ in range(2 * n_layer)]
