"""The scheduler's decisions, apart from doing them: plain data in, plain data out, no model (scheduler.py
and prefill.py execute what these return; tests/serve/engine/test_plan.py checks them on hand-made rows).

An iteration is planned in stages, because what one stage does changes what the next can decide on: the
iteration's prefill (plan_iteration: its token budget, its run cap, which path), then each run of the
multi-row append graph (plan_run: which rows join the decode step, which append alone, which append
together), re-planned after every run since a run's appends let waiting copies go (prefix.resolve) and
choices that arrived meanwhile take free slots; without that graph, whole prompts prefilled together
(plan_whole) and one chunk per row (plan_slot); last the decode step (plan_decode: draft or not).
No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from gptport.serve.engine.settings import Order, SchedulerSettings

WAVE_BUDGET = 1 << 30  # fill_waves: a wave of prompts outnumbers the decoding rows: every ready chunk goes


@dataclass(frozen=True)
class Row:
    """A filling choice as the plan sees it; `key` is the caller's handle for it (an index)."""

    key: int
    slot: int
    prompt: int  # prompt tokens
    filled: int = 0  # of them in its slot
    cached: int = 0  # of them taken from a kept or copied cache
    logprobs: bool = False  # prompt logprobs: every position's logits, so it appends alone
    source: bool = False  # another choice waits to copy its prefix
    twin: bool = False  # it waits to copy another's prefix

    @property
    def left(self) -> int:
        return self.prompt - self.filled


class Fill(Enum):
    """How a chunk goes in."""

    JOIN = "join"  # the prompt's last token is a row of this iteration's decode step
    ALONE = "alone"  # a step of its own (prompt logprobs, or no multi-row append graph)
    RUN = "run"  # with the run's other chunks, in steps of the multi-row append graph (groups)


@dataclass(frozen=True)
class Chunk:
    key: int  # Row.key
    tokens: int
    fill: Fill


@dataclass(frozen=True)
class IterationPlan:
    """The iteration's prefill: `budget` prompt tokens in all, runs of at most `cap` tokens (plan_run) when
    `runs` (a multi-row append graph), else whole prompts together then a chunk per row (plan_slot)."""

    budget: int
    cap: int
    runs: bool


@dataclass(frozen=True)
class RunPlan:
    """One run's chunks in the order they go (joins and alone appends when met, the run's chunks together
    after); `rests`: the run is of rests after a reused prefix; `budget` left after it; `took`: any row."""

    chunks: list[Chunk] = field(default_factory=list)
    rests: bool = False
    budget: int = 0
    took: bool = False


def plan_iteration(settings: SchedulerSettings, filling: int, decoding: int, append_many: bool) -> IterationPlan:
    """The prefill's budget and run cap, from how many rows fill and decode (fill_waves: at least as many
    wait for a first token as decode, so every ready chunk goes)."""
    wave = append_many and settings.fill_waves and filling >= decoding
    budget = WAVE_BUDGET if wave else settings.prefill_chunk
    return IterationPlan(budget, settings.run_tokens or budget, append_many)


def is_rest(row: Row, rest_tokens: int) -> bool:
    """A rest after a reused prefix: something of its prompt was cached, and what is left fits one run of
    rests. A longer rest (a long new turn) goes with the fresh prompts."""
    return 0 < row.cached and row.left <= rest_tokens


def can_join(row: Row, supports_join: bool) -> bool:
    """Its last prompt token can be a row of the decode step: an engine whose step takes it, something
    cached before it, no prompt logprobs."""
    return row.filled > 0 and not row.logprobs and supports_join


def order_ready(rows: Sequence[Row], settings: SchedulerSettings) -> list[Row]:
    """The ready rows (in admission order) in the order their chunks go: with Order.SHORTEST, a prompt that
    others wait to copy first, then the fewest tokens to a first token; with rest_tokens, rests after a
    reused prefix before the others; each sort stable."""
    ready = list(rows)
    if settings.order is Order.SHORTEST:
        ready.sort(key=lambda r: (not r.source, r.left))
    if settings.rest_tokens:
        ready.sort(key=lambda r: not is_rest(r, settings.rest_tokens))
    return ready


def plan_run(ready: Sequence[Row], budget: int, cap: int, rest_runs_done: int, settings: SchedulerSettings,
             supports_join: bool) -> RunPlan:
    """One run from the ready rows (in order_ready's order): chunks of up to `budget` tokens in all, a run of
    at most `cap` tokens (at least one chunk), or of rest_tokens for a run of rests, rests and fresh prompts
    never in one run; past `rest_runs` runs of rests this iteration (0: any) rests wait. A prompt one token
    short joins the decode step; prompt logprobs append alone."""
    chunks: list[Chunk] = []
    size, took, rests = 0, False, False
    in_run = False
    for r in ready:
        n = min(budget, r.left)
        rest = settings.rest_tokens > 0 and is_rest(r, settings.rest_tokens)
        joins = n == 1 and r.filled + 1 == r.prompt and can_join(r, supports_join)
        if rest and not joins and 0 < settings.rest_runs <= rest_runs_done:
            continue  # this iteration's runs of rests are done: the next iteration's decode step first
        if in_run and (rest != rests or size + n > (settings.rest_tokens if rest else cap)):
            break
        took = True
        budget -= n
        if joins:
            chunks.append(Chunk(r.key, n, Fill.JOIN))
        elif r.logprobs:
            chunks.append(Chunk(r.key, n, Fill.ALONE))
        else:
            chunks.append(Chunk(r.key, n, Fill.RUN))
            size, rests, in_run = size + n, rest, True
        if budget <= 0:
            break
    return RunPlan(chunks, rests, budget, took)


def plan_whole(rows: Sequence[Row], budget: int) -> list[list[int]]:
    """Without a multi-row append graph: the keys of runs of adjacent empty slots (two or more) whose whole
    prompts fit the budget, taken in admission order as far as they fit (copies and rests after a kept
    prefix skipped), each run in slot order, to prefill in one step."""
    whole: list[Row] = []
    left = budget
    for r in rows:
        if r.twin or (r.filled and r.filled == r.cached):
            continue
        if r.filled or r.logprobs or r.prompt > left:
            break
        whole.append(r)
        left -= r.prompt
    whole.sort(key=lambda r: r.slot)
    runs: list[list[Row]] = []
    for r in whole:
        if runs and runs[-1][-1].slot + 1 == r.slot:
            runs[-1].append(r)
        else:
            runs.append([r])
    return [[r.key for r in run] for run in runs if len(run) > 1]


def plan_slot(row: Row, budget: int, supports_join: bool) -> Chunk:
    """Without a multi-row append graph: the row's next chunk (budget > 0), joining the decode step when it
    is the prompt's last token and may."""
    n = min(budget, row.left)
    joins = n == 1 and row.filled + 1 == row.prompt and can_join(row, supports_join)
    return Chunk(row.key, n, Fill.JOIN if joins else Fill.ALONE)


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


def plan_decode(decoding: int, joining: int, filling: int, waiting: int, drafting: bool, eligible: bool) -> bool:
    """Whether the decode step is a speculative one: a drafter, one row decoding alone (nothing joining,
    filling or waiting) and that row may draft (Drafting.eligible)."""
    return drafting and decoding == 1 and not joining and not filling and not waiting and eligible
