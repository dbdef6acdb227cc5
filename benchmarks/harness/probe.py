"""The machine probe taken around every round, and the rule that discards rounds taken on a disturbed host.

A round's probe: the memory bandwidth of a numpy copy of a 128 MiB array (read and write, the best of
five copies; taken when the round starts and when it ends, their mean counts), the 1-minute load
average at both ends, and the share of CPU time the hypervisor stole during the round (/proc/stat's
steal column, where the kernel has one). A decode step streams its weights through the same memory,
and a neighbour that takes the memory bus or the cores shows in the copy's rate and in the steal.

The rule (RULE): a round is discarded when its bandwidth is below MIN_BANDWIDTH_SHARE of the best
round's bandwidth in the same run, or when more than MAX_STEAL of its CPU time was stolen. Every
engine of an interleaved comparison runs in each round, so a discarded round drops all of them alike
and the ratio of the kept rounds' medians compares like with like. The load average is recorded but
not judged: on a small machine the benchmark's own threads raise it."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PROBE_MIB = 128  # the copy's two arrays (256 MiB) exceed the L3 caches of the machines measured
MIN_BANDWIDTH_SHARE = 0.80
MAX_STEAL = 0.05
STAT = Path("/proc/stat")


def bandwidth_gb_s(mib: int = PROBE_MIB, tries: int = 5) -> float:
    """GB/s of np.copyto between two `mib` MiB arrays (bytes read plus bytes written), the best of `tries`."""
    src = np.ones(mib * (1 << 20) // 8, dtype=np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9


def cpu_ticks(stat: Path = STAT) -> tuple[int, int] | None:
    """(steal, total) clock ticks of all CPUs since boot from /proc/stat; None where there is no steal column."""
    try:
        first = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[:1] != ["cpu"] or len(first) < 9:
        return None
    ticks = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal (guest is in user)
    return ticks[7], sum(ticks)


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of CPU time stolen between two cpu_ticks() readings; None when either is missing."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


class RoundProbe:
    """Started when a round starts, finished when it ends: the round's probe record."""

    def __init__(self, mib: int = PROBE_MIB) -> None:
        self.mib = mib
        self.t0 = time.monotonic()
        self.load_start = os.getloadavg()[0]
        self.bw_start = bandwidth_gb_s(mib)
        self.ticks = cpu_ticks()

    def finish(self) -> dict[str, Any]:
        ticks = cpu_ticks()
        bw_end = bandwidth_gb_s(self.mib)
        steal = steal_share(self.ticks, ticks)
        return {"bandwidth_gb_s": round((self.bw_start + bw_end) / 2, 2),
                "bandwidth_start_gb_s": round(self.bw_start, 2), "bandwidth_end_gb_s": round(bw_end, 2),
                "loadavg_1m_start": round(self.load_start, 2), "loadavg_1m_end": round(os.getloadavg()[0], 2),
                "steal": None if steal is None else round(steal, 4),
                "seconds": round(time.monotonic() - self.t0, 2)}


@dataclass(frozen=True)
class Rule:
    """Which rounds of a run count: see the module's docstring."""

    min_bandwidth_share: float = MIN_BANDWIDTH_SHARE
    max_steal: float = MAX_STEAL

    def judge(self, probes: list[dict[str, Any] | None]) -> list[str]:
        """Per round, why it is discarded ("" when it is kept). A round without a probe (a results file
        written before rounds were probed) is kept: nothing says it was disturbed."""
        rates = [p["bandwidth_gb_s"] for p in probes if p and p.get("bandwidth_gb_s")]
        best = max(rates, default=0.0)
        out = []
        for p in probes:
            why = []
            if p and p.get("bandwidth_gb_s") is not None and p["bandwidth_gb_s"] < self.min_bandwidth_share * best:
                why.append(f"bandwidth {p['bandwidth_gb_s']:.1f} GB/s < {self.min_bandwidth_share:.0%} of the "
                           f"run's best {best:.1f}")
            if p and p.get("steal") is not None and p["steal"] > self.max_steal:
                why.append(f"steal {p['steal']:.1%} > {self.max_steal:.0%}")
            out.append("; ".join(why))
        return out

    def describe(self) -> str:
        return (f"a round is discarded when its probed memory bandwidth is below {self.min_bandwidth_share:.0%} "
                f"of the best round's in the same run, or when more than {self.max_steal:.0%} of its CPU time was "
                "stolen by the hypervisor")


RULE = Rule()
