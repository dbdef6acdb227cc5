"""A benchmark's run as rounds: each round probed (probe.RoundProbe), its measurements kept in the round,
the rounds judged together by probe.RULE once they are all taken, and the figures computed from the kept
rounds only. Interleaving is the round's order(): the configurations compared go first in turn."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from benchmarks.harness.probe import PROBE_MIB, RULE, RoundProbe, Rule

T = TypeVar("T")


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Round:
    """One round: its index within its series, the tags that name the series (e.g. shape="small"), what
    was measured in it (`data`, by configuration), its probe and, once judged, why it was discarded."""

    index: int
    tags: dict[str, Any]
    data: dict[str, Any] = field(default_factory=dict)
    probe: dict[str, Any] | None = None
    discarded: str = ""

    def order(self, names: Sequence[T]) -> list[T]:
        """`names` forwards in even rounds, backwards in odd ones: each goes first as often."""
        return list(names) if self.index % 2 == 0 else list(names)[::-1]

    def rotation(self, names: Sequence[T]) -> list[T]:
        """`names` rotated by the round's index: with more than two, each takes every place in turn."""
        k = self.index % max(1, len(names))
        return [*names[k:], *names[:k]]

    def record(self) -> dict[str, Any]:
        """The round as the results file keeps it."""
        return {"index": self.index, **self.tags, "probe": self.probe, "kept": not self.discarded,
                "discarded": self.discarded or None, "data": self.data}


class Run:
    """Every round of one benchmark run, probed and judged by `rule`."""

    def __init__(self, rule: Rule = RULE, probe_mib: int = PROBE_MIB, log: Callable[[str], None] = say) -> None:
        self.rule, self.probe_mib, self.log = rule, probe_mib, log
        self.rounds: list[Round] = []
        self.notes: list[str] = []

    @contextmanager
    def round(self, **tags: Any) -> Iterator[Round]:
        """One round of the series named by `tags`, probed before and after its body; recorded when the body
        finishes (a round that raises is not)."""
        index = sum(r.tags == tags for r in self.rounds)
        probe = RoundProbe(self.probe_mib)
        label = " ".join(f"{k}={v}" for k, v in tags.items())
        self.log(f"== round {index + 1} {label} (probe {probe.bw_start:.1f} GB/s)".replace("  ", " "))
        rnd = Round(index, dict(tags))
        yield rnd
        rnd.probe = probe.finish()
        self.rounds.append(rnd)
        self.judge()

    def series(self, n: int, **tags: Any) -> Iterator[Round]:
        """`n` rounds of the series named by `tags`."""
        for _ in range(n):
            with self.round(**tags) as rnd:
                yield rnd

    def interleaved(self, n: int, names: Sequence[str], measure: Callable[[str, Round], Any], **tags: Any
                    ) -> None:
        """`n` rounds, each measuring every name (alternating who goes first) into round.data[name]."""
        for rnd in self.series(n, **tags):
            for name in rnd.order(names):
                rnd.data[name] = measure(name, rnd)

    def judge(self) -> None:
        """Apply the rule to every round of the run (the best probe may have changed)."""
        for rnd, why in zip(self.rounds, self.rule.judge([r.probe for r in self.rounds]), strict=True):
            rnd.discarded = why

    def kept(self, **tags: Any) -> list[Round]:
        """The kept rounds of the series `tags`; when the rule discarded all of them, every one of them, and
        a note says so (the figures are then from a disturbed host)."""
        rounds = [r for r in self.rounds if all(r.tags.get(k) == v for k, v in tags.items())]
        kept = [r for r in rounds if not r.discarded]
        if rounds and not kept:
            note = f"every round of {tags or 'the run'} was disturbed: its figures use all {len(rounds)} of them"
            if note not in self.notes:
                self.notes.append(note)
                self.log(note)
            return rounds
        return kept

    def values(self, name: str, **tags: Any) -> list[Any]:
        """round.data[name] of the kept rounds of the series `tags`."""
        return [r.data[name] for r in self.kept(**tags) if name in r.data]

    def records(self) -> list[dict[str, Any]]:
        return [r.record() for r in self.rounds]
