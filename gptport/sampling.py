"""Next-token choice in numpy: greedy, temperature, top-k, top-p, repetition penalty. No torch."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from gptport.errors import UsageError


@dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy (the default); top_k 0 and top_p 1 switch those filters off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise UsageError(f"--temperature must be >= 0 (0 is greedy), not {self.temperature}")
        if self.top_k < 0:
            raise UsageError(f"--top-k must be >= 0 (0 is off), not {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"--top-p must be in (0, 1], not {self.top_p}")
        if self.repetition_penalty <= 0:
            raise UsageError(f"--repetition-penalty must be > 0 (1 is off), not {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def penalize(logits: np.ndarray, seen: Iterable[int], penalty: float) -> np.ndarray:
    """CTRL's repetition penalty: a seen token's logit is divided by `penalty` if positive, else multiplied."""
    if penalty == 1.0:
        return logits
    ids = np.fromiter(set(seen), dtype=np.int64)
    if ids.size == 0:
        return logits
    out = logits.copy()
    picked = out[ids]
    out[ids] = np.where(picked > 0, picked / penalty, picked * penalty)
    return out


def choose(logits: np.ndarray, s: Sampling, rng: np.random.Generator, seen: Iterable[int] = ()) -> int:
    """One token id from a (V,) row of logits."""
    if s.greedy and s.repetition_penalty == 1.0:
        return int(logits.argmax())  # the decode loop's common case: no copy, no history
    logits = penalize(logits.astype(np.float64), seen, s.repetition_penalty)
    if s.greedy:
        return int(logits.argmax())
    logits = logits / s.temperature
    if 0 < s.top_k < logits.size:
        kth = np.partition(logits, -s.top_k)[-s.top_k]
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    if s.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        keep = order[: int(np.searchsorted(cumulative, s.top_p) + 1)]  # smallest set reaching top_p
        mask = np.zeros_like(probs)
        mask[keep] = probs[keep]
        probs = mask / mask.sum()
    return int(rng.choice(probs.size, p=probs))


def choose_rows(logits: np.ndarray, rows: Sequence[tuple[Sampling, np.random.Generator, Sequence[Sequence[int]]]]
                ) -> list[int]:
    """One token per row of logits (k, V): row i with its settings, generator and history (the token
    lists it has seen). Greedy rows without a penalty take one argmax over all of them at once."""
    picks = [0] * len(rows)
    plain = [i for i, (s, _, _) in enumerate(rows) if s.greedy and s.repetition_penalty == 1.0]
    if plain:
        for i, tok in zip(plain, logits[plain].argmax(axis=-1).tolist(), strict=True):
            picks[i] = tok
    for i, (s, rng, history) in enumerate(rows):
        if not (s.greedy and s.repetition_penalty == 1.0):
            picks[i] = choose(logits[i], s, rng, chain.from_iterable(history))
    return picks


def logprob_entries(logits: np.ndarray, tokens: Sequence[int], top: int
                    ) -> list[tuple[int, float, list[tuple[int, float]]]]:
    """For each row of logits (n, V) and the token that followed it: the token's log-probability under
    the model (before temperature or filters) and the `top` likeliest tokens with theirs."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))  # (n, V)
    out = []
    for row, tok in zip(lp, tokens, strict=False):
        best = np.argpartition(-row, top)[:top] if 0 < top < row.size else np.arange(row.size if top else 0)
        best = best[np.argsort(-row[best], kind="stable")]
        out.append((int(tok), float(row[tok]), [(int(t), float(row[t])) for t in best]))
    return out
