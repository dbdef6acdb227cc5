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
    """One token id from a (V,) row of logits (`choose_rows` on one row)."""
    if s.greedy and s.repetition_penalty == 1.0:
        return int(logits.argmax())  # the decode loop's common case: no copy, no history
    return choose_rows(logits[None], [(s, rng, [seen])])[0]


Row = tuple[Sampling, np.random.Generator, Sequence[Iterable[int]]]  # settings, generator, the tokens seen
BLOCK = 256  # the draw's block: sums per block, then a cumulative sum inside one block


def choose_rows(logits: np.ndarray, rows: Sequence[Row]) -> list[int]:
    """One token per row of logits (k, V), row i with its settings, generator and history. Greedy rows
    take one argmax over all of them at once; sampled rows share the softmax and the draw (one uniform
    number from the row's generator, found in the row's cumulative probabilities)."""
    picks = [0] * len(rows)
    plain = [i for i, (s, _, _) in enumerate(rows) if s.greedy and s.repetition_penalty == 1.0]
    if plain:
        for i, tok in zip(plain, logits[plain].argmax(axis=-1).tolist(), strict=True):
            picks[i] = tok
    sampled: list[int] = []
    scaled: list[np.ndarray] = []
    for i, (s, _, seen) in enumerate(rows):
        if s.greedy and s.repetition_penalty == 1.0:
            continue
        row = logits[i]
        if s.repetition_penalty != 1.0:
            row = penalize(row.astype(np.float32), chain.from_iterable(seen), s.repetition_penalty)
        if s.greedy:
            picks[i] = int(row.argmax())
            continue
        row = row * np.float32(1.0 / s.temperature)  # (V,) float32, a copy
        if 0 < s.top_k < row.size:
            row[row < np.partition(row, -s.top_k)[-s.top_k]] = -np.inf
        sampled.append(i)
        scaled.append(row)
    if sampled:
        z = scaled[0][None] if len(scaled) == 1 else np.stack(scaled)  # (k, V), ours to overwrite
        for i, tok in zip(sampled, _draw(z, [rows[i] for i in sampled]), strict=True):
            picks[i] = tok
    return picks


def _draw(z: np.ndarray, rows: Sequence[Row]) -> list[int]:
    """Sample from softmax(z) row by row (k, V; z is overwritten): exp once for all rows, top-p per
    row, then one uniform number per row located through per-block sums and a cumulative sum inside
    one block, for all rows at once."""
    k, V = z.shape
    width = -(-V // BLOCK) * BLOCK
    p = z if width == V else np.zeros((k, width), dtype=np.float32)  # (k, V padded with zeros to whole blocks)
    np.subtract(z, z.max(axis=1, keepdims=True), out=p[:, :V])
    np.exp(p[:, :V], out=p[:, :V])
    for r, (s, _, _) in enumerate(rows):
        if s.top_p < 1.0:  # keep the smallest set of likeliest tokens whose probability reaches top_p
            row = p[r]
            order = np.argsort(-row[:V], kind="stable")
            cumulative = np.cumsum(row[order], dtype=np.float64)
            row[order[int(np.searchsorted(cumulative, s.top_p * cumulative[-1]) + 1):]] = 0.0
    blocks = np.cumsum(p.reshape(k, -1, BLOCK).sum(axis=2, dtype=np.float64), axis=1)  # (k, width / BLOCK)
    target = np.array([rng.random() for _, rng, _ in rows]) * blocks[:, -1]  # (k,)
    b = np.minimum((blocks <= target[:, None]).sum(axis=1), blocks.shape[1] - 1)  # (k,) the block of each draw
    rows_k = np.arange(k)
    start = np.where(b > 0, blocks[rows_k, b - 1], 0.0)  # (k,) the mass before that block
    inside = p.reshape(k, -1, BLOCK)[rows_k, b]  # (k, BLOCK)
    j = (np.cumsum(inside, axis=1, dtype=np.float64) + start[:, None] <= target[:, None]).sum(axis=1)  # (k,)
    out = []
    for r in range(k):  # rounding at a block's edge can point past its last drawable token
        jr = int(j[r])
        if jr >= BLOCK or inside[r, jr] == 0.0:
            jr = int(np.flatnonzero(inside[r])[-1])
        out.append(int(b[r]) * BLOCK + jr)
    return out


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


def probs(logits: np.ndarray, s: Sampling, seen: Iterable[int] = ()) -> np.ndarray:
    """The distribution `choose` draws from for a (V,) row of logits, as float64 (V,): the repetition
    penalty, temperature, top-k and top-p applied; greedy settings give a point mass on the argmax."""
    row = penalize(logits.astype(np.float32), seen, s.repetition_penalty)
    V = row.size
    if s.greedy:
        out = np.zeros(V, dtype=np.float64)
        out[int(row.argmax())] = 1.0
        return out
    row = row * np.float32(1.0 / s.temperature)
    if 0 < s.top_k < V:
        row[row < np.partition(row, -s.top_k)[-s.top_k]] = -np.inf
    p = np.exp((row - row.max()).astype(np.float64))  # (V,)
    if s.top_p < 1.0:  # as _draw: the smallest set of likeliest tokens whose probability reaches top_p
        order = np.argsort(-p, kind="stable")
        cumulative = np.cumsum(p[order])
        p[order[int(np.searchsorted(cumulative, s.top_p * cumulative[-1]) + 1):]] = 0.0
    return p / p.sum()


def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """One index from the probability vector p (V,), with one uniform number from rng."""
    cumulative = np.cumsum(p)
    j = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(j, int(np.flatnonzero(p)[-1]))
