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

ORDERS = ("arrival", "shortest")  # the order of an iteration's chunks: admission, or fewest tokens to a first token
WAVE_BUDGET = 1 << 30  # fill_waves: a wave of prompts outnumbers the decoding rows: every ready chunk goes


def groups(slots: list[int], gap: int) -> list[list[int]]:
    """Indices into `slots` (distinct) grouped so that no two slots of a group that follow each other in slot
    order have more than `gap` other rows between them (gap < 0: one group), the groups in the order of
    their first index. A run of the multi-row append graph binds every row between its first and last
    slot, and each row of it costs attention over its cache whether it appends or not."""
    if gap < 0 or len(slots) < 2:
        return [list(range(len(slots)))] if slots else []
    out: list[list[int]] = []
    for i in sorted(range(len(slots)), key=lambda i: slots[i]):
        if out and slots[i] - slots[out[-1][-1]] - 1 <= gap:
            out[-1].append(i)
        else:
            out.append([i])
    return sorted((sorted(g) for g in out), key=lambda g: g[0])


class Prefilling:
    """Scheduler's prefill methods (a mixin: the state they use is Scheduler's)."""

    def _prefill(self, events: list[tuple[Any, Event]], early: Callable[..., None] | None = None) -> None:
        """Fill slots with up to prefill_chunk prompt tokens in all; each choice whose prompt is complete
        samples its first token at once, handed to `early` before the next prefill. With a multi-row append
        graph (supports_append_many) the chunks go in runs of several rows (_prefill_runs); without it,
        in admission order (_prefill_slots). A choice that waits on another's prompt (prefix.py) copies it
        once that one holds it."""
        self._joining = []
        if self.engine.supports_append_many:
            self._prefill_runs(events, early)
        else:
            self._prefill_slots(events, early)
        self._filling = [c for c in self._filling if c.filled < len(c.prompt_ids)]

    def _ready(self, taken: set[int], events: list[tuple[Any, Event]], early: Callable[..., None] | None
               ) -> list[Choice]:
        """The filling choices that can append now and have not this iteration (ids in `taken`), in the
        order their chunks go: with order "shortest", a prompt that others wait to copy from first, then the
        fewest tokens left to a first token, then admission; else admission order. Waiting copies whose
        source now holds their prefix are copied (a copy of a whole prompt samples its first token)."""
        ready: list[Choice] = []
        for c in self._filling:
            if id(c) in taken or c.filled == len(c.prompt_ids):
                continue
            if c.twin is not None:
                if not prefix.resolve(self.engine, c, self.observer):
                    continue
                if c.filled == len(c.prompt_ids):  # a copy of the whole prompt: its source's first logits
                    self._first_tokens([(c, c.first_logits)], events, early)  # type: ignore[list-item]
                    continue
            ready.append(c)
        if self.order == "shortest":
            sources = {id(c.twin) for c in self._filling if c.twin is not None}
            ready.sort(key=lambda c: (id(c) not in sources, len(c.prompt_ids) - c.filled))  # stable: admission
        if self.rest_tokens:
            ready.sort(key=lambda c: not self._rest(c))  # rests after a reused prefix first, each order kept
        return ready

    def _rest(self, c: Choice) -> bool:
        """Whether c is a rest after a reused prefix: something of its prompt was cached, and what is left fits
        one run of rests (rest_tokens). A longer rest (a long new turn) goes with the fresh prompts."""
        return 0 < c.cached and len(c.prompt_ids) - c.filled <= self.rest_tokens

    def _prefill_runs(self, events: list[tuple[Any, Event]], early: Callable[..., None] | None) -> None:
        """Chunks of up to prefill_chunk tokens in all, in _ready's order, appended in runs of the multi-row
        append graph of up to `run_tokens` tokens each (at least one chunk; 0: one run), the first tokens of
        each run's complete prompts handed over before the next run. With `rest_tokens`, the rests of
        prompts after a reused prefix (_rest) go first, in runs of their own of up to rest_tokens tokens (a
        wave of rests hands its first tokens out a run at a time; fresh prompts keep their one run), at
        most `rest_runs` such runs an iteration (0: any): a wave of rests is spread over several decode
        steps, so its requests do not all start decoding, and end, on the same step. A prompt one
        token short joins the decode step; prompt logprobs (every position's logits) append alone. After each
        run, the choices that waited to copy what it appended are ready too, and so are choices that arrived
        meanwhile and took a free slot."""
        wave = self.fill_waves and len(self._filling) >= len(self._decoding)  # more wait for a first token
        budget, taken = (WAVE_BUDGET if wave else self.prefill_chunk), set()
        cap = self.run_tokens or budget
        rest_runs = 0  # runs of rests this iteration: past self.rest_runs (0: no bound), rests wait for the next
        while budget > 0:
            run: list[tuple[Choice, np.ndarray]] = []
            size, took, rests = 0, False, False  # rests: the run holds rests after a reused prefix
            for c in self._ready(taken, events, early):
                n = min(budget, len(c.prompt_ids) - c.filled)
                rest = self.rest_tokens > 0 and self._rest(c)
                joins = n == 1 and c.filled + 1 == len(c.prompt_ids) and self._can_join(c)
                if rest and not joins and 0 < self.rest_runs <= rest_runs:
                    continue  # this iteration's runs of rests are done: the next iteration's decode step first
                if run and (rest != rests or size + n > (self.rest_tokens if rest else cap)):
                    break
                taken.add(id(c))
                took = True
                budget -= n
                if joins:
                    self._joining.append(c)  # its last token is a decode row of this iteration's step
                elif c.prompt_logprobs:
                    self._append_alone(c, n, events, early)
                else:
                    run.append((c, np.asarray(c.prompt_ids[c.filled:c.filled + n], dtype=np.int64)))
                    size, rests = size + n, rest
                if budget <= 0:
                    break
            if run:
                self._append_together(run, events, early)
                rest_runs += rests
            if not took:
                break
            with self._cond:  # what arrived meanwhile takes the free slots and can go in the next run
                self._admit_waiting()
        if budget <= 0:
            self._ready(taken, events, early)  # copies whose source holds their prefix now are taken

    def _prefill_slots(self, events: list[tuple[Any, Event]], early: Callable[..., None] | None) -> None:
        """Without a multi-row append graph: whole prompts that fit, in empty slots next to each other,
        prefilled together in one step (supports_prefill_many), the others one slot at a time, in
        admission order."""
        budget = self.prefill_chunk
        batched: set[int] = set()
        if self.engine.supports_prefill_many:
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
            budget -= n
            if n == 1 and c.filled + 1 == len(c.prompt_ids) and self._can_join(c):
                self._joining.append(c)  # its last token is a decode row of this iteration's step
                continue
            self._append_alone(c, n, events, early)

    def _append_alone(self, c: Choice, n: int, events: list[tuple[Any, Event]], early: Callable[..., None] | None
                      ) -> None:
        """The next n tokens of c's prompt appended to its slot in a step of its own."""
        chunk = np.asarray(c.prompt_ids[c.filled:c.filled + n], dtype=np.int64)
        logits = self.engine.append(c.slot, chunk, all_logits=c.prompt_logprobs)  # (n or 1, V)
        if c.prompt_logprobs:
            self._prompt_logprobs(c, logits)
        c.filled += n
        self.observer.tokens(n, 0)
        if c.filled == len(c.prompt_ids):
            self._first_tokens([(c, logits[-1:])], events, early)

    def _append_together(self, pending: list[tuple[Choice, np.ndarray]], events: list[tuple[Any, Event]],
                         early: Callable[..., None] | None) -> None:
        """The iteration's chunks (choice, ids) appended to their slots, in one step of the multi-row append
        graph per group of nearby slots (groups); with a span_gap, a group of one row appends alone (the
        static-cache graph's one-row step). The choices whose prompts are complete sample their first
        tokens, handed to `early` after each group."""
        for group in groups([c.slot for c, _ in pending], self.span_gap):
            part = [pending[i] for i in group]
            if len(part) == 1 and self.span_gap >= 0:
                c, chunk = part[0]
                out = [self.engine.append(c.slot, chunk)]  # (1, V)
            else:
                out = self.engine.append_many([c.slot for c, _ in part], [chunk for _, chunk in part])  # (1, V) each
            done: list[tuple[Choice, np.ndarray]] = []
            for (c, chunk), logits in zip(part, out, strict=True):
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
