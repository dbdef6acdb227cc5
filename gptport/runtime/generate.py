"""The generation loop over any engine (engine.py): an onnxruntime session or the torch model. The
loop knows only token ids. No torch here.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Literal

import numpy as np

from gptport.runtime.accept import Accepting, FinishReason
from gptport.runtime.engine import Capability, Engine, bursting, left_pad, positions, require
from gptport.runtime.sampling import Sampling, choose
from gptport.specials import as_ends

if TYPE_CHECKING:  # llguidance loads only when a constraint is asked for
    from gptport.runtime.constraint import Matcher

Overflow = Literal["slide", "stop"]

@dataclass
class RowResult:
    """One prompt's generation."""

    prompt_ids: list[int]
    new_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason = FinishReason.LENGTH
    prefill_ms: float = 0.0
    decode_s: float = 0.0

    @property
    def decode_tok_s(self) -> float:
        steps = max(len(self.new_ids) - 1, 0)  # the first new token comes from the prefill
        return steps / self.decode_s if self.decode_s > 0 else 0.0


def generate(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: Sampling,
    eot_id: int | Collection[int],
    overflow: Overflow = "slide",
    on_token: Callable[[int, int], bool] | None = None,
    matchers: Sequence[Matcher | None] | None = None,
) -> list[RowResult]:
    """Generate for a batch of prompts: one prefill, then one token per step through the KV cache.

    A row stops at `eot_id` (one end token, or a set of them: any ends it; specials.end_ids), when
    `on_token(row, token)` returns True (a stop string), or after `max_new_tokens`. Each row samples
    with its own generator seeded with `sampling.seed`, so it gives the text it would give alone. When
    the sequence reaches n_ctx: `slide` re-prefills each row's most recent n_ctx // 2 tokens and goes
    on; `stop` ends every unfinished row with reason "context".
    A row with a matcher (runtime/constraint.py) samples only what its grammar allows and ends with
    reason "grammar" when the grammar is complete; its next mask is computed while the step runs.
    Each chosen token goes through accept.Accepting, which gives the finish reasons.
    """
    step, n_ctx = engine.step(last_only=True), engine.n_ctx
    rows = [RowResult(list(p)) for p in prompts]
    rngs = [np.random.default_rng(sampling.seed) for _ in prompts]
    active = [True] * len(rows)
    constrained = None
    if matchers and any(matchers):
        require(engine, Capability.CONSTRAIN, "a constraint")
        constrained = Constrained(matchers, engine.config.vocab_size)
    ends = as_ends(eot_id)
    takers = [_taker(row, i, ends, max_new_tokens, sampling, on_token, matchers) for i, row in enumerate(rows)]

    # LongRoPE: the step that takes a row past the original context recomputes the cache whole, so every position of
    # that row takes the long factors (transformers' Phi3 generate drops its cache there; design record 0050)
    regrow = engine.config.rope_original_n_ctx + 1 if engine.config.rope_scaling == "longrope" else 0
    t0 = time.perf_counter()
    ids, mask = left_pad([r.prompt_ids for r in rows])  # (B, P)
    pos = positions(mask)
    logits, past = step(ids, mask, pos, engine.empty_past(len(rows)))
    prefill_ms = (time.perf_counter() - t0) * 1e3
    # greedy rows on an engine asked to decode several steps a run on its own (cuda_engine.DeviceModel.burst):
    # each burst's tokens are taken one per iteration, as if chosen from their logits
    burster = bursting(engine) if sampling.plain and constrained is None else None
    k = burster.bursts if burster is not None else 0
    if burster is not None:
        burster.prepare_bursts()  # once per engine
    pending: list[np.ndarray] = []  # the current burst's columns not taken yet, (B,) each
    t_decode = time.perf_counter()
    for taken in range(max_new_tokens):
        if constrained is not None:
            constrained.mask(logits, active)
        nxt = _choose_all(rows, takers, active, logits, sampling, rngs, ends,
                          pending.pop(0) if pending else None)  # (B,)
        if constrained is not None:
            constrained.start_next(active)
        if not any(active):
            break
        if pending:  # in the cache already: the burst's next token is taken without a step
            continue
        if k and mask.shape[1] + k <= n_ctx and max_new_tokens - taken - 1 >= k and not regrow:  # room, k to take
            assert burster is not None
            pending = list(burster.burst(past, nxt).T)
            mask = np.concatenate([mask, np.ones((len(rows), k), dtype=np.int64)], axis=1)  # (B, P+k)
            pos = pos[:, -1:] + k
            continue
        if regrow and any(a and len(r.prompt_ids) + len(r.new_ids) == regrow for a, r in zip(active, rows,
                                                                                             strict=True)):
            # a row just past LongRoPE's original context: every row's sequence again
            ids, mask = left_pad([r.prompt_ids + r.new_ids for r in rows])
            pos = positions(mask)
            logits, past = step(ids, mask, pos, engine.empty_past(len(rows)))
        elif mask.shape[1] < n_ctx:  # room for one more token: one decode step through the cache
            mask = np.concatenate([mask, np.ones((len(rows), 1), dtype=np.int64)], axis=1)  # (B, P+1)
            pos = pos[:, -1:] + 1  # (B, 1)
            logits, past = step(nxt[:, None], mask, pos, past)
        elif overflow == "stop":
            for i, row in enumerate(rows):
                if active[i]:
                    active[i], row.finish_reason = False, FinishReason.CONTEXT
            break
        else:  # slide: a fresh cache from each row's most recent n_ctx // 2 tokens
            ids, mask = left_pad([(r.prompt_ids + r.new_ids)[-(n_ctx // 2):] for r in rows])
            pos = positions(mask)
            logits, past = step(ids, mask, pos, engine.empty_past(len(rows)))
    decode_s = time.perf_counter() - t_decode
    for row in rows:
        row.prefill_ms, row.decode_s = prefill_ms, decode_s
    return rows


def _taker(row: RowResult, i: int, ends: frozenset[int], max_new_tokens: int, sampling: Sampling,
           on_token: Callable[[int, int], bool] | None, matchers: Sequence[Matcher | None] | None) -> Accepting:
    """Row i's acceptance: its new ids, its penalties' counts, `on_token` as its stop watcher, its matcher."""
    stop = (lambda tok: on_token(i, tok)) if on_token is not None else None
    return Accepting(max_new_tokens, ends, row.new_ids, Counter() if sampling.penalized else None, stop,
                     matchers[i] if matchers else None)


def _choose_all(rows: list[RowResult], takers: list[Accepting], active: list[bool], logits: np.ndarray,
                sampling: Sampling, rngs: list[np.random.Generator], ends: frozenset[int],
                chosen: np.ndarray | None = None) -> np.ndarray:
    """Each active row's next token from `logits` (B, 1, V), or `chosen` (B,) when a burst chose them, taken
    by its Accepting; rows that end are marked inactive with their reason. Finished rows get an end token,
    which the next step computes and nobody reads."""
    nxt = np.full(len(rows), min(ends, default=0), dtype=np.int64)  # (B,)
    for i, row in enumerate(rows):
        if not active[i]:
            continue
        taker = takers[i]
        tok = (int(chosen[i]) if chosen is not None
               else choose(logits[i, -1], sampling, rngs[i], chain(row.prompt_ids, row.new_ids), taker.counts))
        nxt[i] = tok
        reason = taker.accept(tok)
        if reason is not None:
            active[i], row.finish_reason = False, reason
    return nxt


class Constrained:
    """The rows' matchers' masks: applied before a choice (each row's Accepting advances its matcher), the
    next ones started in the background while the engine's step runs."""

    def __init__(self, matchers: Sequence[Matcher | None], vocab_size: int) -> None:
        from gptport.runtime.constraint import Masks

        self.matchers, self.masks = list(matchers), Masks(vocab_size)
        self.pending = self.masks.start([m for m in self.matchers if m is not None])

    def mask(self, logits: np.ndarray, active: list[bool]) -> None:
        """-inf where an active row's grammar forbids a token (logits (B, 1, V), in place)."""
        if self.pending is not None:
            self.pending.result()
        rows = [i for i, m in enumerate(self.matchers) if m is not None and active[i]]
        if rows:
            ms = [self.matchers[i] for i in rows]
            self.masks.fill(ms)  # type: ignore[arg-type]
            last = logits[:, -1]  # (B, V)
            self.masks.apply(last, rows, ms)  # type: ignore[arg-type]
            logits[:, -1] = last

    def start_next(self, active: list[bool]) -> None:
        """Start the next masks of the rows still going (their matchers took this step's tokens)."""
        self.pending = self.masks.start([m for i, m in enumerate(self.matchers) if m is not None and active[i]])
