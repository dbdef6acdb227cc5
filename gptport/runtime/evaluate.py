"""Perplexity and bits per byte of held-out text over a sliding window, on any engine. No torch here.

The text is encoded after one token, so that every text token is predicted from something: the model's
begin token where it has one, else <|endoftext|> (specials.document_start).
Windows of n_ctx tokens advance by `stride`; each scores only the tokens no earlier window scored, so
every token is scored once, with at least n_ctx - stride tokens of context (all of it in the first window).
With `per_token`, the result also holds each scored token's id and natural-log probability, in text order
(what a server's `echo` + `logprobs` reports for the same tokens after <|endoftext|>).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gptport.errors import InputError, UsageError
from gptport.runtime.engine import Engine, positions
from gptport.specials import document_start
from gptport.tokenizer import BPETokenizer, token_bytes


@dataclass(frozen=True)
class EvalResult:
    perplexity: float
    bits_per_byte: float
    nats_per_token: float
    tokens: int
    bytes: int
    windows: int
    token_ids: tuple[int, ...] = ()  # the scored tokens (with per_token; empty otherwise)
    token_logprobs: tuple[float, ...] = ()  # log p(token | the tokens before it), natural log


def evaluate(engine: Engine, tok: BPETokenizer, text: str, stride: int | None = None,
             progress: Callable[[int, int], None] | None = None, per_token: bool = False) -> EvalResult:
    """Score `text` with `engine` (onnx or torch) and return its perplexity and bits per byte (and, with
    `per_token`, each token's log-probability)."""
    n_ctx = engine.n_ctx
    stride = n_ctx // 2 if stride is None else stride
    if not 0 < stride <= n_ctx:
        raise UsageError(f"--stride must be in 1..{n_ctx} (the model's n_ctx), not {stride}")
    ids = np.array([document_start(engine.config, tok), *tok.encode(text)], dtype=np.int64)
    if len(ids) < 2:
        raise InputError("nothing to evaluate: the text is empty")
    sizes = token_bytes(tok)
    step = engine.step()
    nats, scored, n_bytes, windows = 0.0, 0, 0, 0
    logprobs: list[float] = []
    end = 0  # targets ids[1:end + 1] are scored
    total = len(ids) - 1
    while end < total:
        new_end = min(end + stride, total) if end else min(n_ctx, total)
        start = max(0, new_end - n_ctx)  # the window ids[start:new_end] predicts ids[start + 1:new_end + 1]
        window = ids[start:new_end][None, :]  # (1, T)
        mask = np.ones_like(window)
        logits, _ = step(window, mask, positions(mask), engine.empty_past(1))
        logits = logits[0].astype(np.float64)  # (T, V)
        first = end - start  # the positions before this were scored by an earlier window
        targets = ids[start + 1 + first:new_end + 1]  # (S,)
        rows = logits[first:first + len(targets)]  # (S, V)
        top = rows.max(-1, keepdims=True)
        log_z = (top[:, 0] + np.log(np.exp(rows - top).sum(-1)))  # (S,)
        token_nats = log_z - rows[np.arange(len(targets)), targets]  # (S,)
        nats += float(token_nats.sum())
        if per_token:
            logprobs.extend(float(-x) for x in token_nats)
        scored += len(targets)
        n_bytes += int(sizes[targets].sum())
        end, windows = new_end, windows + 1
        if progress:
            progress(end, total)
    mean = nats / scored
    kept = tuple(int(t) for t in ids[1:]) if per_token else ()
    return EvalResult(math.exp(mean), nats / math.log(2) / max(n_bytes, 1), mean, scored, n_bytes, windows,
                      kept, tuple(logprobs))
