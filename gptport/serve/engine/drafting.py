"""Speculative decoding in the server: while one choice decodes alone, a drafter's tokens are verified in
one step of the model (runtime/speculative.py) instead of one token per step. No torch here.

Only a lone row drafts: with two or more rows decoding, a step already reads the weights once for several
tokens, and drafts would lengthen every row's step for one row's gain (benchmarks/bench_speculative.py
measures the lone row). Constrained rows and rows with a logit_bias decode plainly: their logits are
adjusted before sampling, which the accept/resample rule does not see. Rows with penalties do draft: the
drafter and the verifying step apply them as of each position, from the choice's counts.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from gptport.runtime.speculative import K_MAX, K_START, Drafter, verify

if TYPE_CHECKING:
    from gptport.runtime.slots import SlotEngine
    from gptport.serve.engine.choice import Choice


class Drafting:
    """A drafter and the draft length: fixed, or adaptive (None: grows by 2 while every draft stands,
    shrinks by 1 otherwise, within 1..K_MAX)."""

    def __init__(self, drafter: Drafter, draft_tokens: int | None = None) -> None:
        self.drafter, self.fixed = drafter, draft_tokens
        self.k = draft_tokens or K_START

    def eligible(self, c: Choice) -> bool:
        """Whether this lone decoding choice may draft."""
        return c.matcher is None and not c.logit_bias

    def step(self, engine: SlotEngine, c: Choice, observer: Any) -> tuple[np.ndarray, list[int] | None]:
        """One step of the model for choice c (its slot on a StaticSlots engine): the logits (T, V) of the
        positions whose tokens come now, and those tokens (the drafts that stood and the model's own
        after them), or None when nothing was drafted and the one row of logits is still to be sampled.
        The rejected drafts' positions are rolled back."""
        seq = [*c.prompt_ids, *c.new_ids]
        length = engine.length(c.slot)  # every token but the last, whose logits come now
        # room for the drafts and one more: the last token emitted is never the one that fills n_ctx
        want = min(self.k, engine.n_ctx - length - 2, c.max_tokens - len(c.new_ids) - 1)
        t0 = time.perf_counter()
        drafts, dists = self.drafter.propose(seq, want, c.sampling, c.rng, c.counts) if want > 0 else ([], [])
        t1 = time.perf_counter()
        observer.phase("draft", t1 - t0)
        if not drafts:
            logits = engine.decode([c.slot], np.array([seq[-1]], dtype=np.int64))  # (1, V)
            observer.phase("decode", time.perf_counter() - t1)
            return logits, None
        logits = engine.append(c.slot, np.asarray([seq[-1], *drafts], dtype=np.int64), all_logits=True)  # (T, V)
        observer.phase("decode", time.perf_counter() - t1)
        accepted, own = verify(logits, drafts, dists, c.sampling, c.rng, seq, c.counts)
        engine.truncate(c.slot, length + 1 + len(accepted))
        observer.drafts(len(drafts), len(accepted))
        if self.fixed is None:
            self.k = min(self.k + 2, K_MAX) if len(accepted) == want else max(1, self.k - 1)
        return logits, [*accepted, own]
