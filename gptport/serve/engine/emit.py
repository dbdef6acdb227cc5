"""The sampling half of the scheduler (scheduler.py): each row's next token chosen from its logits
(its logit_bias added, its constraint's mask applied), its text emitted, what is finished finished.
No torch here."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from gptport.runtime.accept import ConstraintRefused, FinishReason
from gptport.runtime.sampling import choose_rows, logprob_entries
from gptport.serve.engine.choice import Choice
from gptport.serve.engine.events import Event, Failure, Finish, Observer, Piece

if TYPE_CHECKING:
    from gptport.runtime.constraint import Masks
    from gptport.runtime.slots import SlotEngine


class Emitting:
    """Scheduler's sampling and emitting methods. A mixin: the Scheduler state they read is declared here
    (tests/serve/engine/test_interface.py holds every `self.` read to it)."""

    engine: SlotEngine
    observer: Observer
    end_ids: frozenset[int]  # any ends a choice (unless it ignores them)
    masks: Masks | None
    _masking: Any  # the Future of the masks started before the model ran, or None
    _release: Callable[[Choice], None]  # Scheduler's: c's slot free again

    def _sample(self, rows: list[Choice], logits: np.ndarray, events: list[tuple[Any, Event]], now: float,
                picks: list[int] | None = None) -> list[Choice]:
        """Choose each row's next token from logits (k, V) (or take `picks`, chosen already), emit its
        text, finish what is finished; the rows that go on decoding."""
        t0 = time.perf_counter()
        self.observer.tokens(0, len(rows))
        raw = self._adjust(rows, logits)
        t_mask = time.perf_counter()
        if picks is None:
            picks = choose_rows(logits, [(c.sampling, c.rng, (c.prompt_ids, c.new_ids), c.counts) for c in rows])
        t1 = time.perf_counter()
        still: list[Choice] = []
        for i, (c, tok) in enumerate(zip(rows, picks, strict=True)):
            row_logits = raw.get(i, logits[i])
            if c.new_ids:
                self.observer.next_token(now - c.t_last)
            c.t_last = now
            lp = logprob_entries(row_logits[None], [tok], c.logprobs)[0:1] if c.logprobs is not None else None
            assert c.taker is not None and c.text_stream is not None  # started at admission
            try:
                reason = c.taker.accept(tok)
            except ConstraintRefused as e:
                events.append((c.out, Failure(str(e))))
                self._release(c)
                continue
            if reason is None and self.engine.length(c.slot) >= self.engine.n_ctx:
                reason = FinishReason.CONTEXT
            text = c.take_text()
            if reason is not None:  # what the stream held back (nothing after a stop string)
                text += c.text_stream.finish()
            if text or lp:
                events.append((c.out, Piece(text, lp)))
            if reason is None:
                still.append(c)
                continue
            events.append((c.out, Finish(reason.openai, len(c.prompt_ids), len(c.new_ids), c.cached)))
            self._release(c)
        if raw or t_mask - t0 > 1e-4:
            self.observer.phase("mask", t_mask - t0)
        self.observer.phase("sample", t1 - t_mask)
        self.observer.phase("emit", time.perf_counter() - t1)
        return still

    def _adjust(self, rows: list[Choice], logits: np.ndarray) -> dict[int, np.ndarray]:
        """Each row's logit_bias added, and -inf on every logit a row's constraint disallows (logits (k, V),
        in place); the logits of those rows as the model gave them, for log-probabilities (only rows that
        ask for them)."""
        at = [i for i, c in enumerate(rows) if c.matcher is not None or c.logit_bias]
        if not at:
            return {}
        raw = {i: logits[i].copy() for i in at if rows[i].logprobs is not None}
        for i in at:
            bias = rows[i].logit_bias
            if bias:
                ids = np.fromiter(bias.keys(), dtype=np.int64)
                logits[i, ids] += np.fromiter(bias.values(), dtype=np.float32)
        masked = [i for i in at if rows[i].matcher is not None]
        if masked and self.masks is not None:
            if self._masking is not None:  # started before the model ran
                self._masking.result()
                self._masking = None
            matchers = [rows[i].matcher for i in masked]
            self.masks.fill(matchers)  # type: ignore[arg-type]  # any the background did not reach
            self.masks.apply(logits, masked, matchers)  # type: ignore[arg-type]
        return raw
