"""Continuous batching: one thread owns the slot engine and runs the loop that serves every request.

Each iteration drops cancelled choices (their slots are free at once), admits waiting choices into
free slots, prefills up to `prefill_chunk` prompt tokens (a long prompt is filled over several
iterations, so decoding rows wait at most one chunk; with a multi-row append graph, StaticSlots.append_many,
every slot's chunk of the iteration in one step), then runs one decode step over every decoding
slot, samples each row with its choice's own generator, detokenizes UTF-8-safely, checks stop strings
and hands the iteration's events over in one call of `deliver`. A choice with a constraint (a
llguidance matcher) has its next-token mask computed in the background while the model runs; its
disallowed logits are -inf before sampling, and it finishes with `stop` when its grammar is complete.
With a drafter (drafting.py), a choice decoding alone takes speculative steps: several tokens per step.
With prefix caching (a StaticSlots engine), a freed slot keeps its cache: an arriving prompt takes the
free slot that holds the longest part of it and prefills only the rest, and the other choices of an
`n` > 1 request copy the first one's prefilled rows.
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
from gptport.runtime.sampling import choose_rows, logprob_entries
from gptport.runtime.slots import SlotEngine
from gptport.serve.engine import prefix
from gptport.serve.engine.choice import Choice
from gptport.serve.engine.drafting import Drafting
from gptport.serve.engine.events import Event, Failure, Finish, Observer, Piece, PromptLogprobs
from gptport.tokenizer import BPETokenizer

log = logging.getLogger("gptport.serve")


class Scheduler:
    """The loop over a SlotEngine. `deliver(events)` is called from the scheduler's thread with a list
    of (choice.out, event) once per iteration; it must not block. A choice ends on any of `end_ids` (the
    model's, specials.end_ids; None: the tokenizer's end-of-text) unless it ignores them."""

    def __init__(self, slots: SlotEngine, tok: BPETokenizer, deliver: Callable[[list[tuple[Any, Event]]], None],
                 max_queue: int = 64, prefill_chunk: int = 512, observer: Observer | None = None,
                 masks: Masks | None = None, drafting: Drafting | None = None, prefix_cache: bool = True,
                 end_ids: Collection[int] | None = None) -> None:
        self.engine, self.tok, self.deliver = slots, tok, deliver
        self.end_ids = frozenset((tok.eot_id,) if end_ids is None else end_ids)  # specials.end_ids: any ends a choice
        self.prefix_cache = prefix_cache and slots.supports_reuse  # StaticSlots only
        self.drafting = drafting  # speculative steps while one row decodes alone (a StaticSlots engine)
        self.masks = masks  # None: constrained choices are refused at submit
        self.max_queue, self.prefill_chunk = max_queue, max(1, prefill_chunk)
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
            if self._stop or len(self._waiting) + len(choices) - len(self._free) > self.max_queue:
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
        return len(self._waiting) + 1 - len(self._free) > self.max_queue

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
            now = time.perf_counter()
            while self._free and self._waiting:
                c = self._waiting.popleft()
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
                c.start(self.tok)
                self._filling.append(c)
        if self.masks is not None:  # the masks of this iteration's samples, while the model runs
            self._masking = self.masks.start([c.matcher for c in (*self._filling, *self._decoding) if c.matcher])
        if self._filling:
            t0 = time.perf_counter()
            self._prefill(events, early)
            self.observer.phase("prefill", time.perf_counter() - t0)
        if self._decoding or self._joining:
            self._decode(events)

    def _admit(self, c: Choice) -> None:
        """Give c a free slot: the lowest, or by prefix caching's choice (prefix.py)."""
        if not self.prefix_cache or c.prompt_logprobs:  # prompt logprobs need every position's logits
            c.slot = heapq.heappop(self._free)
            return
        prefix.admit(self.engine, c, self._free, self._holding.values(), self.observer)

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

    def _decode(self, events: list[tuple[Any, Event]]) -> None:
        """One step over every decoding row and every joining one (a prompt's last token: a prompt whose
        rest after its cached prefix is one token costs no step of its own, so a wave of arrivals that
        reuse a prefix costs one step, not one each); the decoding rows sampled, the joining ones' first
        tokens."""
        rows, joining = self._decoding, self._joining
        self._joining = []
        if (self.drafting is not None and len(rows) == 1 and not joining and not self._filling
                and not self._waiting and self.drafting.eligible(rows[0])):
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
            c.new_ids.append(tok)
            if c.counts is not None:
                c.counts[tok] += 1
            lp = logprob_entries(row_logits[None], [tok], c.logprobs)[0:1] if c.logprobs is not None else None
            eot = tok in self.end_ids and not c.ignore_eos
            text = "" if eot else c.text_stream.push(tok)  # type: ignore[union-attr]
            reason = None
            if c.matcher is not None and not eot and not c.matcher.consume(tok):
                events.append((c.out, Failure(f"the constraint refused token {tok}: {c.matcher.error}")))
                self._release(c)
                continue
            if eot or c.text_stream.stopped or (c.matcher is not None and c.matcher.finished):  # type: ignore[union-attr]
                reason = "stop"
            elif len(c.new_ids) >= c.max_tokens or self.engine.length(c.slot) >= self.engine.n_ctx:
                reason = "length"
            if reason is not None:  # what the stream held back (nothing after a stop string)
                text += c.text_stream.finish()  # type: ignore[union-attr]
            if text or lp:
                events.append((c.out, Piece(text, lp)))
            if reason is None:
                still.append(c)
                continue
            events.append((c.out, Finish(reason, len(c.prompt_ids), len(c.new_ids), c.cached)))
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
