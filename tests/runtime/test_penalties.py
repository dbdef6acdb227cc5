"""The frequency and presence penalties and min_p (runtime/sampling.py), checked against what they mean,
written here directly in numpy: OpenAI's penalties over the generated tokens' counts (a bincount), min_p's
filter on the distribution after temperature, the filters' order (penalties, temperature, min_p, top-k,
top-p), a batch of rows sampling each as it would alone, and the options' one-line refusals."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from gptport.errors import UsageError
from gptport.runtime.sampling import BLOCK, Sampling, choose, choose_rows, discount, probs
from gptport.runtime.speculative import verify
from tests.runtime.test_sampling import CHI2_DF5, chi2, softmax

V = 2 * BLOCK + 37


def expected_logits(logits: np.ndarray, generated: list[int], frequency: float, presence: float) -> np.ndarray:
    """OpenAI's definition, in float64: logits[j] - count[j] * frequency - (count[j] > 0) * presence."""
    count = np.bincount(np.asarray(generated, dtype=np.int64), minlength=logits.size).astype(np.float64)
    return logits.astype(np.float64) - count * frequency - (count > 0) * presence


def expected_probs(logits: np.ndarray, s: Sampling, generated: list[int]) -> np.ndarray:
    """The distribution a row is drawn from, each filter written out in float64 in vLLM's order."""
    z = expected_logits(logits, generated, s.frequency_penalty, s.presence_penalty) / s.temperature
    p = softmax(z)
    p[p < s.min_p * p.max()] = 0.0
    if s.top_k:
        p[np.argsort(-p, kind="stable")[s.top_k:]] = 0.0
    p /= p.sum()
    if s.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cumulative = np.cumsum(p[order])
        p[order[int(np.searchsorted(cumulative, s.top_p)) + 1:]] = 0.0
    return p / p.sum()


@pytest.mark.parametrize(("frequency", "presence"), [(0.7, 0.0), (0.0, 1.5), (-0.4, 2.0), (2.0, -2.0)])
def test_penalties_are_openais_formula(frequency: float, presence: float) -> None:
    rng = np.random.default_rng(3)
    logits = (rng.normal(size=V) * 3).astype(np.float32)
    generated = rng.integers(0, 40, 60).tolist()  # repeats: counts up to several
    before = logits.copy()
    got = discount(logits, Counter(generated), frequency, presence)
    assert np.array_equal(logits, before)  # the caller's logits are untouched
    np.testing.assert_allclose(got, expected_logits(logits, generated, frequency, presence), rtol=0, atol=1e-5)
    assert np.array_equal(discount(logits, Counter(), frequency, presence), logits)


def test_only_generated_tokens_count() -> None:
    """Greedy decoding with a presence penalty: the argmax of the penalized logits, where the prompt
    (the repetition penalty's history) does not count and the counts of the generated tokens do."""
    logits = np.array([0.1, 3.0, 2.9, -1.0, 0.5, 2.0], dtype=np.float32)
    gen = np.random.default_rng(0)
    s = Sampling(presence_penalty=0.5)
    assert choose(logits, s, gen, seen=[1, 1, 1], counts=Counter()) == 1  # 1 is in the prompt only
    assert choose(logits, s, gen, seen=[1], counts=Counter({1: 1})) == 2  # 3.0 - 0.5 < 2.9
    assert choose(logits, Sampling(frequency_penalty=0.06), gen, counts=Counter({1: 1})) == 1  # 2.94 > 2.9
    assert choose(logits, Sampling(frequency_penalty=0.06), gen, counts=Counter({1: 2})) == 2  # 2.88 < 2.9
    assert choose(logits, Sampling(presence_penalty=-1.5), gen, counts=Counter({5: 9})) == 5  # below 0: favoured
    assert choose_rows(logits[None], [(s, gen, [[1]], Counter({1: 1}))]) == [2]


@pytest.mark.parametrize("s", [Sampling(temperature=1.0, frequency_penalty=0.8, presence_penalty=0.6),
                               Sampling(temperature=0.7, min_p=0.2),
                               Sampling(temperature=2.0, min_p=0.05, presence_penalty=1.0),
                               Sampling(temperature=1.3, min_p=0.1, top_k=5, top_p=0.8, frequency_penalty=0.5)])
def test_draws_follow_the_filters_in_order(s: Sampling) -> None:
    """`probs` is the distribution written out in numpy (penalties, temperature, min_p, top-k, top-p), and
    5,000 seeded draws from `choose_rows` fit it (chi-square) without ever drawing a dropped token."""
    logits = np.full(V, -30.0, dtype=np.float32)
    cells = np.array([0, BLOCK - 1, BLOCK, 2 * BLOCK - 1, 2 * BLOCK, V - 1])  # at the draw's block edges
    logits[cells] = [2.0, 1.2, 2.4, 0.3, 1.9, -0.2]
    generated = [int(cells[2])] * 2 + [int(cells[4])]
    want = expected_probs(logits, s, generated)
    np.testing.assert_allclose(probs(logits, s, counts=Counter(generated)), want, rtol=1e-5, atol=1e-9)
    gen = np.random.default_rng(0)
    counts = Counter(generated)
    tokens = np.array([t for _ in range(5) for t in choose_rows(np.broadcast_to(logits, (1000, V)),
                                                                [(s, gen, [()], counts)] * 1000)])
    kept = np.flatnonzero(want > 0)
    assert np.isin(tokens, kept).all(), set(tokens.tolist()) - set(kept.tolist())
    live = cells[want[cells] > 1e-3]
    assert chi2(tokens[np.isin(tokens, live)], live, want[live] / want[live].sum()) < CHI2_DF5


def test_min_p_comes_after_temperature() -> None:
    """min_p drops what is less likely than min_p times the likeliest token *after* temperature: a token at
    e^-2 of the top one is dropped by min_p 0.2 at temperature 1, kept at temperature 2 (e^-1 > 0.2);
    min_p 1 keeps only the likeliest, at any temperature."""
    logits = np.array([2.0, 0.0, 1.5, -5.0], dtype=np.float32)
    assert (probs(logits, Sampling(temperature=1.0, min_p=0.2)) > 0).tolist() == [True, False, True, False]
    assert (probs(logits, Sampling(temperature=2.0, min_p=0.2)) > 0).tolist() == [True, True, True, False]
    gen = np.random.default_rng(0)
    for t in (0.5, 1.0, 50.0):
        assert set(choose_rows(np.broadcast_to(logits, (200, 4)), [(Sampling(temperature=t, min_p=1.0), gen,
                                                                     [()], None)] * 200)) == {0}


MIXED = [Sampling(), Sampling(presence_penalty=1.0), Sampling(frequency_penalty=0.5, repetition_penalty=1.2),
         Sampling(temperature=0.8, min_p=0.1), Sampling(temperature=1.0, presence_penalty=-0.5, frequency_penalty=1.0),
         Sampling(temperature=1.2, min_p=0.05, top_k=30, top_p=0.9, presence_penalty=2.0), Sampling(temperature=1.0)]


def test_rows_sample_as_they_would_alone() -> None:
    """A batch of rows with penalties and min_p beside plain ones: each row's tokens are those it gets alone,
    its counts kept one token at a time; the same seeds give the same tokens again."""
    def run() -> tuple[list[list[int]], list[list[int]]]:
        rng = np.random.default_rng(7)
        batch = [np.random.default_rng(100 + i) for i in range(len(MIXED))]
        alone = [np.random.default_rng(100 + i) for i in range(len(MIXED))]
        prompts = [rng.integers(0, 60, 5).tolist() for _ in MIXED]
        generated: list[list[int]] = [[] for _ in MIXED]
        counts: list[Counter[int] | None] = [Counter() if s.penalized else None for s in MIXED]
        solo: list[list[int]] = [[] for _ in MIXED]
        for _ in range(40):
            logits = (rng.normal(size=(len(MIXED), V)) * 2).astype(np.float32)
            logits[:, :60] += 3.0  # a few likely tokens, which repeat
            got = choose_rows(logits, [(s, g, (p, h), c) for s, g, p, h, c in
                                       zip(MIXED, batch, prompts, generated, counts, strict=True)])
            for i, s in enumerate(MIXED):
                solo[i].append(choose(logits[i], s, alone[i], [*prompts[i], *generated[i]],
                                      Counter(generated[i]) if s.penalized else None))
            for h, c, t in zip(generated, counts, got, strict=True):
                h.append(t)
                if c is not None:
                    c[t] += 1
        return generated, solo

    generated, solo = run()
    assert generated == solo
    assert run()[0] == generated


def test_verify_judges_each_position_with_the_counts_as_of_it() -> None:
    """Speculative verification with a presence penalty: the draft before a position counts as generated
    there. Greedy: a draft that the penalty makes no longer the argmax is rejected. Sampled (a lookup
    draft, q a point mass): the first token follows p with the counts so far, the token after an accepted
    draft follows p with that draft counted too (chi-square over 4,000 seeds)."""
    logits = np.array([[0.0, 3.0, 2.9, 0.5, 1.0, 0.2],
                       [0.0, 3.0, 2.9, 0.5, 1.0, 0.2]], dtype=np.float32)
    greedy = Sampling(presence_penalty=0.5)
    gen = np.random.default_rng(0)
    assert verify(logits, [1], [None], greedy, gen, [4], Counter()) == ([1], 2)  # 1 drafted: 2.5 < 2.9
    assert verify(logits, [1], [None], Sampling(), gen, [4], Counter()) == ([1], 1)  # no penalty: 1 again
    assert verify(logits, [1], [None], greedy, gen, [4], Counter({1: 1})) == ([], 2)  # 1 generated before
    s = Sampling(temperature=1.0, presence_penalty=1.0, frequency_penalty=0.5)
    counts = Counter({2: 1})
    first, second = [], []
    for seed in range(4000):
        accepted, own = verify(logits, [1], [None], s, np.random.default_rng(seed), [4], counts)
        first.append(accepted[0] if accepted else own)
        if accepted:
            second.append(own)
    assert counts == Counter({2: 1})  # the caller's counts are not changed
    cells = np.arange(6)
    p0 = expected_probs(logits[0], s, [2])
    p1 = expected_probs(logits[1], s, [2, 1])
    assert chi2(np.array(first), cells, p0) < CHI2_DF5
    assert chi2(np.array(second), cells, p1) < CHI2_DF5
    assert chi2(np.array(second), cells, p0) > 10 * CHI2_DF5  # the draft did count


@pytest.mark.parametrize(("kwargs", "option"), [({"presence_penalty": 2.01}, "--presence-penalty"),
                                               ({"presence_penalty": float("nan")}, "--presence-penalty"),
                                               ({"frequency_penalty": -2.5}, "--frequency-penalty"),
                                               ({"min_p": 1.5}, "--min-p"), ({"min_p": -0.1}, "--min-p")])
def test_bad_options(kwargs: dict[str, float], option: str) -> None:
    with pytest.raises(UsageError, match=option):
        Sampling(**kwargs)  # type: ignore[arg-type]
    for edge in ({"presence_penalty": -2.0}, {"frequency_penalty": 2.0}, {"min_p": 1.0}, {"min_p": 0.0}):
        Sampling(**edge)  # type: ignore[arg-type]
