"""The scheduler's knobs in one frozen, validated object (scheduler.py reads them, plan.py decides with them).

`serve` sets max_queue, prefill_chunk and prefix_cache from its options; the prefill policy's other knobs
(run_tokens, order, fill_waves, span_gap, rest_tokens, rest_runs) keep their defaults there and are set by
the benchmarks that measure them (benchmarks/serve/ttft.py) and the tests. A bad value is refused when the
object is made, in one line naming the knob. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum


class Order(Enum):
    """The order of an iteration's prompt chunks (plan.order_ready)."""

    ARRIVAL = "arrival"  # admission order
    SHORTEST = "shortest"  # a prompt others wait to copy first, then the fewest tokens to a first token


@dataclass(frozen=True)
class SchedulerSettings:
    """How the scheduler admits and prefills. Defaults are serve's."""

    max_queue: int = 64  # choices that may wait beyond the free slots; past that, submit refuses
    prefill_chunk: int = 512  # prompt tokens prefilled per iteration (decoding rows wait at most one chunk)
    prefix_cache: bool = True  # freed slots keep their cache (where the engine supports_reuse)
    run_tokens: int = 0  # tokens per run of the multi-row append graph (at least one chunk; 0: one run)
    order: Order = Order.ARRIVAL
    fill_waves: bool = False  # prompts outnumber decoding rows: every ready chunk, prefill_chunk aside
    span_gap: int = -1  # a run's slots at most this many other rows apart (-1: any; plan.groups)
    rest_tokens: int = 48  # rests after a reused prefix first, in runs of this many tokens (0: off)
    rest_runs: int = 1  # at most this many runs of rests an iteration (0: any)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Refuse a bad knob: ValueError, one line naming it."""
        for f in fields(self):
            value = getattr(self, f.name)
            kind = {"bool": bool, "Order": Order}.get(str(f.type), int)
            if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"scheduler setting {f.name}: expected an integer, not {value!r}")
            if kind is not int and not isinstance(value, kind):
                expected = "True or False" if kind is bool else f"an Order ({', '.join(o.value for o in Order)})"
                raise ValueError(f"scheduler setting {f.name}: expected {expected}, not {value!r}")
        least = {"max_queue": 0, "prefill_chunk": 1, "run_tokens": 0, "span_gap": -1, "rest_tokens": 0, "rest_runs": 0}
        for name, low in least.items():
            if getattr(self, name) < low:
                raise ValueError(f"scheduler setting {name}: must be at least {low}, not {getattr(self, name)}")
