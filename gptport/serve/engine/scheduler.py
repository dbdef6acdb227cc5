"""Continuous batching: one thread owns the slot engine and runs the loop that serves every request.

Each iteration drops cancelled choices (their slots are free at once), admits waiting choices into
free slots, prefills up to `prefill_chunk` prompt tokens (a long prompt is filled over several
iterations, so decoding rows wait at most one chunk; with a multi-row append graph, StaticSlots.append_many,
the iteration's chunks in runs of several rows: prefill.py says how), then runs one decode step over every
decoding slot, samples each row with its choice's own generator, detokenizes UTF-8-safely, checks stop strings
and hands the iteration's events over in one call of `deliver`. A choice with a constraint (a
llguidance matcher) has its next-token mask computed in the background while the model runs; its
disallowed logits are -inf before sampling, and it finishes with `stop` when its grammar is complete.
With a drafter (drafting.py), a choice decoding alone takes speculative steps: several tokens per step.
With prefix caching (a StaticSlots engine), a freed slot keeps its cache: an arriving prompt takes the
free slot that holds the longest part of it and prefills only the rest, and the other choices of an
`n` > 1 request copy the first one's prefilled rows.
Its knobs are one SchedulerSettings (settings.py); what each iteration does is decided by plan.py's pure
functions from plain rows and done here and in prefill.py and emit.py.
The asyncio side never calls the model; it submits choices and reads their events. No torch here.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from gptport.runtime.constraint import Masks
from gptport.runtime.slots import SlotEngine
from gptport.serve.engine import prefix
from gptport.serve.engine.choice import Choice
from gptport.serve.engine.drafting import Drafting
from gptport.serve.engine.emit import Emitting
from gptport.serve.engine.events import Event, Failure, Finish, Observer, Piece, PromptLogprobs
from gptport.serve.engine.plan import plan_decode
from gptport.serve.engine.prefill import Prefilling
from gptport.serve.engine.settings import Order, SchedulerSettings
from gptport.tokenizer import BPETokenizer

# callers import the engine's types from here too
__all__ = ["Choice", "Event", "Failure", "Finish", "Observer", "Order", "Piece", "PromptLogprobs", "Scheduler",
           "SchedulerSettings"]

log = logging.getLogger("gptport.serve")


class Scheduler(Prefilling, Emitting):
    """The loop over a SlotEngine. `deliver(events)` is called from the scheduler's thread with a list
    of (choice.out, event) once per iteration; it must not block. A choice ends on any of `end_ids` (the
    model's, specials.end_ids; None: the tokenizer's end-of-text) unless it ignores them."""

    def __init__(self, slots: SlotEngine, tok: BPETokenizer, deliver: Callable[[list[tuple[Any, Event]]], None],
                 settings: SchedulerSettings | None = None, *, observer: Observer | None = None,
                 masks: Masks | None = None, drafting: Drafting | None = None,
                 end_ids: Collection[int] | None = None) -> None:
        self.engine, self.tok, self.deliver = slots, tok, deliver
        self.settings = settings or SchedulerSettings()  # the knobs (settings.py); plan.py decides with them
        self.end_ids = frozenset((tok.eot_id,) if end_ids is None else end_ids)  # specials.end_ids: any ends a choice
        self.prefix_cache = self.settings.prefix_cache and slots.supports_reuse  # StaticSlots only
        self.drafting = drafting  # speculative steps while one row decodes alone (a StaticSlots engine)
        self.masks = masks  # None: constrained choices are refused at submit
        self.observer = observer or Observer()
        self._free = list(range(slots.slots))  # a heap: the lowest free slot first keeps steps narrow
        self._waiting: deque[Choice] = deque()
        self._filling: list[Choice] = []
        self._decoding: list[Choice] = []
        self._joining: list[Choice] = []  # prompts one token short: that token rides this iteration's decode step
        self._holding: dict[int, Choice] = {}  # slot -> the choice in it, from admission to release
        self._cond = threading.Condition()
        self._stop = False
        self._masking: Any = None  # the Future of the masks being computed
        self._thread = threading.Thread(target=self._run, name="gptport-scheduler", daemon=True)

    # -- any thread ------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout)

    def submit(self, choices: Sequence[Choice]) -> bool:
        """Queue all of a request's choices, or none when more than max_queue of them would wait beyond
        the free slots."""
        if self.masks is None and any(c.matcher is not None for c in choices):
            raise ValueError("this scheduler has no mask computer: it cannot run constrained choices")
        now = time.perf_counter()
        with self._cond:
            if self._stop or len(self._waiting) + len(choices) - len(self._free) > self.settings.max_queue:
                return False
            for c in choices:
                c.t_submit = now
                self._waiting.append(c)
            self._cond.notify()
        return True

    def wake(self) -> None:
        """Look at cancellations now rather than at the next iteration."""
        with self._cond:
            self._cond.notify()

    @property
    def alive(self) -> bool:
        """The scheduler's thread is running."""
        return self._thread.is_alive()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def full(self) -> bool:
        """Whether one more choice would be refused now (submit's test, for a refusal before any parsing)."""
        return len(self._waiting) + 1 - len(self._free) > self.settings.max_queue

    @property
    def busy(self) -> int:
        return self.engine.slots - len(self._free)

    @property
    def positions_in_use(self) -> int:
        return sum(self.engine.length(slot) for slot in list(self._holding))

    # -- the scheduler's thread ------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._stop or self._waiting or self._filling or self._decoding):
                    self._cond.wait()
                if self._stop:
                    break
            events = self.iterate(self.deliver)
            if events:
                self.deliver(events)
        with self._cond:
            events = []
            self._fail_all(events, "the server is shutting down")
        if events:
            self.deliver(events)

    def iterate(self, early: Callable[[list[tuple[Any, Event]]], None] | None = None) -> list[tuple[Any, Event]]:
        """One iteration (the thread's loop body; tests call it directly): its events, less those handed to
        `early` as soon as the prefill is done (first tokens need not wait for the decode step). A failing
        step ends the running choices with a Failure and frees their slots; the server goes on."""
        events: list[tuple[Any, Event]] = []
        try:
            self._iteration(events, early)
        except Exception as e:  # noqa: BLE001 - a model failure ends the requests, not the server
            log.exception("scheduler iteration failed")
            self._fail_all(events, f"the model failed: {type(e).__name__}: {e}")
        return events

    def _fail_all(self, events: list[tuple[Any, Event]], message: str) -> None:
        """Every queued and running choice ends with `message`; the slots are free again."""
        for c in (*self._waiting, *self._holding.values()):
            events.append((c.out, Failure(message)))
        for c in list(self._holding.values()):
            self._release(c)
        self._waiting.clear()
        self._filling, self._decoding, self._joining = [], [], []

    def _release(self, c: Choice) -> None:
        if c.slot >= 0:
            self.engine.free(c.slot)
            del self._holding[c.slot]
            heapq.heappush(self._free, c.slot)
            c.slot = -1
            c.first_logits = None

    def _iteration(self, events: list[tuple[Any, Event]], early: Callable[..., None] | None = None) -> None:
        with self._cond:  # cancelled choices leave, waiting ones take the free slots
            self._waiting = deque(c for c in self._waiting if not c.cancelled)
            for group in (self._filling, self._decoding):
                for c in group:
                    if c.cancelled:
                        self._release(c)
            self._filling = [c for c in self._filling if not c.cancelled]
            self._decoding = [c for c in self._decoding if not c.cancelled]
            self._admit_waiting()
        if self.masks is not None:  # the masks of this iteration's samples, while the model runs
            self._masking = self.masks.start([c.matcher for c in (*self._filling, *self._decoding) if c.matcher])
        if self._filling:
            t0 = time.perf_counter()
            self._prefill(events, early)
            self.observer.phase("prefill", time.perf_counter() - t0)
        if self._decoding or self._joining:
            self._decode(events)

    def _admit_waiting(self) -> None:
        """Waiting choices take the free slots, in arrival order, and start filling (with self._cond held)."""
        now = time.perf_counter()
        while self._free and self._waiting:
            c = self._waiting.popleft()
            if c.cancelled:
                continue
            try:
                self._admit(c)
            except Exception:  # back in the queue, its slot free again: the failure reaches it
                if c.slot >= 0 and c.slot not in self._free:
                    heapq.heappush(self._free, c.slot)
                c.slot, c.twin = -1, None
                self._waiting.appendleft(c)
                raise
            self.observer.admitted(now - c.t_submit)  # once, when it holds a slot (not per failed try)
            self._holding[c.slot] = c
            c.start(self.tok, self.end_ids)
            self._filling.append(c)

    def _admit(self, c: Choice) -> None:
        """Give c a free slot: the lowest, or by prefix caching's choice (prefix.py)."""
        if not self.prefix_cache or c.prompt_logprobs:  # prompt logprobs need every position's logits
            c.slot = heapq.heappop(self._free)
            return
        prefix.admit(self.engine, c, self._free, self._holding.values(), self.observer)

    def _decode(self, events: list[tuple[Any, Event]]) -> None:
        """One step over every decoding row and every joining one (a prompt's last token: a prompt whose
        rest after its cached prefix is one token costs no step of its own, so a wave of arrivals that
        reuse a prefix costs one step, not one each); the decoding rows sampled, the joining ones' first
        tokens."""
        rows, joining = self._decoding, self._joining
        self._joining = []
        eligible = self.drafting is not None and len(rows) == 1 and self.drafting.eligible(rows[0])
        if plan_decode(len(rows), len(joining), len(self._filling), len(self._waiting), self.drafting is not None,
                       eligible):
            self._speculate(rows[0], events)
            return
        t0 = time.perf_counter()
        tokens = [c.new_ids[-1] for c in rows] + [c.prompt_ids[-1] for c in joining]
        logits = self.engine.decode([c.slot for c in (*rows, *joining)], np.array(tokens, dtype=np.int64))  # (k, V)
        t1 = time.perf_counter()
        self.observer.phase("decode", t1 - t0)
        self._decoding = self._sample(rows, logits[:len(rows)], events, t1)
        if joining:
            for c in joining:
                c.filled += 1
            self.observer.tokens(len(joining), 0)
            self._filling = [c for c in self._filling if c.filled < len(c.prompt_ids)]
            self._first_tokens([(c, logits[len(rows) + i:len(rows) + i + 1]) for i, c in enumerate(joining)],
                               events, None)

    def _speculate(self, c: Choice, events: list[tuple[Any, Event]]) -> None:
        """One row alone: the drafts that stood and the model's own token emitted in turn (drafting.py)."""
        logits, toks = self.drafting.step(self.engine, c, self.observer)  # type: ignore[union-attr]
        now, still = time.perf_counter(), [c]
        for j, tok in enumerate(toks or []):
            still = self._sample([c], logits[j:j + 1], events, now, picks=[tok])
            if not still:
                break
        self._decoding = self._sample([c], logits, events, now) if toks is None else still
