"""The scheduler's knobs: one frozen object with serve's defaults, a bad value refused in one line naming it."""

from __future__ import annotations

import dataclasses

import pytest

from gptport.serve.engine.settings import Order, SchedulerSettings


def test_the_defaults_are_the_schedulers_own() -> None:
    s = SchedulerSettings()
    assert (s.max_queue, s.prefill_chunk, s.prefix_cache, s.run_tokens, s.order, s.fill_waves, s.span_gap,
            s.rest_tokens, s.rest_runs) == (64, 512, True, 0, Order.ARRIVAL, False, -1, 48, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.prefill_chunk = 8  # type: ignore[misc]


@pytest.mark.parametrize(("knob", "value", "says"), [
    ("max_queue", -1, "at least 0"), ("prefill_chunk", 0, "at least 1"), ("run_tokens", -5, "at least 0"),
    ("span_gap", -2, "at least -1"), ("rest_tokens", -1, "at least 0"), ("rest_runs", -1, "at least 0"),
    ("order", "shortest", "an Order"), ("fill_waves", 1, "True or False"), ("prefix_cache", "yes", "True or False"),
    ("prefill_chunk", 2.5, "an integer"), ("max_queue", True, "an integer")])
def test_a_bad_knob_is_refused_by_name(knob: str, value: object, says: str) -> None:
    with pytest.raises(ValueError, match=f"^scheduler setting {knob}: .*{says}") as caught:
        SchedulerSettings(**{knob: value})  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)


def test_the_edges_are_allowed() -> None:
    s = SchedulerSettings(max_queue=0, prefill_chunk=1, span_gap=-1, rest_tokens=0, rest_runs=0, order=Order.SHORTEST)
    assert s.order is Order.SHORTEST
    assert dataclasses.replace(s, fill_waves=True).fill_waves
