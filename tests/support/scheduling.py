"""The tests' one scheduler harness: a Scheduler over a slot engine, stepped by hand (no thread) so that
arrival orders are exact, its events collected. Knobs go in as SchedulerSettings' keywords."""

from __future__ import annotations

from typing import Any

from gptport.runtime.slot_layout import open_slots
from gptport.runtime.slots import SlotEngine
from gptport.serve.engine.scheduler import Choice, Finish, Scheduler, SchedulerSettings


class Run:
    """`s` the scheduler over `slots`, `events` every (out, event) it handed over."""

    def __init__(self, slots: SlotEngine, tok: Any, *, observer: Any = None, masks: Any = None,
                 drafting: Any = None, **knobs: Any) -> None:
        self.events: list[tuple[Any, Any]] = []
        self.s = Scheduler(slots, tok, self.events.extend, SchedulerSettings(**knobs), observer=observer,
                           masks=masks, drafting=drafting)

    def step(self) -> None:
        self.events += self.s.iterate()

    def until_idle(self, limit: int = 2000) -> None:
        """Iterate until every submitted choice has finished (at most `limit` iterations)."""
        for _ in range(limit):
            if not (self.s.waiting or self.s.busy):
                return
            self.step()
        raise AssertionError("the scheduler did not finish its work")

    def serve(self, choices: list[Choice], limit: int = 2000) -> None:
        """Submit `choices` (all accepted) and iterate until they have finished."""
        assert self.s.submit(choices)
        self.until_idle(limit)

    def waves(self, waves: list[list[tuple[int, Choice]]], limit: int = 3000) -> None:
        """Each wave's choices arrive at their iterations; a wave starts when the one before has finished."""
        for wave in waves:
            for it in range(max(a for a, _ in wave) + 1):
                self.s.submit([c for a, c in wave if a == it])
                self.step()
            self.until_idle(limit)

    def of(self, out: Any) -> list[Any]:
        """The events of the choice whose handle is `out`."""
        return [e for o, e in self.events if o == out]

    def finish(self, out: Any) -> Finish:
        """The last Finish of `out`."""
        return next(e for o, e in reversed(self.events) if o == out and isinstance(e, Finish))

    def only_finish(self, out: Any) -> Finish:
        """The one Finish of `out` (there must be exactly one)."""
        done = [e for e in self.of(out) if isinstance(e, Finish)]
        assert len(done) == 1, self.of(out)[-3:]
        return done[0]


class Opened(Run):
    """Run over `slots` slots of an opened model's engine, as serve opens them (open_slots)."""

    def __init__(self, opened: Any, slots: int, **kw: Any) -> None:
        super().__init__(open_slots(opened.engine, slots), opened.tok, **kw)
