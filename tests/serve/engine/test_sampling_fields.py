"""The scheduler with the frequency and presence penalties and min_p: a request's tokens are the same alone
(`generate` with its seed) and beside other rows, whatever arrives when, and the same seed gives the same
tokens again. The counts are kept per choice, one token at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptport.runtime.choice import GraphChoice
from gptport.runtime.generate import generate
from gptport.runtime.loader import open_model
from gptport.runtime.sampling import Sampling
from gptport.serve.engine.scheduler import Choice
from tests.support.scheduling import Opened as Run


@pytest.fixture(scope="module", params=["static", "concat"])
def opened(request: pytest.FixtureRequest, trained_dir: Path) -> Any:
    return open_model(trained_dir, GraphChoice.parse(cache=request.param))


samplings = st.builds(Sampling, temperature=st.sampled_from([0.0, 0.8, 1.3]), top_k=st.sampled_from([0, 20]),
                      repetition_penalty=st.sampled_from([1.0, 1.2]), seed=st.integers(0, 2**31),
                      presence_penalty=st.sampled_from([0.0, 1.5, -0.5, 2.0]),
                      frequency_penalty=st.sampled_from([0.0, 0.7, -2.0]), min_p=st.sampled_from([0.0, 0.1, 0.5]))


def tokens_of(c: Choice, eot: int) -> list[int]:
    """A choice's tokens as generate() reports them: without the end of text it stopped at."""
    return c.new_ids[:-1] if not c.ignore_eos and c.new_ids and c.new_ids[-1] == eot else c.new_ids


def run_all(opened: Any, requests: list[tuple[list[int], int, Sampling, bool]], arrivals: list[int],
            slots: int) -> list[Choice]:
    """The requests through a scheduler stepped by hand, each submitted at its arrival iteration."""
    run = Run(opened, slots)
    choices = [Choice(p, m, s, ignore_eos=ig, out=i) for i, (p, m, s, ig) in enumerate(requests)]
    for it in range(max(arrivals) + 1):
        run.s.submit([c for c, a in zip(choices, arrivals, strict=True) if a == it])
        run.step()
    run.until_idle()
    assert run.s.busy == 0
    return choices


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_penalized_requests_alone_equal_among_others(opened: Any, data: st.DataObject) -> None:
    """8 requests with hypothesis-chosen penalties, min_p, temperatures, seeds, prompts and arrivals, beside
    each other in 3 or 8 slots: each gets `generate`'s tokens for its prompt and seed alone; the same
    requests arriving in the reverse order, in other slots, get the same tokens again."""
    vocab, eot = opened.tok.vocab_size, opened.tok.eot_id
    n = 8
    requests = [(data.draw(st.lists(st.integers(1, vocab - 1), min_size=1, max_size=30)), data.draw(st.integers(1, 40)),
                 data.draw(samplings), data.draw(st.booleans())) for _ in range(n)]
    arrivals = [data.draw(st.integers(0, 12)) for _ in range(n)]
    slots = data.draw(st.sampled_from([3, 8]))
    first = run_all(opened, requests, arrivals, slots)
    again = run_all(opened, requests[::-1], arrivals, 11 - slots)[::-1]
    for i, ((p, m, s, ignore), c, d) in enumerate(zip(requests, first, again, strict=True)):
        alone = generate(opened.engine, [p], m, s, -1 if ignore else eot, overflow="stop")[0]
        assert tokens_of(c, eot) == alone.new_ids, (i, s)
        assert d.new_ids == c.new_ids, (i, s)


def test_presence_penalty_changes_a_repeating_greedy_output(opened: Any) -> None:
    """Greedy, 60 tokens after a short prompt, which repeat: with presence_penalty 2 fewer tokens come back,
    beside a plain row the same as alone."""
    ids = opened.tok.encode("ka to ri")
    plain = generate(opened.engine, [ids], 60, Sampling(), -1)[0].new_ids
    s = Sampling(presence_penalty=2.0)
    alone = generate(opened.engine, [ids], 60, s, -1)[0].new_ids
    assert len(plain) - len(set(plain)) > len(alone) - len(set(alone))
    both = run_all(opened, [(ids, 60, Sampling(), True), (ids, 60, s, True)], [0, 0], 2)
    assert [c.new_ids for c in both] == [plain, alone]
