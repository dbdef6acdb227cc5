"""TextStream with many stop strings: it stops at the first token that completes one, cuts where the
earliest stop completed by then starts, and prints nothing of it (checked against a direct search)."""

from __future__ import annotations

import random

import pytest

from gptport.runtime.detok import TextStream
from gptport.tokenizer import BPETokenizer

TEXT = "alpha beta gamma\ndelta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau"


def streamed(tok: BPETokenizer, stops: list[str]) -> tuple[str, bool]:
    stream = TextStream(tok, stops)
    printed = ""
    for i in tok.encode(TEXT):
        printed += stream.push(i)
        if stream.stopped:
            break
    return printed + stream.finish(), stream.stopped


@pytest.mark.parametrize("seed", range(20))
def test_many_stops_cut_at_the_earliest(tok: BPETokenizer, seed: int) -> None:
    rng = random.Random(seed)
    stops = []
    for _ in range(rng.randrange(1, 300)):  # pieces of the text (some overlap others) and strings it lacks
        a = rng.randrange(len(TEXT))
        piece = TEXT[a:a + rng.randrange(1, 12)]
        stops.append(piece if rng.random() < 0.1 else piece + "#")
    expected = TEXT
    ends = [len(tok.decode(tok.encode(TEXT)[:k])) for k in range(1, len(tok.encode(TEXT)) + 1)]
    for end in ends:  # the text decoded after each token
        hits = [at for s in stops if 0 <= (at := TEXT.find(s)) <= end - len(s)]
        if hits:
            expected = TEXT[:min(hits)]
            break
    assert streamed(tok, stops) == (expected, expected != TEXT)


def test_a_stop_spanning_tokens_and_one_inside_another(tok: BPETokenizer) -> None:
    assert streamed(tok, [f"zz{i}" for i in range(255)] + ["ma\ndel"]) == ("alpha beta gam", True)
    assert streamed(tok, ["epsilon zeta", "on z", "silo"]) == ("alpha beta gamma\ndelta ep", True)  # silo first
    assert streamed(tok, ["tau#", "x" * 300]) == (TEXT, False)
