"""The scheduler with the multi-row append graph, without HTTP: the chunks of one iteration — fresh prompts,
rests after a reused prefix, new chat turns, a long prompt's next chunk — are appended in one step, and
every greedy request still gets the tokens it gets without the graph (one slot at a time) and alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptport.runtime.choice import GraphChoice
from gptport.runtime.generate import generate
from gptport.runtime.loader import open_appender, open_model
from gptport.runtime.sampling import Sampling
from gptport.runtime.slots import StaticSlots
from gptport.serve.engine.plan import groups
from gptport.serve.engine.scheduler import Choice, Order
from tests.support import scheduling


@pytest.fixture(scope="module")
def opened(trained_dir: Path) -> Any:
    return open_model(trained_dir, GraphChoice.parse(cache="static"))


@pytest.fixture(scope="module")
def appender(trained_dir: Path, opened: Any) -> ort.InferenceSession:
    model = open_appender(trained_dir, opened.engine)
    assert model is not None
    return model.session


class Run(scheduling.Run):
    """The shared harness over StaticSlots, with or without the multi-row append graph; `steps` records how
    many slots each append_many step took, `sizes` its chunks' sizes, `decodes` the rows of each decode
    step."""

    def __init__(self, opened: Any, slots: int, appender: Any = None, **kw: Any) -> None:
        if isinstance(kw.get("order"), str):  # a drawn policy names its order (the draws kept as they were)
            kw["order"] = Order(kw["order"])
        self.steps: list[int] = []
        self.sizes: list[list[int]] = []
        self.decodes: list[int] = []
        engine = StaticSlots(opened.engine.session, opened.engine.config, slots, appender=appender)
        if appender is not None:
            inner = engine.append_many

            def counted(rows: Any, chunks: Any, **kw: Any) -> Any:
                self.steps.append(len(rows))
                self.sizes.append([len(c) for c in chunks])
                return inner(rows, chunks, **kw)

            engine.append_many = counted  # type: ignore[method-assign]
        inner_decode = engine.decode

        def decode(rows: Any, tokens: Any) -> Any:
            self.decodes.append(len(rows))
            return inner_decode(rows, tokens)

        engine.decode = decode  # type: ignore[method-assign]
        super().__init__(engine, opened.tok, **kw)


def copies(waves: list[list[tuple[int, Choice]]]) -> list[list[tuple[int, Choice]]]:
    return [[(a, Choice(list(c.prompt_ids), c.max_tokens, Sampling(), out=c.out)) for a, c in w] for w in waves]


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_waves_appended_together_give_each_request_its_tokens(opened: Any, appender: Any, data: st.DataObject
                                                              ) -> None:
    """Two waves of greedy requests whose prompts share drawn prefixes (the second wave reuses kept caches;
    some of its prompts continue an earlier request: its prompt, its reply, a new turn), arriving at drawn
    iterations on a drawn number of slots with a drawn prefill chunk and policy (runs of a drawn size, in
    arrival order or shortest first, a wave filled at once or not, a run's slots any distance apart or
    split where they are more than 0 or 2 rows apart, rests after a reused prefix first in runs of their
    own or not, one such run an iteration or any number): every request gets the tokens of the
    same waves served one slot at a time, and of `generate` alone."""
    vocab, n_ctx = opened.tok.vocab_size, opened.engine.n_ctx
    ids = st.integers(1, vocab - 1)
    bases = [data.draw(st.lists(ids, min_size=4, max_size=50)) for _ in range(2)]
    slots = data.draw(st.sampled_from([3, 8, 16]))
    chunk = data.draw(st.sampled_from([7, 64, 512]))
    policy = {"run_tokens": data.draw(st.sampled_from([0, 5, 40])), "fill_waves": data.draw(st.booleans()),
              "order": data.draw(st.sampled_from(["arrival", "shortest"])),
              "span_gap": data.draw(st.sampled_from([-1, 0, 2])), "rest_tokens": data.draw(st.sampled_from([0, 6])),
              "rest_runs": data.draw(st.sampled_from([0, 1]))}

    def prompt() -> list[int]:
        base = data.draw(st.sampled_from(bases))
        return base[:data.draw(st.integers(2, len(base)))] + data.draw(st.lists(ids, max_size=30))

    first = [(data.draw(st.integers(0, 3)), Choice(prompt(), data.draw(st.integers(1, 12)), Sampling(), out=i))
             for i in range(data.draw(st.integers(2, 8)))]
    together = Run(opened, slots, appender, prefill_chunk=chunk, **policy)
    together.waves([first])
    second = []
    for i in range(data.draw(st.integers(2, 8))):
        if data.draw(st.booleans()):  # a conversation's next turn: an earlier prompt, its reply, new text
            c = data.draw(st.sampled_from([c for _, c in first]))
            p = (c.prompt_ids + c.new_ids + data.draw(st.lists(ids, min_size=1, max_size=20)))[:n_ctx - 13]
        else:
            p = prompt()
        second.append((data.draw(st.integers(0, 3)), Choice(p, data.draw(st.integers(1, 12)), Sampling(), out=100 + i)))
    together.waves([second])
    alone = Run(opened, slots, prefill_chunk=chunk)
    waves = copies([first, second])
    alone.waves(waves)
    for (_, a), (_, b) in zip(first + second, waves[0] + waves[1], strict=True):
        where = f"request {a.out}: prompt {len(a.prompt_ids)}, {a.cached} positions reused"
        assert a.new_ids == b.new_ids, where
        ends = together.finish(a.out), alone.finish(b.out)  # what each reused may differ: when a copy was taken
        assert (ends[0].reason, ends[0].prompt_tokens, ends[0].completion_tokens) == (
            ends[1].reason, ends[1].prompt_tokens, ends[1].completion_tokens), where
    for _, c in second[:2]:
        by_itself = generate(opened.engine, [c.prompt_ids], c.max_tokens, Sampling(), opened.tok.eot_id)[0]
        assert c.new_ids[:len(by_itself.new_ids)] == by_itself.new_ids
    assert together.s.busy == 0 and together.s.positions_in_use == 0


def test_a_wave_of_rests_turns_and_fresh_prompts_is_one_step(opened: Any, appender: Any) -> None:
    """Eight prompts arrive together: five start with a prefix kept in the slots, one continues an earlier
    conversation (its prompt, its reply, a new turn), two are fresh. Their rests and the fresh prompts are
    appended in one step (the prefill budget allowing), not one step per slot, and each gets its tokens."""
    system = list(range(5, 45))
    run = Run(opened, 8, appender, span_gap=-1, rest_tokens=0)  # one run, wherever its slots are, of every kind
    first = [Choice(system + [50 + i], 3, Sampling(), ignore_eos=True, out=f"w{i}") for i in range(8)]
    run.waves([[(0, c) for c in first]])
    run.steps.clear()
    turn = first[2].prompt_ids + first[2].new_ids + [7, 8, 9]
    wave = [Choice(turn, 4, Sampling(), out="turn")]  # first: it takes the slot holding its conversation
    wave += [Choice(system + [90 + i, 91 + i, 92 + i], 4, Sampling(), out=i) for i in range(5)]
    wave += [Choice([300 + i, 301, 302, 303, 304], 4, Sampling(), out=f"fresh{i}") for i in range(2)]
    run.waves([[(0, c) for c in wave]])
    assert run.steps[0] == 8, run.steps
    assert [c.cached for c in wave] == [len(turn) - 4] + [len(system)] * 5 + [0, 0]  # its reply but the last token
    for c in wave:
        by_itself = generate(opened.engine, [c.prompt_ids], c.max_tokens, Sampling(), opened.tok.eot_id)[0]
        assert c.new_ids[:len(by_itself.new_ids)] == by_itself.new_ids


def alone_tokens(opened: Any, choices: list[Choice]) -> None:
    for c in choices:
        by_itself = generate(opened.engine, [c.prompt_ids], c.max_tokens, Sampling(), opened.tok.eot_id)[0]
        assert c.new_ids[:len(by_itself.new_ids)] == by_itself.new_ids, c.out


def test_a_wave_in_runs_samples_first_tokens_between_runs_shortest_first(opened: Any, appender: Any) -> None:
    """Eight rests of 9, 2, 7, 4, 4, 9, 3, 5 tokens after a kept prefix arrive together; with runs of up to
    12 tokens, shortest first, they are appended in runs of the shortest rests first, each run's first
    tokens sampled (and handed to `early`) before the next run starts, all in one iteration."""
    system = list(range(5, 45))
    run = Run(opened, 8, appender, run_tokens=12, order=Order.SHORTEST, span_gap=-1, rest_tokens=0)
    run.waves([[(0, Choice(system + [50 + i], 2, Sampling(), ignore_eos=True, out=f"w{i}")) for i in range(8)]])
    run.sizes.clear()
    rests = [9, 2, 7, 4, 4, 9, 3, 5]
    wave = [Choice(system + list(range(100 + i, 100 + i + k)), 3, Sampling(), ignore_eos=True, out=i)
            for i, k in enumerate(rests)]
    started: list[list[int]] = []  # before each run: the choices that have their first token
    inner = run.s.engine.append_many

    def append_many(rows: Any, chunks: Any, **kw: Any) -> Any:
        started.append([c.out for c in wave if c.new_ids])
        return inner(rows, chunks, **kw)

    run.s.engine.append_many = append_many  # type: ignore[method-assign]
    run.s.submit(wave)
    run.events += run.s.iterate()
    assert run.sizes == [[2, 3, 4], [4, 5], [7], [9], [9]]
    assert started == [[], [1, 3, 6], [1, 3, 4, 6, 7], [1, 2, 3, 4, 6, 7], [0, 1, 2, 3, 4, 6, 7]]
    assert all(c.new_ids for c in wave)  # every first token in the first iteration
    run.until_idle(3000)
    alone_tokens(opened, wave)


def test_arrivals_of_one_prefix_compute_it_once_in_one_iteration(opened: Any, appender: Any) -> None:
    """Sixteen prompts with one 60-token head arrive at once on empty slots: the first prefills the head, the
    other fifteen copy it and append only their own tokens, in the same iteration when an iteration takes
    any number of runs of rests (rest_runs 0), so every first token comes from the first iteration; the
    head is computed once."""
    rng = np.random.default_rng(3)
    head = rng.integers(1, opened.tok.vocab_size, 60).tolist()
    wave = [Choice(head + rng.integers(1, opened.tok.vocab_size, 4 + i % 5).tolist(), 3, Sampling(), ignore_eos=True,
                   out=i) for i in range(16)]
    run = Run(opened, 16, appender, order=Order.SHORTEST, span_gap=-1, rest_runs=0)
    run.s.submit(wave)
    run.events += run.s.iterate()
    assert all(c.new_ids for c in wave)
    assert [c.cached for c in wave] == [0] + [60] * 15
    assert sum(map(sum, run.sizes)) == 60 + sum(len(c.prompt_ids) - 60 for c in wave)
    run.until_idle(3000)
    alone_tokens(opened, wave)


def test_a_wave_takes_every_chunk_a_few_arrivals_the_budget(opened: Any, appender: Any) -> None:
    """With fill_waves, six prompts of 20 tokens arriving while no row decodes are all appended in the first
    iteration, in runs of up to 40 tokens, though the prefill chunk is 30; two more arriving while those
    six decode (fewer prompts waiting than rows decoding) get at most 30 tokens an iteration."""
    run = Run(opened, 8, appender, prefill_chunk=30, run_tokens=40, fill_waves=True, span_gap=-1)
    wave = [Choice(list(range(10 + i, 30 + i)), 8, Sampling(), ignore_eos=True, out=i) for i in range(6)]
    run.s.submit(wave)
    run.events += run.s.iterate()
    assert run.sizes == [[20, 20], [20, 20], [20, 20]] and all(c.new_ids for c in wave)
    run.sizes.clear()
    late = [Choice(list(range(50 + i, 70 + i)), 4, Sampling(), ignore_eos=True, out=f"late{i}") for i in range(2)]
    run.s.submit(late)
    run.events += run.s.iterate()
    run.events += run.s.iterate()
    assert run.sizes == [[20, 10], [10]]
    run.until_idle(3000)
    alone_tokens(opened, [*wave, *late])


def test_a_prompt_arriving_between_runs_goes_in_the_next_run(opened: Any, appender: Any) -> None:
    """A prompt submitted while an iteration's first run is appended takes a free slot before the next run
    and, shortest first, gets its first token in that same iteration, ahead of the longer prompts."""
    run = Run(opened, 4, appender, run_tokens=10, order=Order.SHORTEST, fill_waves=True, span_gap=-1)
    wave = [Choice(list(range(10 + i, 20 + i + 2 * i)), 3, Sampling(), ignore_eos=True, out=i) for i in range(3)]
    late = Choice([70, 71, 72], 3, Sampling(), ignore_eos=True, out="late")
    inner = run.s.engine.append_many

    def append_many(rows: Any, chunks: Any, **kw: Any) -> Any:
        if not run.sizes:  # the first run
            run.s.submit([late])
        return inner(rows, chunks, **kw)

    run.s.engine.append_many = append_many  # type: ignore[method-assign]
    run.s.submit(wave)
    run.events += run.s.iterate()
    assert run.sizes == [[10], [3], [12], [14]] and late.new_ids
    run.until_idle(3000)
    alone_tokens(opened, [*wave, late])


def test_groups_split_where_slots_are_far_apart() -> None:
    """plan.groups: slots more than `gap` rows apart go to different groups, each group in request order,
    the groups in the order of their first request; a negative gap keeps one group."""
    assert groups([7, 0, 1, 12, 9], 1) == [[0, 4], [1, 2], [3]]
    assert groups([7, 0, 1, 12, 9], 0) == [[0], [1, 2], [3], [4]]
    assert groups([7, 0, 1, 12, 9], -1) == [[0, 1, 2, 3, 4]]
    assert groups([], 2) == [] and groups([5], 0) == [[0]]


def test_rests_far_apart_are_appended_in_groups(opened: Any, appender: Any) -> None:
    """Slots 0, 1 and 7 take new prompts while 2-6 decode: with span_gap 1, slots 0 and 1 are one run of the
    append graph and slot 7 appends alone (a run over 0-7 would compute the five decoding rows' attention
    too); every first token comes in that iteration, and each request gets its tokens."""
    run = Run(opened, 8, appender, span_gap=1)
    first = [Choice(list(range(10 + 3 * i, 16 + 3 * i)), 1 if i in (0, 1, 7) else 12, Sampling(), ignore_eos=True,
                    out=i) for i in range(8)]
    run.s.submit(first)
    run.events += run.s.iterate()
    assert [c.slot for c in first] == [-1, -1, 2, 3, 4, 5, 6, -1]  # 0, 1 and 7 finished at their first token
    run.steps.clear()
    wave = [Choice(list(range(200 + 5 * i, 207 + 5 * i)), 4, Sampling(), ignore_eos=True, out=f"n{i}")
            for i in range(3)]
    run.s.submit(wave)
    run.events += run.s.iterate()
    assert [c.slot for c in wave] == [0, 1, 7] and run.steps == [2] and all(c.new_ids for c in wave)
    run.until_idle(3000)
    alone_tokens(opened, [*first, *wave])


def test_rests_go_first_in_runs_of_their_own(opened: Any, appender: Any) -> None:
    """With rest_tokens 10 and any number of rest runs an iteration, two fresh prompts of 12 tokens arrive,
    then three prompts whose first 40 tokens are kept in the slots (rests of 3, 4 and 5 tokens): the rests
    are appended first, in runs of their own of up to 10 tokens, and the fresh prompts after them in one
    run, all in one iteration."""
    system = list(range(5, 45))
    run = Run(opened, 8, appender, rest_tokens=10, rest_runs=0)
    run.waves([[(0, Choice(system + [50 + i], 2, Sampling(), ignore_eos=True, out=f"w{i}")) for i in range(3)]])
    run.sizes.clear()
    fresh = [Choice(list(range(300 + 20 * i, 312 + 20 * i)), 3, Sampling(), ignore_eos=True, out=f"f{i}")
             for i in range(2)]
    rests = [Choice(system + list(range(100 + 10 * i, 100 + 10 * i + k)), 3, Sampling(), ignore_eos=True, out=i)
             for i, k in enumerate([3, 4, 5])]
    run.s.submit(fresh + rests)
    run.events += run.s.iterate()
    assert [c.cached for c in rests] == [40, 40, 40] and run.sizes == [[3, 4], [5], [12, 12]]
    assert all(c.new_ids for c in fresh + rests)
    run.until_idle(3000)
    alone_tokens(opened, [*fresh, *rests])


def test_one_run_of_rests_an_iteration_spreads_a_wave_over_decode_steps(opened: Any, appender: Any) -> None:
    """By default (rest_runs 1) an iteration appends one run of rests: three rests of 3, 4 and 5 tokens
    (rest_tokens 10), a rest of 12 tokens and a fresh prompt arrive beside a decoding row; the first
    iteration appends the rests of 3 and 4 tokens in one run, the rest of 12 tokens (longer than rest_tokens)
    with the fresh prompt in another, then steps the decoding row and the four with first tokens; the rest
    of 5 tokens goes in the next iteration. Every request gets the tokens it gets alone."""
    system = list(range(5, 45))
    run = Run(opened, 8, appender, rest_tokens=10)
    assert run.s.settings.rest_runs == 1
    run.waves([[(0, Choice(system + [50 + i], 2, Sampling(), ignore_eos=True, out=f"w{i}")) for i in range(6)]])
    busy = Choice(list(range(400, 410)), 30, Sampling(), ignore_eos=True, out="busy")
    run.s.submit([busy])
    run.events += run.s.iterate()
    run.sizes.clear()
    run.decodes.clear()
    rests = [Choice(system + list(range(100 + 10 * i, 100 + 10 * i + k)), 3, Sampling(), ignore_eos=True, out=i)
             for i, k in enumerate([3, 4, 5])]
    long = Choice(system + list(range(200, 212)), 3, Sampling(), ignore_eos=True, out="long")  # a rest of 12 > 10
    fresh = Choice(list(range(300, 309)), 3, Sampling(), ignore_eos=True, out="fresh")
    run.s.submit([*rests, long, fresh])
    run.events += run.s.iterate()
    assert [c.cached for c in (*rests, long)] == [40, 40, 40, 40]
    assert run.sizes == [[3, 4], [12, 9]] and run.decodes == [5]  # busy, the two rests, long, fresh
    assert [bool(c.new_ids) for c in rests] == [True, True, False]
    run.events += run.s.iterate()
    assert run.sizes[2:] == [[5]] and rests[2].new_ids
    run.until_idle(3000)
    alone_tokens(opened, [busy, *rests, long, fresh])
