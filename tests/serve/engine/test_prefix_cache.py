"""Prefix caching in the scheduler, without HTTP: a freed slot keeps its cache, a prompt that starts the
same way prefills only the rest, `n` > 1 prefills once, and greedy tokens are those without any reuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptport.runtime.choice import GraphChoice
from gptport.runtime.generate import generate
from gptport.runtime.loader import open_model
from gptport.runtime.sampling import Sampling
from gptport.runtime.slots import StaticSlots
from gptport.serve.engine.scheduler import Choice, Finish
from tests.support import scheduling


@pytest.fixture(scope="module")
def opened(trained_dir: Path) -> Any:
    return open_model(trained_dir, GraphChoice.parse(cache="static"))


class Run(scheduling.Run):
    """The shared harness over StaticSlots (prefix caching on unless prefix_cache=False)."""

    def __init__(self, opened: Any, slots: int, **kw: Any) -> None:
        super().__init__(StaticSlots(opened.engine.session, opened.engine.config, slots), opened.tok, **kw)


def copies(waves: list[list[tuple[int, Choice]]]) -> list[list[tuple[int, Choice]]]:
    return [[(a, Choice(list(c.prompt_ids), c.max_tokens, Sampling(), out=c.out)) for a, c in w] for w in waves]


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_greedy_tokens_with_reuse_equal_tokens_without(opened: Any, data: st.DataObject) -> None:
    """Two waves of greedy requests whose prompts share hypothesis-drawn prefixes (some continue an earlier
    request: its prompt, its reply and more, so decode-written positions are reused too), arriving in drawn
    orders on a drawn number of slots: every request gets the tokens it gets with prefix caching off, and
    alone. The second wave reuses kept caches."""
    vocab, n_ctx = opened.tok.vocab_size, opened.engine.n_ctx
    ids = st.integers(1, vocab - 1)
    bases = [data.draw(st.lists(ids, min_size=4, max_size=40)) for _ in range(2)]
    slots = data.draw(st.sampled_from([2, 4, 16]))

    def prompt() -> list[int]:
        base = data.draw(st.sampled_from(bases))
        return base[:data.draw(st.integers(2, len(base)))] + data.draw(st.lists(ids, max_size=12))

    first = [(data.draw(st.integers(0, 6)), Choice(prompt(), data.draw(st.integers(1, 12)), Sampling(), out=i))
             for i in range(data.draw(st.integers(1, 6)))]
    on = Run(opened, slots)
    on.waves([first])
    second = []
    for i in range(data.draw(st.integers(1, 8))):
        if data.draw(st.booleans()):  # a conversation's next turn: an earlier prompt, its reply, new text
            c = data.draw(st.sampled_from([c for _, c in first]))
            p = (c.prompt_ids + c.new_ids + data.draw(st.lists(ids, min_size=1, max_size=8)))[:n_ctx - 13]
        else:
            p = prompt()
        second.append((data.draw(st.integers(0, 6)), Choice(p, data.draw(st.integers(1, 12)), Sampling(), out=100 + i)))
    on.waves([second])
    off = Run(opened, slots, prefix_cache=False)
    waves = copies([first, second])
    off.waves(waves)
    for (_, a), (_, b) in zip(first + second, waves[0] + waves[1], strict=True):
        assert a.new_ids == b.new_ids, f"request {a.out}: prompt {len(a.prompt_ids)}, {a.cached} positions reused"
        assert b.cached == 0
    for _, c in second[:2]:
        alone = generate(opened.engine, [c.prompt_ids], c.max_tokens, Sampling(), opened.tok.eot_id)[0]
        assert c.new_ids[:len(alone.new_ids)] == alone.new_ids
    assert sum(c.cached for _, c in second) > 0, "the second wave shares prefixes with freed slots"
    assert all(c.cached < len(c.prompt_ids) for _, c in first + second)  # the last token is always run


def test_reuse_reports_cached_tokens_and_prefills_the_rest(opened: Any) -> None:
    """A prompt that extends a finished one reuses its positions (Finish.cached_tokens), prefills only the
    rest (the observer's count), and the slot it takes is the one holding the prefix, not the lowest."""
    counted = {"prompt": 0, "cached": 0}

    class Count:
        def tokens(self, prompt: int, generated: int) -> None:
            counted["prompt"] += prompt

        def cached(self, prompt: int) -> None:
            counted["cached"] += prompt

        def __getattr__(self, name: str) -> Any:
            return lambda *a: None

    run = Run(opened, 4, observer=Count())
    s, events = run.s, run.events
    head = opened.tok.encode("to be or not to be that is the question")
    a, b = Choice([7, 8, 9], 3, out="a"), Choice(head, 4, out="b")
    s.submit([a, b])
    while s.busy or s.waiting:
        events += s.iterate()
    assert (a.slot, b.slot) == (-1, -1)
    counted["prompt"] = 0
    c = Choice(head + [11, 12], 3, out="c")
    s.submit([c])
    events += s.iterate()
    assert c.slot == 1 and c.cached == len(head)  # slot 0 is lower, slot 1 holds the prefix
    while s.busy:
        events += s.iterate()
    assert counted == {"prompt": 2, "cached": len(head)}
    assert [e for o, e in events if o == "c"][-1] == Finish("length", len(head) + 2, 3, len(head))


def test_n_choices_prefill_their_prompt_once(opened: Any) -> None:
    """Three greedy choices of one prompt (the same list, as the server builds them): one prefills, two
    copy its rows; all three give the tokens of one alone."""
    prompt = opened.tok.encode("ka to ri ma su")
    run = Run(opened, 4)
    choices = [Choice(prompt, 8, Sampling(), ignore_eos=True, out=i) for i in range(3)]
    prefilled = []
    inner = run.s.engine.append
    run.s.engine.append = lambda slot, ids, all_logits=False: prefilled.append(len(ids)) or inner(slot, ids,  # type: ignore[method-assign]
                                                                                                       all_logits)
    run.waves([[(0, c) for c in choices]])
    alone = generate(opened.engine, [prompt], 8, Sampling(), -1)[0].new_ids
    assert [c.new_ids for c in choices] == [alone] * 3
    assert sorted(c.cached for c in choices) == [0, len(prompt), len(prompt)]
    assert sum(prefilled) == len(prompt)


def test_a_free_slots_kept_cache_survives_other_rows_steps(opened: Any) -> None:
    """Decode steps over a span that covers a free slot leave its kept cache as it was: a prompt reusing
    it gets exactly the logits of a fresh prefill."""
    cfg, rng = opened.engine.config, np.random.default_rng(3)
    prompt = rng.integers(1, opened.tok.vocab_size, 30)
    fresh = StaticSlots(opened.engine.session, cfg, 3)
    want = fresh.append(0, prompt)  # (1, V)
    slots = StaticSlots(opened.engine.session, cfg, 3)
    slots.append(1, prompt[:20])
    slots.free(1)
    slots.append(0, np.array([5, 6]))
    slots.append(2, np.array([9]))
    for t in range(5):
        slots.decode([0, 2], np.array([t + 1, t + 2]))  # the span [0, 3) covers the free slot 1
    assert slots.reuse(1, prompt) == 20
    assert np.array_equal(slots.append(1, prompt[20:]), want)
    slots.free(0)
    assert slots.cached([0, 1, 2], [5, 6, 1, 2, 3]).tolist() == [4, 0, 0]  # all but the last token
    with pytest.raises(ValueError, match="in use"):
        slots.reuse(2, prompt)


def test_prefix_cache_off_reuses_nothing(opened: Any) -> None:
    head = opened.tok.encode("to be or not to be")
    run = Run(opened, 2, prefix_cache=False)
    later = Choice(head + [3], 2, out="b")
    run.waves([[(0, Choice(head, 2, out="a"))], [(0, later)]])
    assert later.cached == 0 and later.slot == -1


def test_prompts_arriving_together_compute_their_shared_prefix_once(opened: Any) -> None:
    """Three prompts with one 40-token head, submitted together: the first prefills it, the others copy it
    from the first's slot (it is still prefilling when they are admitted) and prefill only their own
    tokens (the one-token rest as a row of the decode step); each gets the tokens it gets alone."""
    rng = np.random.default_rng(5)
    head = rng.integers(1, opened.tok.vocab_size, 40).tolist()
    prompts = [head + rng.integers(1, opened.tok.vocab_size, n).tolist() for n in (3, 9, 1)]
    run = Run(opened, 4)
    prefilled: list[int] = []
    inner = run.s.engine.append
    run.s.engine.append = lambda slot, ids, all_logits=False: prefilled.append(len(ids)) or inner(slot, ids,  # type: ignore[method-assign]
                                                                                                       all_logits)
    steps: list[list[int]] = []  # each decode step's tokens
    inner_decode = run.s.engine.decode
    run.s.engine.decode = lambda slots, tokens: steps.append(tokens.tolist()) or inner_decode(slots, tokens)  # type: ignore[method-assign]
    choices = [Choice(p, 6, Sampling(), ignore_eos=True, out=i) for i, p in enumerate(prompts)]
    run.waves([[(0, c) for c in choices]])
    assert [c.cached for c in choices] == [0, 40, 40]
    assert sorted(prefilled) == [9, 43]
    # the third prompt's one own token joins the first decode step, after the two rows decoding
    assert steps[0] == [choices[0].new_ids[0], choices[1].new_ids[0], prompts[2][-1]]
    for c in choices:
        assert c.new_ids == generate(opened.engine, [c.prompt_ids], 6, Sampling(), -1)[0].new_ids
