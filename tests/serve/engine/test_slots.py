"""Slots and the continuous-batching scheduler, without HTTP: the numbers a request gets among others
are the numbers it gets alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptport.runtime.choice import GraphChoice
from gptport.runtime.concat_slots import ConcatSlots
from gptport.runtime.engine import positions
from gptport.runtime.generate import generate
from gptport.runtime.loader import open_model
from gptport.runtime.sampling import Sampling
from gptport.runtime.slot_layout import open_slots
from gptport.runtime.slots import StaticSlots
from gptport.serve.engine.scheduler import Choice, Failure, Finish, Scheduler, SchedulerSettings
from tests.support.scheduling import Opened as Run

CACHES = ["static", "concat"]


@pytest.fixture(scope="module", params=CACHES)
def opened(request: pytest.FixtureRequest, trained_dir: Path) -> Any:
    return open_model(trained_dir, GraphChoice.parse(cache=request.param))


def alone_logits(opened: Any, ids: list[int], steps: list[int]) -> list[np.ndarray]:
    """Last-token logits (V,) of a batch-1 run: the prompt's prefill, then each of `steps` fed in turn."""
    engine = opened.engine
    step = engine.step(last_only=True)
    mask = np.ones((1, len(ids)), dtype=np.int64)
    logits, past = step(np.array([ids]), mask, positions(mask), engine.empty_past(1))
    out = [logits[0, -1]]
    for tok in steps:
        mask = np.ones((1, mask.shape[1] + 1), dtype=np.int64)
        logits, past = step(np.array([[tok]]), mask, np.array([[mask.shape[1] - 1]]), past)
        out.append(logits[0, -1])
    return out


def test_open_slots_picks_the_graphs_layout(opened: Any) -> None:
    kind = StaticSlots if opened.cache == "static" else ConcatSlots
    assert isinstance(open_slots(opened.engine, 2), kind)


def test_slots_declare_what_they_do(opened: Any) -> None:
    """The scheduler asks the capabilities, not the methods: the static cache does every optional method
    (prefix caching, prompts filled together, a last prompt token joining the decode step); the concat
    cache declares none, and each of its optional methods says so by name."""
    slots = open_slots(opened.engine, 2)
    static = opened.cache == "static"
    assert (slots.supports_reuse, slots.supports_prefill_many, slots.supports_join) == (static,) * 3
    if static:
        return
    ids = np.array([1, 2, 3], dtype=np.int64)
    for call in (lambda: slots.cached([0], [1, 2]), lambda: slots.reuse(0, [1, 2]), lambda: slots.copy(0, 1, 1),
                 lambda: slots.truncate(0, 0), lambda: slots.prefill_many(0, [ids])):
        with pytest.raises(NotImplementedError, match="ConcatSlots"):
            call()
    scheduler = Scheduler(slots, opened.tok, lambda events: None, SchedulerSettings(prefix_cache=True))
    assert not scheduler.prefix_cache  # asked for, but the concat cache keeps nothing


def test_slots_give_each_row_its_alone_logits(opened: Any) -> None:
    """Three sequences in slots 0, 2 and 3 join and leave at different steps; each decode's logits are
    the batch-1 run's."""
    rng = np.random.default_rng(0)
    vocab = opened.tok.vocab_size
    prompts = {0: rng.integers(1, vocab, 9).tolist(), 2: rng.integers(1, vocab, 3).tolist(),
               3: rng.integers(1, vocab, 17).tolist()}
    feeds = {s: rng.integers(1, vocab, 6).tolist() for s in prompts}
    expect = {s: alone_logits(opened, prompts[s], feeds[s]) for s in prompts}
    slots = open_slots(opened.engine, 4)
    got: dict[int, list[np.ndarray]] = {s: [] for s in prompts}
    start = {0: 0, 2: 2, 3: 4}  # the decode step at which each slot is filled
    for step in range(12):
        for s, at in start.items():
            if at == step:
                got[s].append(slots.append(s, np.array(prompts[s]))[-1])
        live = [s for s in prompts if start[s] < step + 1 and len(got[s]) <= len(feeds[s])]
        if live:
            logits = slots.decode(live, np.array([feeds[s][len(got[s]) - 1] for s in live]))
            for s, row in zip(live, logits, strict=True):
                got[s].append(row)
        for s in [s for s in prompts if len(got[s]) == len(feeds[s]) + 1 and slots.length(s)]:
            slots.free(s)  # done: the slot leaves while the others go on
    worst = max(float(np.abs(g - e).max()) for s in prompts for g, e in zip(got[s], expect[s], strict=True))
    assert all(len(got[s]) == len(expect[s]) for s in prompts)
    assert worst <= 1e-4, f"max |Δ logits| {worst}"


def test_static_slots_prefill_in_chunks(trained_dir: Path) -> None:
    """A prompt filled in chunks of 5 ends with the logits of one whole prefill (the static graph)."""
    opened = open_model(trained_dir, GraphChoice.parse(cache="static"))
    ids = np.random.default_rng(1).integers(1, opened.tok.vocab_size, 23)
    whole = open_slots(opened.engine, 2)
    expect = whole.append(1, ids)[-1]
    chunked = open_slots(opened.engine, 2)
    for lo in range(0, len(ids), 5):
        last = chunked.append(1, ids[lo:lo + 5])[-1]
    assert chunked.length(1) == len(ids)
    np.testing.assert_allclose(last, expect, atol=1e-4)
    assert int(last.argmax()) == int(expect.argmax())


def test_decode_spans_share_one_logits_buffer(trained_dir: Path) -> None:
    """Every span of slots a decode step can cover (136 at 16 slots) gets a binding made once, and all write
    their logits into one (S, 1, V) buffer (a buffer per span would hold ~S^3/6 rows of logits: 9 GB at 64
    slots and GPT-2's vocabulary); each span still returns its own rows, as the same span run afresh does."""
    opened = open_model(trained_dir, GraphChoice.parse(cache="static"))
    S = 16
    slots, fresh = open_slots(opened.engine, S), open_slots(opened.engine, S)
    assert isinstance(slots, StaticSlots)
    for lo in range(S):
        for hi in range(lo + 1, S + 1):
            for engine in (slots, fresh):
                for s in range(S):
                    engine.free(s)
                    engine.append(s, np.array([1 + s, 2, 3]))
            got = slots.decode([lo, hi - 1], np.array([5, 6]))  # (2, V): the span's first and last rows
            np.testing.assert_array_equal(got, fresh.decode([lo, hi - 1], np.array([5, 6])))
            fresh._steps.clear()  # a binding made afresh every time
    assert len(slots._steps) == S * (S + 1) // 2
    assert all(np.shares_memory(step.logits, slots._logits) for step in slots._steps.values())


def test_slot_refuses_past_n_ctx(opened: Any) -> None:
    slots = open_slots(opened.engine, 1)
    with pytest.raises(ValueError, match="n_ctx"):
        slots.append(0, np.ones(opened.engine.n_ctx + 1, dtype=np.int64))


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_greedy_tokens_alone_equal_tokens_among_others(opened: Any, data: st.DataObject) -> None:
    """16 greedy requests with hypothesis-chosen prompts, lengths, arrival iterations and ignore_eos: each gets,
    token for token, what `generate` gives it alone, and ends as it does. Some run into the context: a prompt of
    p tokens has room for n_ctx + 1 - p new ones (the last one sampled from position n_ctx - 1's logits), and
    one that asks for more ends with "length" there (generate's "context"); others ask for exactly that room, or
    for a few tokens after a short prompt. The first request always runs into the context."""
    vocab, n_ctx, eot = opened.tok.vocab_size, opened.engine.n_ctx, opened.tok.eot_id
    n = 16
    prompts, max_tokens, ignore = [], [], []
    for i in range(n):
        kind = "context" if i == 0 else data.draw(st.sampled_from(["context", "room", "short"]))
        lo, hi = {"context": (n_ctx - 30, n_ctx), "room": (1, n_ctx), "short": (1, 30)}[kind]
        prompt = data.draw(st.lists(st.integers(1, vocab - 1), min_size=lo, max_size=hi))
        room = n_ctx + 1 - len(prompt)
        prompts.append(prompt)
        max_tokens.append({"context": data.draw(st.integers(room + 1, room + 40)), "room": room,
                           "short": data.draw(st.integers(1, 24))}[kind])
        ignore.append(i == 0 or data.draw(st.booleans()))
    arrivals = [data.draw(st.integers(0, 40)) for _ in range(n)]
    slots = data.draw(st.sampled_from([4, 16]))
    run = Run(opened, slots, prefill_chunk=data.draw(st.sampled_from([7, 256])))
    choices = [Choice(p, m, Sampling(), ignore_eos=ig, out=i)
               for i, (p, m, ig) in enumerate(zip(prompts, max_tokens, ignore, strict=True))]
    for it in range(max(arrivals) + 1):
        run.s.submit([c for c, a in zip(choices, arrivals, strict=True) if a == it])
        run.step()
    run.until_idle()
    at_context = 0
    for i, (c, p, m) in enumerate(zip(choices, prompts, max_tokens, strict=True)):
        alone = generate(opened.engine, [p], m, Sampling(), -1 if c.ignore_eos else eot, overflow="stop")[0]
        room = n_ctx + 1 - len(p)
        finish = run.of(i)[-1]
        where = f"request {i} (prompt {len(p)}, max_tokens {m}, ignore_eos {c.ignore_eos}, arrived at {arrivals[i]})"
        if not c.ignore_eos and c.new_ids[-1] == eot:
            assert (c.new_ids[:-1], alone.finish_reason) == (alone.new_ids, "eot"), where
            assert finish == Finish("stop", len(p), len(c.new_ids), c.cached), where
            continue
        assert c.new_ids == alone.new_ids, where
        assert finish == Finish("length", len(p), min(m, room), c.cached), where
        assert alone.finish_reason == ("context" if m > room else "length"), where
        at_context += m >= room
    assert at_context >= 1
    assert run.s.busy == 0 and run.s.positions_in_use == 0


def test_seeded_sampling_alone_equals_among_others(opened: Any) -> None:
    """A sampled request with a seed gives `generate --seed`'s tokens, also beside other requests."""
    ids = opened.tok.encode("ka to ri")
    sampling = Sampling(temperature=0.9, top_k=20, top_p=0.95, seed=11)
    alone = generate(opened.engine, [ids], 20, sampling, opened.tok.eot_id)[0].new_ids
    run = Run(opened, 4)
    target = Choice(ids, 20, sampling, out="t")
    run.s.submit([Choice(ids[:2], 30, Sampling(temperature=1.0, seed=5), out="a"), target])
    run.until_idle()
    got = target.new_ids[:-1] if target.new_ids[-1] == opened.tok.eot_id else target.new_ids
    assert got == alone


def test_cancelled_choice_frees_its_slot_at_the_next_iteration(opened: Any) -> None:
    run = Run(opened, 1, max_queue=1)
    a = Choice([5, 6, 7], 50, Sampling(), ignore_eos=True, out="a")
    b = Choice([8, 9], 3, Sampling(), out="b")
    assert run.s.submit([a])
    run.step()  # a takes the slot
    assert run.s.submit([b])
    assert not run.s.submit([Choice([1], 1, out="c")])  # the queue holds one
    run.step()
    assert run.s.busy == 1 and run.s.waiting == 1
    a.cancelled = True
    run.step()
    assert b.slot == 0, "the cancelled choice's slot went to the waiting one"
    run.until_idle()
    assert isinstance(run.of("b")[-1], Finish)
    assert not any(isinstance(e, Finish) for e in run.of("a"))


def test_length_limits_end_with_length(opened: Any) -> None:
    n_ctx = opened.engine.n_ctx
    run = Run(opened, 2)
    full = Choice(list(range(1, n_ctx - 1)), 100, Sampling(), ignore_eos=True, out="ctx")
    short = Choice([3, 4], 5, Sampling(), ignore_eos=True, out="max")
    run.s.submit([full, short])
    run.until_idle()
    assert run.of("ctx")[-1] == Finish("length", n_ctx - 2, 3)  # positions n_ctx-2, n_ctx-1, then the last token
    assert run.of("max")[-1] == Finish("length", 2, 5)


def test_a_failing_model_fails_every_choice_and_frees_the_slots(opened: Any) -> None:
    run = Run(opened, 2)

    def broken(*args: Any, **kw: Any) -> np.ndarray:
        raise RuntimeError("boom")

    run.s.engine.decode = broken  # type: ignore[method-assign]
    choices = [Choice([i + 1, 2], 10, Sampling(), ignore_eos=True, out=i) for i in range(3)]
    run.s.submit(choices)
    run.step()  # prefills two, then the decode fails
    assert [type(run.of(i)[-1]) for i in range(3)] == [Failure, Failure, Failure]
    assert run.s.busy == 0 and run.s.waiting == 0
    assert len(choices[0].new_ids) == 1  # its first token came from the prefill, before the failure


def test_a_failing_admission_fails_the_choice_and_keeps_its_slot(trained_dir: Path) -> None:
    """A choice whose admission fails after it took a free slot (a kept cache that cannot be read, say)
    gets a Failure like every other choice, and the slot is free again: nothing is lost silently."""
    run = Run(open_model(trained_dir, GraphChoice.parse(cache="static")), 2)
    assert run.s.prefix_cache

    def broken(*args: Any, **kw: Any) -> int:
        raise RuntimeError("boom")

    run.s.engine.reuse = broken  # type: ignore[attr-defined]
    choices = [Choice([i + 1, 2], 10, Sampling(), ignore_eos=True, out=i) for i in range(3)]
    run.s.submit(choices)
    run.step()
    assert [type(run.of(i)[-1]) for i in range(3)] == [Failure, Failure, Failure]
    assert "boom" in run.of(0)[-1].message
    assert run.s.busy == 0 and run.s.waiting == 0 and sorted(run.s._free) == [0, 1]


def test_prompts_prefilled_together_equal_one_by_one(trained_dir: Path) -> None:
    """StaticSlots.prefill_many (adjacent empty slots in one step) gives each prompt's logits and cache
    exactly as filling the slots one by one does; the scheduler uses it for prompts that arrive together."""
    opened = open_model(trained_dir, GraphChoice.parse(cache="static"))
    rng = np.random.default_rng(3)
    prompts = [rng.integers(1, opened.tok.vocab_size, n) for n in (5, 17, 9, 1)]
    together, alone = open_slots(opened.engine, 6), open_slots(opened.engine, 6)
    many = together.prefill_many(1, prompts)
    one = np.stack([alone.append(1 + i, p)[-1] for i, p in enumerate(prompts)])
    np.testing.assert_array_equal(many, one)
    tokens = rng.integers(1, opened.tok.vocab_size, 4)
    np.testing.assert_array_equal(together.decode([1, 2, 3, 4], tokens), alone.decode([1, 2, 3, 4], tokens))
    with pytest.raises(ValueError, match="empty slots"):
        together.prefill_many(2, prompts[:1])

    run = Run(opened, 8)
    calls: list[int] = []
    inner = run.s.engine.prefill_many  # type: ignore[attr-defined]
    run.s.engine.prefill_many = lambda lo, ps: calls.append(len(ps)) or inner(lo, ps)  # type: ignore[attr-defined]
    choices = [Choice([int(t) for t in p], 6, Sampling(), out=i) for i, p in enumerate(prompts)]
    run.s.submit(choices)
    run.until_idle()
    assert calls == [4]
    for p, c in zip(prompts, choices, strict=True):
        alone_ids = generate(opened.engine, [list(p)], 6, Sampling(), opened.tok.eot_id)[0].new_ids
        got = c.new_ids[:-1] if c.new_ids[-1] == opened.tok.eot_id else c.new_ids
        assert got == alone_ids


def test_max_queue_counts_only_what_waits_beyond_free_slots(opened: Any) -> None:
    """--max-queue 0: requests that find a free slot are taken, the next one is refused."""
    run = Run(opened, 2, max_queue=0)
    assert run.s.submit([Choice([1, 2], 3, out="a")]) and run.s.submit([Choice([3], 3, out="b")])
    assert not run.s.submit([Choice([4], 3, out="c")])
    run.until_idle()
    assert isinstance(run.of("a")[-1], Finish) and isinstance(run.of("b")[-1], Finish)
    assert run.s.submit([Choice([5], 2, out="d")])  # the slots are free again
