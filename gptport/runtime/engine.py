"""The engine interface: what the generation loop, the server's slots, evaluation and the bench need
of a model, and the array helpers they share. A step function takes input_ids (B, T), attention_mask
(B, P+T) and position_ids (B, T) as int64 numpy arrays and the KV cache (a list, [k0, v0, k1, v1, ...],
each (B, H, P, hd), in whatever form the engine keeps it), and returns the logits (B, T, V) as numpy and
the present cache. Engines: onnx_engine.OnnxModel (onnxruntime), cuda_engine.DeviceModel and
torch_engine.TorchEngine. Each declares what it can do beyond stepping (`capabilities`); a feature that needs
one asks with `require`, whose refusal names what the engine lacks. No torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any, Protocol, cast

import numpy as np

from gptport.config import ModelConfig
from gptport.errors import UsageError

Past = list[Any]
StepFn = Callable[[np.ndarray, np.ndarray, np.ndarray, Past], tuple[np.ndarray, Past]]
FLOAT32 = np.dtype(np.float32)


class Capability(Enum):
    """What an engine can do beyond stepping, each the words a refusal uses for it."""

    STATIC_SLOTS = "a preallocated cache written in place (the static-cache graph)"
    APPEND_ROWS = "the multi-row append graph beside it (the fp32 static-cache graph, float32 cache, on the CPU)"
    DEVICE_SLOTS = "slots kept on the device (export --cuda's graphs)"
    BURST = "greedy bursts (export --cuda's graphs on --provider cuda)"
    DRAFT = "drafts rolled back in place (the static-cache graph)"
    CONSTRAIN = "a mask on each step's logits on the host"


class Engine(Protocol):
    """What the loop needs of a model: its context length, its config (vocabulary, special tokens), a step
    function, an empty cache, and what else it can do."""

    @property
    def capabilities(self) -> frozenset[Capability]: ...

    @property
    def n_ctx(self) -> int: ...

    @property
    def config(self) -> ModelConfig: ...

    def step(self, last_only: bool = False) -> StepFn: ...

    def empty_past(self, batch: int) -> Past: ...


class Bursting(Engine, Protocol):
    """An engine with Capability.BURST: `bursts` greedy decode steps a run (0: one a run), once
    prepare_bursts() made their session (cuda_engine.DeviceModel)."""

    bursts: int

    def prepare_bursts(self) -> None: ...

    def burst(self, past: Past, tokens: np.ndarray) -> np.ndarray: ...


def bursting(engine: Engine) -> Bursting | None:
    """The engine as a Bursting one when it declares Capability.BURST and bursts are on, else None."""
    if Capability.BURST not in engine.capabilities:
        return None
    bursty = cast(Bursting, engine)
    return bursty if bursty.bursts else None


def require(engine: Engine, capability: Capability, feature: str, hint: str = "") -> None:
    """Refuse `feature` (a UsageError naming it and what the engine lacks, then `hint`) unless the engine
    declares `capability`."""
    if capability not in engine.capabilities:
        raise UsageError(f"{feature} needs {capability.value}" + (f": {hint}" if hint else ""))


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
