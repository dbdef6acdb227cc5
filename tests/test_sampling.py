"""Sampling and streaming detokenization, in numpy alone."""

from __future__ import annotations

import numpy as np
import pytest

from gptport.detok import TextStream
from gptport.errors import UsageError
from gptport.sampling import Sampling, choose, penalize
from gptport.tokenizer import BPETokenizer

LOGITS = np.array([0.1, 3.0, 2.9, -1.0, 0.5, 2.0], dtype=np.float32)


def draws(s: Sampling, n: int = 400) -> set[int]:
    rng = np.random.default_rng(s.seed)
    return {choose(LOGITS, s, rng) for _ in range(n)}


def test_greedy_is_argmax() -> None:
    assert choose(LOGITS, Sampling(), np.random.default_rng(0)) == 1


def test_top_k_and_top_p_restrict_the_support() -> None:
    assert draws(Sampling(temperature=1.0, top_k=2)) == {1, 2}
    assert draws(Sampling(temperature=1.0, top_p=0.5)) == {1, 2}  # 3.0 and 2.9 hold > 50% together
    assert draws(Sampling(temperature=1.0, top_p=0.01)) == {1}
    assert len(draws(Sampling(temperature=5.0))) == 6


def test_same_seed_same_choices() -> None:
    s = Sampling(temperature=1.0, seed=42)
    a = [choose(LOGITS, s, np.random.default_rng(42)) for _ in range(1)]
    rng1, rng2 = np.random.default_rng(42), np.random.default_rng(42)
    assert [choose(LOGITS, s, rng1) for _ in range(50)] == [choose(LOGITS, s, rng2) for _ in range(50)]
    assert a[0] in range(6)


def test_repetition_penalty() -> None:
    out = penalize(LOGITS.astype(np.float64), [1, 3], 2.0)
    assert out[1] == pytest.approx(1.5) and out[3] == pytest.approx(-2.0) and out[2] == pytest.approx(2.9)
    assert choose(LOGITS, Sampling(repetition_penalty=2.0), np.random.default_rng(0), seen=[1]) == 2


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
