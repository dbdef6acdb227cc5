"""Top-1 agreement between a variant and its reference that does not count the reference's near-ties.

The variants' gates (validate.gate, kv_quant.gate) ask that a quantized graph pick the reference's most
likely token at 98% of the held-out positions. Where the reference itself rates two tokens within a hair
of each other, which of them a variant picks is rounding, not accuracy: a model trained 16 steps had its
top two logits within 0.03 nats at every position, and an int8 variant with a mean KL of 1e-5 "agreed"
on only 96% of them. So a pick counts as agreeing when the reference's logit for it lies within
TIE_NATS of the reference's best. Logit differences are log-probability ratios, so the threshold needs
no scale: 0.02 nats is a 2% ratio of probabilities. No torch here.
"""

from __future__ import annotations

import numpy as np

TIE_NATS = 0.02  # the reference prefers its own pick by less than this: either token is its answer
TOP_K = 8  # reference logits kept per position where the whole row cannot be (kv_quant's decode)
KL_ROWS = 64  # positions whose KL the variants' gates compute at once (each temporary is (rows, V))


def agrees(want: np.ndarray, picks: np.ndarray) -> np.ndarray:
    """(..., V) reference logits and (...) a variant's picks -> (...) True where the pick is the reference's
    best or within TIE_NATS of it."""
    best = want.max(-1)
    chosen = np.take_along_axis(want, picks[..., None].astype(np.int64), axis=-1)[..., 0]
    return best - chosen <= TIE_NATS


def top_k(logits: np.ndarray, k: int = TOP_K) -> tuple[np.ndarray, np.ndarray]:
    """(..., V) logits -> their k largest values and ids (..., k), best first."""
    ids = np.argpartition(-logits, k - 1, axis=-1)[..., :k]
    vals = np.take_along_axis(logits, ids, axis=-1)
    order = np.argsort(-vals, axis=-1)
    return np.take_along_axis(vals, order, axis=-1), np.take_along_axis(ids, order, axis=-1)


def agrees_top_k(vals: np.ndarray, ids: np.ndarray, picks: np.ndarray) -> np.ndarray:
    """agrees() from the reference's top_k (..., k) instead of its whole rows: a pick outside them disagrees."""
    hit = ids == picks[..., None]  # (..., k)
    chosen = np.where(hit, vals, -np.inf).max(-1)
    return vals[..., 0] - chosen <= TIE_NATS


def score(want: np.ndarray, got: np.ndarray) -> tuple[int, float]:
    """(T, V) reference and variant logits of one window -> (positions whose pick agrees(), the sum of
    KL(reference || variant) over them), KL_ROWS positions at a time: what the variants' gates add up."""
    agree = int(agrees(want, got.argmax(-1)).sum())
    kl = 0.0
    for lo in range(0, len(want), KL_ROWS):
        log_p, log_q = log_softmax(want[lo:lo + KL_ROWS]), log_softmax(got[lo:lo + KL_ROWS])
        kl += float((np.exp(log_p) * (log_p - log_q)).sum())
    return agree, kl


def log_softmax(x: np.ndarray) -> np.ndarray:
    """(..., V) logits -> their log-probabilities."""
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))
