"""Next-token choice in numpy: greedy, temperature, min-p, top-k, top-p, and the repetition, frequency and
presence penalties. No torch.

The order is vLLM's (whose fields the server's API shares); the server adds logit_bias and a
constraint's mask before all of them:

1. the penalties, on the logits: the repetition penalty (CTRL's: a seen token's logit divided by it if
   positive, else multiplied; over the prompt and the generated tokens), then the frequency and presence
   penalties (OpenAI's: `logits[j] -= count[j] * frequency_penalty + (count[j] > 0) * presence_penalty`,
   with count[j] the times token j was generated so far; the prompt does not count);
2. greedy (temperature 0): the argmax of the penalized logits; nothing below changes it;
3. temperature: the logits divided by it;
4. min_p: a token whose probability is below min_p times the likeliest token's is dropped (on the
   scaled logits: below the top one plus ln min_p);
5. top-k, then top-p over what is left (renormalized); then one draw.

llama.cpp's default chain differs in one place: it applies temperature last, so its min_p sees the
distribution before temperature. The counts of the frequency and presence penalties are kept one token
at a time (`Counter`, updated as each token is generated) instead of recounted from the history.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from gptport.errors import UsageError

MAX_PENALTY = 2.0  # OpenAI's bound of frequency_penalty and presence_penalty (either sign)


@dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy (the default); top_k 0, top_p 1, min_p 0 and the penalties at 1 (repetition)
    or 0 (frequency, presence) switch those off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0
    # made from the above: frequency or presence penalties are on; the row is a plain argmax (no penalty of any kind)
    penalized: bool = field(init=False, repr=False, compare=False)
    plain: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise UsageError(f"--temperature must be >= 0 (0 is greedy), not {self.temperature}")
        if self.top_k < 0:
            raise UsageError(f"--top-k must be >= 0 (0 is off), not {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"--top-p must be in (0, 1], not {self.top_p}")
        if self.repetition_penalty <= 0:
            raise UsageError(f"--repetition-penalty must be > 0 (1 is off), not {self.repetition_penalty}")
        for name, value in (("presence", self.presence_penalty), ("frequency", self.frequency_penalty)):
            if not -MAX_PENALTY <= value <= MAX_PENALTY:  # NaN too
                raise UsageError(f"--{name}-penalty must be between -{MAX_PENALTY:g} and {MAX_PENALTY:g} (0 is off), "
                                 f"not {value}")
        if not 0.0 <= self.min_p <= 1.0:
            raise UsageError(f"--min-p must be between 0 and 1 (0 is off), not {self.min_p}")
        penalized = self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        object.__setattr__(self, "penalized", penalized)
        object.__setattr__(self, "plain", self.greedy and self.repetition_penalty == 1.0 and not penalized)

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


def discount(logits: np.ndarray, counts: Counter[int], frequency: float, presence: float) -> np.ndarray:
    """OpenAI's frequency and presence penalties, as a float32 copy of logits (V,): token j's logit less
    counts[j] * frequency, and less presence once where counts[j] > 0 (only the counted tokens are touched)."""
    out = logits.astype(np.float32)  # a copy
    if counts:
        ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        n = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
        out[ids] -= n * np.float32(frequency) + np.float32(presence)
    return out


def penalized(logits: np.ndarray, s: Sampling, seen: Iterable[int] = (), counts: Counter[int] | None = None
              ) -> np.ndarray:
    """The logits (V,) after the penalties `s` sets: the repetition penalty over `seen` (the prompt and the
    generated tokens), then the frequency and presence penalties over `counts` (the generated tokens'); a
    float32 copy, or `logits` itself when no penalty is on."""
    row = logits
    if s.repetition_penalty != 1.0:
        row = penalize(row.astype(np.float32), seen, s.repetition_penalty)
    if s.penalized and counts:
        row = discount(row, counts, s.frequency_penalty, s.presence_penalty)
    return row


def choose(logits: np.ndarray, s: Sampling, rng: np.random.Generator, seen: Iterable[int] = (),
           counts: Counter[int] | None = None) -> int:
    """One token id from a (V,) row of logits (`choose_rows` on one row)."""
    if s.plain:
        return int(logits.argmax())  # the decode loop's common case: no copy, no history
    return choose_rows(logits[None], [(s, rng, [seen], counts)])[0]


# settings, generator, the tokens seen (the prompt, the generated ones: the repetition penalty's), and the
# generated tokens' counts (the frequency and presence penalties'; None where those are off)
Row = tuple[Sampling, np.random.Generator, Sequence[Iterable[int]], Counter[int] | None]
BLOCK = 256  # the draw's block: sums per block, then a cumulative sum inside one block


def choose_rows(logits: np.ndarray, rows: Sequence[Row]) -> list[int]:
    """One token per row of logits (k, V), row i with its settings, generator, history and counts. Plain
    greedy rows take one argmax over all of them at once; sampled rows share the softmax and the draw (one
    uniform number from the row's generator, found in the row's cumulative probabilities)."""
    picks = [0] * len(rows)
    plain = [i for i, (s, *_) in enumerate(rows) if s.plain]
    if plain:
        for i, tok in zip(plain, logits[plain].argmax(axis=-1).tolist(), strict=True):
            picks[i] = tok
    sampled: list[int] = []
    scaled: list[np.ndarray] = []
    for i, (s, _, seen, counts) in enumerate(rows):
        if s.plain:
            continue
        row = penalized(logits[i], s, chain.from_iterable(seen), counts)
        if s.greedy:
            picks[i] = int(row.argmax())
            continue
        row = row * np.float32(1.0 / s.temperature)  # (V,) float32, a copy
        if s.min_p > 0.0:
            _min_p(row, s.min_p)
        if 0 < s.top_k < row.size:
            row[row < np.partition(row, -s.top_k)[-s.top_k]] = -np.inf
        sampled.append(i)
        scaled.append(row)
    if sampled:
        z = scaled[0][None] if len(scaled) == 1 else np.stack(scaled)  # (k, V), ours to overwrite
        for i, tok in zip(sampled, _draw(z, [rows[i] for i in sampled]), strict=True):
            picks[i] = tok
    return picks


def _min_p(row: np.ndarray, min_p: float) -> None:
    """-inf (in place) on each scaled logit whose probability is below min_p times the likeliest one's:
    p_j < min_p * p_max is z_j < z_max + ln(min_p)."""
    row[row < row.max() + np.float32(math.log(min_p))] = -np.inf


def _draw(z: np.ndarray, rows: Sequence[Row]) -> list[int]:
    """Sample from softmax(z) row by row (k, V; z is overwritten): exp once for all rows, top-p per
    row, then one uniform number per row located through per-block sums and a cumulative sum inside
    one block, for all rows at once."""
    k, V = z.shape
    width = -(-V // BLOCK) * BLOCK
    p = z if width == V else np.zeros((k, width), dtype=np.float32)  # (k, V padded with zeros to whole blocks)
    np.subtract(z, z.max(axis=1, keepdims=True), out=p[:, :V])
    np.exp(p[:, :V], out=p[:, :V])
    for r, (s, *_) in enumerate(rows):
        if s.top_p < 1.0:  # keep the smallest set of likeliest tokens whose probability reaches top_p
            row = p[r]
            order = np.argsort(-row[:V], kind="stable")
            cumulative = np.cumsum(row[order], dtype=np.float64)
            row[order[int(np.searchsorted(cumulative, s.top_p * cumulative[-1]) + 1):]] = 0.0
    blocks = np.cumsum(p.reshape(k, -1, BLOCK).sum(axis=2, dtype=np.float64), axis=1)  # (k, width / BLOCK)
    target = np.array([rng.random() for _, rng, *_ in rows]) * blocks[:, -1]  # (k,)
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


def probs(logits: np.ndarray, s: Sampling, seen: Iterable[int] = (), counts: Counter[int] | None = None
          ) -> np.ndarray:
    """The distribution `choose` draws from for a (V,) row of logits, as float64 (V,): the penalties,
    temperature, min-p, top-k and top-p applied; greedy settings give a point mass on the argmax."""
    row = penalized(logits.astype(np.float32), s, seen, counts)
    V = row.size
    if s.greedy:
        out = np.zeros(V, dtype=np.float64)
        out[int(row.argmax())] = 1.0
        return out
    row = row * np.float32(1.0 / s.temperature)
    if s.min_p > 0.0:
        _min_p(row, s.min_p)
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
