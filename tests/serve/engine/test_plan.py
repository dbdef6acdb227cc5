"""The scheduler's decisions on hand-made rows, no model: plan.py's functions are plain data in, plain data out."""

from __future__ import annotations

from gptport.serve.engine.plan import (
    WAVE_BUDGET,
    Chunk,
    Fill,
    IterationPlan,
    Row,
    groups,
    order_ready,
    plan_decode,
    plan_iteration,
    plan_run,
    plan_slot,
    plan_whole,
)
from gptport.serve.engine.settings import Order, SchedulerSettings

DEFAULT = SchedulerSettings()


def fresh(key: int, prompt: int, slot: int | None = None, **kw: object) -> Row:
    return Row(key, key if slot is None else slot, prompt, **kw)  # type: ignore[arg-type]


def rest(key: int, cached: int, left: int, **kw: object) -> Row:
    """A prompt whose first `cached` tokens were in its slot already."""
    return Row(key, key, cached + left, filled=cached, cached=cached, **kw)  # type: ignore[arg-type]


def test_the_iteration_budget_is_the_prefill_chunk_or_every_ready_chunk_for_a_wave() -> None:
    assert plan_iteration(DEFAULT, 3, 1, True) == IterationPlan(512, 512, True)
    assert plan_iteration(DEFAULT, 3, 1, False) == IterationPlan(512, 512, False)
    assert plan_iteration(SchedulerSettings(run_tokens=40), 3, 1, True).cap == 40
    waves = SchedulerSettings(fill_waves=True, prefill_chunk=30, run_tokens=40)
    assert (plan_iteration(waves, 2, 2, True).budget, plan_iteration(waves, 2, 2, True).cap) == (WAVE_BUDGET, 40)
    assert plan_iteration(waves, 1, 2, True).budget == 30  # fewer wait for a first token than decode
    assert plan_iteration(waves, 2, 0, False).budget == 30  # a wave needs the multi-row append graph
    assert not plan_iteration(waves, 2, 0, False).runs


def test_chunks_go_in_admission_order_or_shortest_first_with_rests_ahead() -> None:
    rows = [fresh(0, 30), fresh(1, 5), fresh(2, 12, source=True), rest(3, 20, 4), fresh(4, 5)]
    arrival = SchedulerSettings(rest_tokens=0)
    assert [r.key for r in order_ready(rows, arrival)] == [0, 1, 2, 3, 4]
    shortest = SchedulerSettings(order=Order.SHORTEST, rest_tokens=0)
    assert [r.key for r in order_ready(rows, shortest)] == [2, 3, 1, 4, 0]  # a source first, ties in admission
    assert [r.key for r in order_ready(rows, SchedulerSettings())] == [3, 0, 1, 2, 4]  # a rest (4 <= 48) first
    assert [r.key for r in order_ready(rows, SchedulerSettings(rest_tokens=3))] == [0, 1, 2, 3, 4]  # 4 > 3


def test_a_run_takes_chunks_until_the_budget_or_its_cap() -> None:
    rows = [fresh(0, 20), fresh(1, 20), fresh(2, 20)]
    plan = plan_run(rows, 30, 30, 0, DEFAULT, True)
    assert plan.chunks == [Chunk(0, 20, Fill.RUN), Chunk(1, 10, Fill.RUN)]  # the budget splits the second
    assert (plan.budget, plan.took, plan.rests) == (0, True, False)
    capped = plan_run(rows, 512, 25, 0, DEFAULT, True)
    assert capped.chunks == [Chunk(0, 20, Fill.RUN)] and capped.budget == 492  # the next would pass the cap
    assert plan_run(rows, 512, 5, 0, DEFAULT, True).chunks == [Chunk(0, 20, Fill.RUN)]  # at least one chunk
    assert not plan_run([], 512, 512, 0, DEFAULT, True).took


def test_a_last_token_joins_the_decode_step_and_prompt_logprobs_append_alone() -> None:
    last = Row(0, 0, 9, filled=8, cached=8)
    rows = [last, fresh(1, 6, logprobs=True), fresh(2, 7)]
    plan = plan_run(rows, 512, 512, 0, SchedulerSettings(rest_tokens=0), True)
    assert plan.chunks == [Chunk(0, 1, Fill.JOIN), Chunk(1, 6, Fill.ALONE), Chunk(2, 7, Fill.RUN)]
    assert plan.budget == 512 - 14
    unjoined = plan_run(rows, 512, 512, 0, SchedulerSettings(rest_tokens=0), False)  # an engine without join
    assert unjoined.chunks[0] == Chunk(0, 1, Fill.RUN)
    nothing_before = Row(0, 0, 1)  # a one-token prompt: nothing cached before its last token
    assert plan_run([nothing_before], 512, 512, 0, DEFAULT, True).chunks == [Chunk(0, 1, Fill.RUN)]


def test_rests_go_in_runs_of_their_own_up_to_rest_tokens_and_rest_runs() -> None:
    settings = SchedulerSettings(rest_tokens=10)
    rows = order_ready([fresh(0, 12), rest(1, 20, 3), rest(2, 20, 4), rest(3, 20, 5)], settings)
    first = plan_run(rows, 512, 512, 0, settings, True)
    assert first.chunks == [Chunk(1, 3, Fill.RUN), Chunk(2, 4, Fill.RUN)] and first.rests  # 3 + 4 + 5 > 10
    later = plan_run(rows[2:], 512 - 7, 512, 1, settings, True)  # rest_runs 1: this iteration's rests are done
    assert later.chunks == [Chunk(0, 12, Fill.RUN)] and not later.rests
    anymany = plan_run(rows[2:], 512 - 7, 512, 1, SchedulerSettings(rest_tokens=10, rest_runs=0), True)
    assert anymany.chunks == [Chunk(3, 5, Fill.RUN)] and anymany.rests  # then the fresh prompt's own run
    off = SchedulerSettings(rest_tokens=0)
    assert len(plan_run(order_ready(rows, off), 512, 512, 0, off, True).chunks) == 4  # no rests: one run


def test_whole_prompts_in_adjacent_empty_slots_prefill_together() -> None:
    rows = [fresh(0, 10, slot=3), fresh(1, 10, slot=1), fresh(2, 10, slot=2), fresh(3, 10, slot=6),
            fresh(4, 10, slot=7)]
    assert plan_whole(rows, 512) == [[1, 2, 0], [3, 4]]  # slot order within a run
    assert plan_whole(rows, 35) == [[1, 2, 0]]  # as far as whole prompts fit, in admission order
    copy = fresh(5, 10, slot=4, twin=True)
    kept = rest(6, 4, 6)
    assert plan_whole([copy, kept, *rows[:3]], 512) == [[1, 2, 0]]  # copies and rests are skipped
    assert plan_whole([Row(7, 0, 10, filled=3), *rows], 512) == []  # a prompt half filled stops the look
    assert plan_whole([fresh(0, 10, logprobs=True), *rows[1:]], 512) == []
    assert plan_whole([fresh(0, 10, slot=0), fresh(1, 10, slot=2)], 512) == []  # no run of two


def test_a_row_without_the_append_graph_takes_a_chunk_or_joins() -> None:
    assert plan_slot(fresh(0, 40), 16, True) == Chunk(0, 16, Fill.ALONE)
    assert plan_slot(Row(0, 0, 40, filled=39), 16, True) == Chunk(0, 1, Fill.JOIN)
    assert plan_slot(Row(0, 0, 40, filled=39, logprobs=True), 16, True) == Chunk(0, 1, Fill.ALONE)
    assert plan_slot(Row(0, 0, 40, filled=39), 16, False) == Chunk(0, 1, Fill.ALONE)


def test_runs_split_where_slots_are_far_apart() -> None:
    assert groups([5, 0, 1, 7], -1) == [[0, 1, 2, 3]]
    assert groups([5, 0, 1, 7], 1) == [[0, 3], [1, 2]]
    assert groups([], 0) == []


def test_only_a_lone_eligible_row_with_nothing_else_to_do_drafts() -> None:
    assert plan_decode(1, 0, 0, 0, True, True)
    assert not plan_decode(1, 0, 0, 0, False, True)  # no drafter
    assert not plan_decode(1, 0, 0, 0, True, False)  # a constrained row, or one with a logit_bias
    assert not plan_decode(2, 0, 0, 0, True, True)
    assert not plan_decode(1, 1, 0, 0, True, True)  # a prompt's last token joins the step
    assert not plan_decode(1, 0, 1, 0, True, True)  # a prompt still filling
    assert not plan_decode(1, 0, 0, 1, True, True)  # a choice waiting for a slot
