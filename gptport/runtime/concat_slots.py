"""ConcatSlots: continuous batching's slots (slots.SlotEngine) over any `Engine`'s step function, the contract
graph on any provider or the torch model: the decoding slots' caches are one left-padded batch; a slot joins it
by padding and leaves by being cut out. No torch here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gptport.runtime.engine import Engine, Past
from gptport.runtime.slots import SlotEngine


def _host(value: Any) -> np.ndarray:
    """A cache tensor as numpy (OrtValues of GPU engines are copied down)."""
    return value if isinstance(value, np.ndarray) else np.asarray(value.numpy())


class ConcatSlots(SlotEngine):
    """Slots over any engine's step function: the decoding slots' caches are one left-padded batch
    (B, H, P, hd) with its attention mask (B, P); a slot being filled keeps a cache of its own. None of
    the optional methods: a freed slot's cache is cut out of the batch."""

    def __init__(self, engine: Engine, slots: int, n_ctx: int | None = None) -> None:
        self.engine, self.slots, self.n_ctx = engine, slots, n_ctx or engine.n_ctx
        self._last, self._all = engine.step(last_only=True), engine.step(last_only=False)
        self.lengths = np.zeros(slots, dtype=np.int64)
        self._solo: dict[int, Past] = {}  # slot -> its own (1, H, L, hd) cache while being filled
        self._rows: list[int] = []  # slots in batch order
        self._mask = np.zeros((0, 0), dtype=np.int64)  # (B, P)
        self._past: Past = []

    def length(self, slot: int) -> int:
        return int(self.lengths[slot])

    def append(self, slot: int, ids: np.ndarray, all_logits: bool = False) -> np.ndarray:
        if slot in self._rows:
            raise ValueError(f"slot {slot} is decoding; append fills a slot before its first decode")
        start, T = int(self.lengths[slot]), len(ids)
        if start + T > self.n_ctx:
            raise ValueError(f"slot {slot}: {start} + {T} positions exceed n_ctx {self.n_ctx}")
        past = self._solo.get(slot) or self.engine.empty_past(1)
        mask = np.ones((1, start + T), dtype=np.int64)  # (1, L + T)
        pos = np.arange(start, start + T, dtype=np.int64)[None, :]  # (1, T)
        logits, self._solo[slot] = (self._all if all_logits else self._last)(ids[None, :].astype(np.int64), mask,
                                                                             pos, past)
        self.lengths[slot] += T
        return logits[0]  # (T, V) or (1, V)

    def _join(self, slot: int) -> None:
        """Move a filled slot's own cache into the batch, left-padding whichever is shorter."""
        own = [_host(v) for v in self._solo.pop(slot)]  # (1, H, L, hd)
        L = own[0].shape[2]
        if not self._rows:
            self._rows, self._past, self._mask = [slot], own, np.ones((1, L), dtype=np.int64)
            return
        batch = [_host(v) for v in self._past]
        P = batch[0].shape[2]
        width = max(P, L)

        def pad(a: np.ndarray, n: int) -> np.ndarray:  # n zeros on the left of the sequence axis
            return a if n == 0 else np.pad(a, [(0, 0), (0, 0), (n, 0), (0, 0)])

        self._past = [np.concatenate([pad(b, width - P), pad(o, width - L)]) for b, o in zip(batch, own, strict=True)]
        row_mask = np.zeros((1, width), dtype=np.int64)
        row_mask[0, width - L:] = 1
        self._mask = np.concatenate([np.pad(self._mask, [(0, 0), (width - P, 0)]), row_mask])
        self._rows.append(slot)

    def decode(self, slots: Sequence[int], tokens: np.ndarray) -> np.ndarray:
        for slot in slots:
            if slot not in self._rows:
                self._join(slot)
        if sorted(slots) != sorted(self._rows):
            raise ValueError("decode steps every decoding slot at once; free the others first")
        order = {slot: i for i, slot in enumerate(self._rows)}
        ids = np.zeros((len(self._rows), 1), dtype=np.int64)  # (B, 1)
        ids[[order[s] for s in slots], 0] = tokens
        self._mask = np.concatenate([self._mask, np.ones((len(self._rows), 1), dtype=np.int64)], axis=1)  # (B, P+1)
        pos = self.lengths[self._rows][:, None]  # (B, 1)
        logits, self._past = self._last(ids, self._mask, pos, self._past)
        self.lengths[self._rows] += 1
        return logits[[order[s] for s in slots], -1]  # (k, V)

    def free(self, slot: int) -> None:
        self.lengths[slot] = 0
        self._solo.pop(slot, None)
        if slot not in self._rows:
            return
        i = self._rows.index(slot)
        self._rows.pop(i)
        keep = [r for r in range(len(self._rows) + 1) if r != i]
        self._mask = self._mask[keep]
        self._past = [_host(v)[keep] for v in self._past]
        if self._rows:  # drop the columns no remaining row uses
            first = int(np.argmax(self._mask.any(axis=0)))
            self._mask = self._mask[:, first:]
            self._past = [v[:, :, first:] for v in self._past]
        else:
            self._mask, self._past = np.zeros((0, 0), dtype=np.int64), []
