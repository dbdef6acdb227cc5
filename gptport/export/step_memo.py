"""A step function's answers kept by their inputs: export checks the plain fp32 graph and then the optimized
one on the same parity cases, and torch's (and float64 torch's) answers to the same inputs are the same
numbers, so they are computed once (Gemma 3 270M: a 262,144-token head in float32 and float64 on each case).
The answers are shared: a caller must not write into them. No torch here."""

from __future__ import annotations

import hashlib

import numpy as np

from gptport.runtime.engine import Past, StepFn


class Memo:
    """`step` with its answers kept, keyed by the bytes, shapes and types of every input (ids, mask, positions,
    each past array); `clear()` lets them go."""

    def __init__(self, step: StepFn) -> None:
        self.step = step
        self.kept: dict[str, tuple[np.ndarray, Past]] = {}

    def __call__(self, ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, past: Past) -> tuple[np.ndarray, Past]:
        key = _key([ids, mask, pos, *past])
        if key not in self.kept:
            self.kept[key] = self.step(ids, mask, pos, past)
        return self.kept[key]

    def clear(self) -> None:
        self.kept.clear()


def _key(arrays: list[np.ndarray]) -> str:
    digest = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        digest.update(f"{a.dtype.str}{a.shape}".encode())
        digest.update(a.data)
    return digest.hexdigest()
