"""The prefill half of the scheduler (scheduler.py): prompt chunks appended to their slots within the
iteration's budget, prompts prefilled together, first tokens sampled and handed over early. No torch here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gptport.runtime.sampling import logprob_entries
from gptport.serve.engine import prefix
from gptport.serve.engine.choice import Choice
from gptport.serve.engine.events import Event, PromptLogprobs


class Prefilling:
    """Scheduler's prefill methods (a mixin: the state they use is Scheduler's)."""

    def _prefill(self, events: list[tuple[Any, Event]], early: Callable[..., None] | None = None) -> None:
        """Fill slots in admission order with up to prefill_chunk prompt tokens in all. With a multi-row
        append graph (supports_append_many), every chunk of this iteration — fresh prompts, the rests after
        a reused prefix, new chat turns, a long prompt's next chunk — is appended in one step; without it,
        whole prompts that fit, in empty slots next to each other, are prefilled together in one step and
        the others one slot at a time. A choice that waits on another's prompt (prefix.py) copies it once
        that one holds it. Each choice whose prompt is complete samples its first token at once, handed
        to `early` before the next prefill."""
        budget = self.prefill_chunk
        batched: set[int] = set()
        self._joining = []
        together = self.engine.supports_append_many
        pending: list[tuple[Choice, np.ndarray]] = []  # chunks appended together after the loop
        if self.engine.supports_prefill_many and not together:
            budget, batched = self._prefill_together(budget, events, early)
        for c in self._filling:
            if id(c) in batched:
                continue
            if c.twin is not None:
                if not prefix.resolve(self.engine, c, self.observer):
                    continue
                if c.filled == len(c.prompt_ids):  # a copy of the whole prompt: its source's first logits
                    self._first_tokens([(c, c.first_logits)], events, early)  # type: ignore[list-item]
                    continue
            if budget <= 0:
                continue  # later choices may still copy what earlier ones hold
            n = min(budget, len(c.prompt_ids) - c.filled)
            if n == 1 and c.filled + 1 == len(c.prompt_ids) and self._can_join(c):
                self._joining.append(c)  # its last token is a decode row of this iteration's step
                budget -= 1
                continue
            chunk = np.asarray(c.prompt_ids[c.filled:c.filled + n], dtype=np.int64)
            if together and not c.prompt_logprobs:  # prompt logprobs (every position's logits) go alone
                pending.append((c, chunk))
                budget -= n
                continue
            logits = self.engine.append(c.slot, chunk, all_logits=c.prompt_logprobs)  # (n or 1, V)
            if c.prompt_logprobs:
                self._prompt_logprobs(c, logits)
            c.filled += n
            budget -= n
            self.observer.tokens(n, 0)
            if c.filled == len(c.prompt_ids):
                self._first_tokens([(c, logits[-1:])], events, early)
        if pending:
            self._append_together(pending, events, early)
        self._filling = [c for c in self._filling if c.filled < len(c.prompt_ids)]

    def _append_together(self, pending: list[tuple[Choice, np.ndarray]], events: list[tuple[Any, Event]],
                         early: Callable[..., None] | None) -> None:
        """The iteration's chunks (choice, ids) appended to their slots in one step (append_many); the
        choices whose prompts are complete sample their first tokens."""
        out = self.engine.append_many([c.slot for c, _ in pending], [chunk for _, chunk in pending])  # (1, V) each
        done: list[tuple[Choice, np.ndarray]] = []
        for (c, chunk), logits in zip(pending, out, strict=True):
            c.filled += len(chunk)
            self.observer.tokens(len(chunk), 0)
            if c.filled == len(c.prompt_ids):
                done.append((c, logits))
        if done:
            self._first_tokens(done, events, early)

    def _can_join(self, c: Choice) -> bool:
        """Whether c's last prompt token can be one row of the decode step: an engine whose decode step takes
        it (a static cache: any rows that hold positions), something cached before it, no prompt logprobs
        to compute."""
        return c.filled > 0 and not c.prompt_logprobs and self.engine.supports_join

    def _first_tokens(self, done: list[tuple[Choice, np.ndarray]], events: list[tuple[Any, Event]],
                      early: Callable[..., None] | None) -> None:
        """Choices whose prompts are complete, with their last position's logits (1, V): sample their
        first tokens, and hand the events over now when `early` is given."""
        for c, logits in done:
            if self.prefix_cache:
                c.first_logits = logits  # for choices of the same prompt that copy this one later
            if c.prompt_logprobs:
                events.append((c.out, PromptLogprobs(c.prompt_lp)))
        now = time.perf_counter()
        for c, _ in done:
            self.observer.first_token(now - c.t_submit)
        self._decoding += self._sample([c for c, _ in done], np.concatenate([lg for _, lg in done]), events, now)
        if early is not None and events:
            early(events[:])
            events.clear()

    def _prefill_together(self, budget: int, events: list[tuple[Any, Event]], early: Callable[..., None] | None
                          ) -> tuple[int, set[int]]:
        """Runs of adjacent empty slots whose whole prompts fit the budget, each prefilled in one step;
        the budget left and the choices done (their first tokens sampled)."""
        whole, left = [], budget
        for c in self._filling:  # admission order, as far as whole prompts fit
            if c.twin is not None or (c.filled and c.filled == c.cached):  # copies, or the rest of a kept prefix
                continue
            if c.filled or c.prompt_logprobs or len(c.prompt_ids) > left:
                break
            whole.append(c)
            left -= len(c.prompt_ids)
        whole.sort(key=lambda c: c.slot)
        runs: list[list[Choice]] = []
        for c in whole:
            if runs and runs[-1][-1].slot + 1 == c.slot:
                runs[-1].append(c)
            else:
                runs.append([c])
        batched: set[int] = set()
        done: list[tuple[Choice, np.ndarray]] = []
        for run in (r for r in runs if len(r) > 1):
            prompts = [np.asarray(c.prompt_ids, dtype=np.int64) for c in run]
            logits = self.engine.prefill_many(run[0].slot, prompts)  # (k, V)
            for c, row in zip(run, logits, strict=True):
                c.filled = len(c.prompt_ids)
                budget -= c.filled
                self.observer.tokens(c.filled, 0)
                done.append((c, row[None]))
                batched.add(id(c))
        if done:
            self._first_tokens(done, events, early)
        return budget, batched

    def _prompt_logprobs(self, c: Choice, logits: np.ndarray) -> None:
        """Log-probabilities of the prompt's tokens under the logits of the positions before them."""
        if c.filled == 0:
            c.prompt_lp = [(c.prompt_ids[0], None, [])]
        nxt = c.prompt_ids[c.filled + 1:c.filled + len(logits) + 1]  # the tokens these positions predict
        c.prompt_lp += logprob_entries(logits[:len(nxt)], nxt, c.logprobs or 0)
