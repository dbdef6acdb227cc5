"""The prefill half of the scheduler (scheduler.py): prompt chunks appended to their slots within the
iteration's budget, prompts prefilled together, first tokens sampled and handed over early. No torch here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from gptport.runtime.sampling import logprob_entries
from gptport.serve.engine import prefix
from gptport.serve.engine.choice import Choice
from gptport.serve.engine.events import Event, Observer, PromptLogprobs
from gptport.serve.engine.plan import Fill, Row, groups, order_ready, plan_iteration, plan_run, plan_slot, plan_whole
from gptport.serve.engine.settings import SchedulerSettings

if TYPE_CHECKING:
    from gptport.runtime.slots import SlotEngine


def as_row(c: Choice, key: int, source: bool = False) -> Row:
    """The plan's view of filling choice c (plan.Row)."""
    return Row(key, c.slot, len(c.prompt_ids), c.filled, c.cached, c.prompt_logprobs, source, c.twin is not None)


class Prefilling:
    """Scheduler's prefill methods: they execute plan.py's decisions. A mixin: the Scheduler state they read
    is declared here (tests/serve/engine/test_interface.py holds every `self.` read to it)."""

    engine: SlotEngine
    settings: SchedulerSettings
    observer: Observer
    prefix_cache: bool
    _filling: list[Choice]
    _decoding: list[Choice]
    _joining: list[Choice]
    _cond: threading.Condition
    _admit_waiting: Callable[[], None]  # Scheduler's: waiting choices take the free slots (with _cond held)
    _sample: Callable[..., list[Choice]]  # Emitting's

    def _prefill(self, events: list[tuple[Any, Event]], early: Callable[..., None] | None = None) -> None:
        """Fill slots with up to prefill_chunk prompt tokens in all; each choice whose prompt is complete
        samples its first token at once, handed to `early` before the next prefill. With a multi-row append
        graph (supports_append_many) the chunks go in runs of several rows (_prefill_runs); without it,
        in admission order (_prefill_slots). A choice that waits on another's prompt (prefix.py) copies it
        once that one holds it."""
        self._joining = []
        plan = plan_iteration(self.settings, len(self._filling), len(self._decoding),
                              self.engine.supports_append_many)
        if plan.runs:
            self._prefill_runs(plan.budget, plan.cap, events, early)
        else:
            self._prefill_slots(plan.budget, events, early)
        self._filling = [c for c in self._filling if c.filled < len(c.prompt_ids)]

    def _ready(self, taken: set[int], events: list[tuple[Any, Event]], early: Callable[..., None] | None
               ) -> list[Choice]:
        """The filling choices that can append now and have not this iteration (ids in `taken`), in the
        order their chunks go (plan.order_ready: by settings.order, rests after a reused prefix first).
        Waiting copies whose source now holds their prefix are copied (a copy of a whole prompt samples its
        first token)."""
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
        sources = {id(c.twin) for c in self._filling if c.twin is not None}
        return [ready[r.key] for r in order_ready([as_row(c, i, id(c) in sources) for i, c in enumerate(ready)],
                                                  self.settings)]

    def _prefill_runs(self, budget: int, cap: int, events: list[tuple[Any, Event]],
                      early: Callable[..., None] | None) -> None:
        """Chunks of up to `budget` tokens in all, in _ready's order, appended in runs of the multi-row append
        graph of up to `cap` tokens each (plan.plan_run decides each run), the first tokens of each run's
        complete prompts handed over before the next run. With rest_tokens, the rests of prompts after a
        reused prefix go first, in runs of their own of up to rest_tokens tokens (a wave of rests hands its
        first tokens out a run at a time; fresh prompts keep their one run), at most rest_runs such runs an
        iteration (0: any): a wave of rests is spread over several decode steps, so its requests do not all
        start decoding, and end, on the same step. A prompt one token short joins the decode step; prompt
        logprobs (every position's logits) append alone. After each run, the choices that waited to copy
        what it appended are ready too, and so are choices that arrived meanwhile and took a free slot."""
        taken: set[int] = set()
        rest_runs = 0  # runs of rests this iteration: past settings.rest_runs (0: no bound), rests wait
        while budget > 0:
            ready = self._ready(taken, events, early)
            plan = plan_run([as_row(c, i) for i, c in enumerate(ready)], budget, cap, rest_runs, self.settings,
                            self.engine.supports_join)
            budget = plan.budget
            run: list[tuple[Choice, np.ndarray]] = []
            for chunk in plan.chunks:
                c = ready[chunk.key]
                taken.add(id(c))
                if chunk.fill is Fill.JOIN:
                    self._joining.append(c)  # its last token is a decode row of this iteration's step
                elif chunk.fill is Fill.ALONE:
                    self._append_alone(c, chunk.tokens, events, early)
                else:
                    run.append((c, np.asarray(c.prompt_ids[c.filled:c.filled + chunk.tokens], dtype=np.int64)))
            if run:
                self._append_together(run, events, early)
                rest_runs += plan.rests
            if not plan.took:
                break
            with self._cond:  # what arrived meanwhile takes the free slots and can go in the next run
                self._admit_waiting()
        if budget <= 0:
            self._ready(taken, events, early)  # copies whose source holds their prefix now are taken

    def _prefill_slots(self, budget: int, events: list[tuple[Any, Event]], early: Callable[..., None] | None
                       ) -> None:
        """Without a multi-row append graph: whole prompts that fit, in empty slots next to each other,
        prefilled together in one step (supports_prefill_many), the others one slot at a time, in
        admission order (plan.plan_whole, plan.plan_slot)."""
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
            chunk = plan_slot(as_row(c, 0), budget, self.engine.supports_join)
            budget -= chunk.tokens
            if chunk.fill is Fill.JOIN:
                self._joining.append(c)  # its last token is a decode row of this iteration's step
                continue
            self._append_alone(c, chunk.tokens, events, early)

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
        for group in groups([c.slot for c, _ in pending], self.settings.span_gap):
            part = [pending[i] for i in group]
            if len(part) == 1 and self.settings.span_gap >= 0:
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
        filling = self._filling  # admission order
        runs = [[filling[k] for k in keys]
                for keys in plan_whole([as_row(c, i) for i, c in enumerate(filling)], budget)]
        batched: set[int] = set()
        done: list[tuple[Choice, np.ndarray]] = []
        for run in runs:
            prompts = [np.asarray(c.prompt_ids, dtype=np.int64) for c in run]
            logits = self.engine.prefill_many(run[0].slot, prompts)  # (k, V)
            for c, lg in zip(run, logits, strict=True):
                c.filled = len(c.prompt_ids)
                budget -= c.filled
                self.observer.tokens(c.filled, 0)
                done.append((c, lg[None]))
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
