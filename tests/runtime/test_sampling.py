"""Sampling and streaming detokenization, in numpy alone.

The sampler's properties are checked against what they mean, not against its own code: greedy is the
argmax; top-k keeps the k likeliest; top-p keeps the smallest set reaching p; draws follow the exact
softmax of logits / temperature (a chi-square over seeded draws); the repetition penalty is CTRL's;
a batch of rows samples each row as it would alone. Vocabularies span several of the draw's blocks
(sampling.BLOCK), with the likely tokens at the blocks' edges, where a block-wise search can slip."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np
import pytest

from gptport.errors import UsageError
from gptport.runtime.detok import TextStream
from gptport.runtime.sampling import BLOCK, Sampling, choose, choose_rows, logprob_entries, penalize
from gptport.tokenizer import BPETokenizer

LOGITS = np.array([0.1, 3.0, 2.9, -1.0, 0.5, 2.0], dtype=np.float32)
CHI2_DF5 = 25.7  # the chi-square distribution's 0.9999 quantile at 5 degrees of freedom (6 cells)


def softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def draws(logits: np.ndarray, s: Sampling, n: int, seen: Sequence[int] = (), seed: int = 0) -> np.ndarray:
    """n tokens drawn for one row of logits, from one seeded generator (batches of rows at once)."""
    rng, out = np.random.default_rng(seed), []
    for lo in range(0, n, 1000):
        k = min(1000, n - lo)
        out += choose_rows(np.broadcast_to(logits, (k, logits.size)), [(s, rng, [seen], None)] * k)
    return np.array(out)


def chi2(tokens: np.ndarray, cells: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's statistic of the draws over `cells` (which must hold every draw) against `probs`."""
    assert np.isin(tokens, cells).all(), f"drawn outside {cells}: {set(tokens.tolist()) - set(cells.tolist())}"
    counts = np.array([(tokens == c).sum() for c in cells])
    expected = probs * len(tokens)
    return float(((counts - expected) ** 2 / expected).sum())


def edge_logits(V: int = 2 * BLOCK + 100) -> tuple[np.ndarray, np.ndarray]:
    """Logits over V tokens whose mass sits on six tokens at the blocks' edges (the rest: e^-60 each)."""
    cells = np.array([0, BLOCK - 1, BLOCK, 2 * BLOCK - 1, 2 * BLOCK, V - 1])
    logits = np.full(V, -60.0, dtype=np.float32)
    logits[cells] = [1.0, 0.0, 2.0, -0.5, 1.5, 0.5]
    return logits, cells


def test_greedy_is_argmax() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(16, 3 * BLOCK + 5)).astype(np.float32)
    gen = np.random.default_rng(0)
    assert [choose(row, Sampling(), gen) for row in logits] == logits.argmax(-1).tolist()
    assert choose_rows(logits, [(Sampling(), gen, [()], None)] * 16) == logits.argmax(-1).tolist()
    # greedy with a repetition penalty: the argmax of the penalized logits, whose winner is not the raw one
    seen = [[int(logits[i].argmax())] for i in range(16)]
    want = [int(penalize(row, s, 1e3).argmax()) for row, s in zip(logits, seen, strict=True)]
    assert all(w != int(row.argmax()) for w, row in zip(want, logits, strict=True))
    s = Sampling(repetition_penalty=1e3)
    assert [choose(row, s, gen, seen=h) for row, h in zip(logits, seen, strict=True)] == want
    assert choose_rows(logits, [(s, gen, [h], None) for h in seen]) == want


@pytest.mark.parametrize("k", [1, 2, 7, 40])
def test_top_k_never_leaves_the_k_likeliest(k: int) -> None:
    logits = (np.random.default_rng(k).normal(size=3 * BLOCK + 17) * 2).astype(np.float32)
    likeliest = set(np.argsort(-logits)[:k].tolist())
    got = set(draws(logits, Sampling(temperature=3.0, top_k=k), 3000).tolist())
    assert got <= likeliest, f"outside the top {k}: {got - likeliest}"
    if k <= 7:  # flattened by the temperature, each of so few is drawn in 3000 tries: nothing more was cut
        assert got == likeliest


def top_p_logits() -> tuple[np.ndarray, list[int]]:
    """Probabilities 0.40, 0.25, 0.15, 0.10, 0.05 on five tokens in three blocks, in no order of id; the
    remaining 0.05 spread over every other token. Cumulative, likeliest first: 0.40 0.65 0.80 0.90 0.95."""
    V = 2 * BLOCK + 40
    ranked = [300, 7, 2 * BLOCK + 1, BLOCK - 1, BLOCK]  # likeliest first
    probs = np.full(V, 0.05 / (V - 5))
    probs[ranked] = [0.40, 0.25, 0.15, 0.10, 0.05]
    return np.log(probs).astype(np.float32), ranked


@pytest.mark.parametrize(("top_p", "kept"), [(0.3, 1), (0.5, 2), (0.7, 3), (0.85, 4), (0.93, 5)])
def test_top_p_keeps_exactly_the_smallest_set_reaching_p(top_p: float, kept: int) -> None:
    logits, ranked = top_p_logits()
    tokens = draws(logits, Sampling(temperature=1.0, top_p=top_p), 4000)
    assert set(tokens.tolist()) == set(ranked[:kept])
    want = softmax(logits)[ranked[:kept]]
    freq = np.array([(tokens == t).mean() for t in ranked[:kept]])
    assert np.abs(freq - want / want.sum()).max() < 0.03  # renormalized over the kept set (sd <= 0.008)
    # top-k first, then top-p over what it left, renormalized: 0.40 and 0.25 become 0.615 and 0.385
    both = draws(logits, Sampling(temperature=1.0, top_k=2, top_p=top_p), 2000)
    assert set(both.tolist()) == set(ranked[:1 if top_p <= 0.4 / 0.65 else 2])


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_draws_follow_the_softmax_of_logits_over_the_temperature(temperature: float) -> None:
    logits, cells = edge_logits()
    tokens = draws(logits, Sampling(temperature=temperature), 5000)
    assert chi2(tokens, cells, softmax(logits[cells] / temperature)) < CHI2_DF5
    for other in {0.5, 1.0, 2.0} - {temperature}:  # a measurably different distribution at another temperature
        assert chi2(tokens, cells, softmax(logits[cells] / other)) > 10 * CHI2_DF5


def test_repetition_penalty_is_ctrls() -> None:
    logits = np.array([2.0, -1.5, 0.0, 3.0, -0.25, 1.0, 0.5])
    before = logits.copy()
    out = penalize(logits, [0, 1, 2, 1, 4], 1.25)  # 1 seen twice: penalized once
    assert out.tolist() == [2.0 / 1.25, -1.5 * 1.25, 0.0, 3.0, -0.25 * 1.25, 1.0, 0.5]
    assert np.array_equal(logits, before)  # a copy: the caller's logits are untouched
    assert penalize(logits, [0, 3], 1.0).tolist() == before.tolist()
    assert penalize(logits, [], 2.0).tolist() == before.tolist()
    # the history is every sequence of the row (prompt, then generated tokens), all penalized
    s = Sampling(repetition_penalty=2.0)
    gen = np.random.default_rng(0)
    assert choose(LOGITS, s, gen, seen=[1]) == 2  # 3.0 -> 1.5: 2.9 wins
    assert choose_rows(LOGITS[None], [(s, gen, [[1], [2]], None)]) == [5]  # 2.9 -> 1.45 too: 2.0 wins
    # sampled: the draws follow the softmax of the penalized logits
    seen = [1, 2, 3]
    tokens = draws(LOGITS, Sampling(temperature=1.0, repetition_penalty=1.5), 5000, seen=seen)
    cells = np.arange(6)
    assert chi2(tokens, cells, softmax(penalize(LOGITS.astype(np.float64), seen, 1.5))) < CHI2_DF5
    assert chi2(tokens, cells, softmax(LOGITS)) > 10 * CHI2_DF5


MIXED = [Sampling(), Sampling(repetition_penalty=1.3), Sampling(temperature=0.8),
         Sampling(temperature=1.2, top_k=20), Sampling(temperature=1.0, top_p=0.9),
         Sampling(temperature=0.7, top_k=50, top_p=0.8, repetition_penalty=1.2), Sampling(temperature=1.5, seed=3),
         Sampling(temperature=1.0, top_p=0.5)]


def test_choose_rows_gives_each_row_what_choose_gives_it_alone() -> None:
    rng = np.random.default_rng(7)
    batch = [np.random.default_rng(s.seed + i) for i, s in enumerate(MIXED)]
    alone = [np.random.default_rng(s.seed + i) for i, s in enumerate(MIXED)]
    prompts = [rng.integers(0, 100, 5).tolist() for _ in MIXED]
    generated: list[list[int]] = [[] for _ in MIXED]
    off_argmax = np.zeros(len(MIXED), dtype=int)
    for _ in range(40):
        logits = (rng.normal(size=(len(MIXED), 3 * BLOCK + 9)) * 3).astype(np.float32)
        before = logits.copy()
        got = choose_rows(logits, [(s, g, (p, h), None) for s, g, p, h in zip(MIXED, batch, prompts, generated,
                                                                           strict=True)])
        assert np.array_equal(logits, before)  # the caller's logits are untouched
        want = [choose(logits[i], s, alone[i], seen=chain(prompts[i], generated[i])) for i, s in enumerate(MIXED)]
        assert got == want
        for h, t in zip(generated, got, strict=True):
            h.append(t)
        off_argmax += np.array(got) != logits.argmax(-1)
    assert off_argmax[0] == 0 and all(off_argmax[[i for i, s in enumerate(MIXED) if not s.greedy]] > 0)  # sampled


def test_logprob_entries() -> None:
    logits = (np.random.default_rng(0).normal(size=(3, 50)) * 4).astype(np.float32)
    z = logits.astype(np.float64)
    log_p = np.log(np.exp(z) / np.exp(z).sum(-1, keepdims=True))  # (3, 50)
    tokens = [4, 17, 49]
    entries = logprob_entries(logits, tokens, 5)
    for (tok, lp, top), row, want_tok in zip(entries, log_p, tokens, strict=True):
        assert tok == want_tok and lp == pytest.approx(row[want_tok], abs=1e-9)
        assert [t for t, _ in top] == np.argsort(-row)[:5].tolist()
        assert [v for _, v in top] == pytest.approx(np.sort(row)[::-1][:5].tolist(), abs=1e-9)
    assert [e[2] for e in logprob_entries(logits, tokens, 0)] == [[], [], []]
    assert [t for t, _ in logprob_entries(logits, tokens, 50)[0][2]] == np.argsort(-log_p[0]).tolist()


@pytest.mark.parametrize(("kwargs", "option"), [({"top_p": 0.0}, "--top-p"), ({"top_p": 1.5}, "--top-p"),
                                               ({"temperature": -0.1}, "--temperature"), ({"top_k": -1}, "--top-k"),
                                               ({"repetition_penalty": 0.0}, "--repetition-penalty")])
def test_bad_sampling_options(kwargs: dict[str, float], option: str) -> None:
    with pytest.raises(UsageError, match=option):
        Sampling(**kwargs)  # type: ignore[arg-type]


def test_stream_never_prints_a_broken_character(tok: BPETokenizer) -> None:
    text = "日本語 🙂 👨‍👩‍👧 naïve"
    ids = tok.encode(text)
    stream = TextStream(tok)
    pieces = [stream.push(i) for i in ids] + [stream.finish()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_stream_cuts_at_a_stop_string_and_never_prints_it(tok: BPETokenizer) -> None:
    text = "first line\nSTOP here\nnever"
    stream = TextStream(tok, stops=["STOP", "zzz"])
    printed = ""
    for i in tok.encode(text):
        printed += stream.push(i)
        if stream.stopped:
            break
    printed += stream.finish()
    assert stream.stopped and printed == "first line\n" == stream.text
