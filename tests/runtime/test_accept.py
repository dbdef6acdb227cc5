"""The token-acceptance step (accept.py) without a model: what each token does to a sequence, the order of
precedence of the finish reasons, the end token kept or not, the penalties' counts, a constraint advanced
or refusing, and each reason's word in OpenAI's APIs."""

from __future__ import annotations

from collections import Counter

import pytest

from gptport.runtime.accept import Accepting, ConstraintRefused, FinishReason

END = 0


class Grammar:
    """A matcher that takes tokens in `allowed` and is finished once it has taken `length` of them."""

    def __init__(self, allowed: set[int], length: int) -> None:
        self.allowed, self.length, self.taken = allowed, length, 0
        self.error = ""

    def consume(self, tok: int) -> bool:
        if tok not in self.allowed:
            self.error = f"{tok} is not allowed"
            return False
        self.taken += 1
        return True

    @property
    def finished(self) -> bool:
        return self.taken >= self.length


def take(seq: Accepting, tokens: list[int]) -> list[FinishReason | None]:
    return [seq.accept(t) for t in tokens]


def test_tokens_are_recorded_and_counted_until_the_length() -> None:
    seq = Accepting(3, frozenset({END}), counts=Counter())
    assert take(seq, [5, 5, 7]) == [None, None, FinishReason.LENGTH]
    assert seq.new_ids == [5, 5, 7] and seq.counts == Counter({5: 2, 7: 1})


def test_an_end_token_ends_without_being_recorded_unless_kept() -> None:
    dropped = Accepting(8, frozenset({END, 1}), counts=Counter())
    assert take(dropped, [5, 1]) == [None, FinishReason.END]
    assert dropped.new_ids == [5] and dropped.counts == Counter({5: 1})
    kept = Accepting(8, frozenset({END}), counts=Counter(), keep_end=True)
    assert take(kept, [5, END]) == [None, FinishReason.END]
    assert kept.new_ids == [5, END] and kept.counts == Counter({5: 1, END: 1})


def test_no_end_ids_make_an_end_token_an_ordinary_one() -> None:
    seq = Accepting(2, frozenset())
    assert take(seq, [END, END]) == [None, FinishReason.LENGTH]


def test_the_stop_watcher_sees_every_token_but_end_ones_and_a_stop_wins_over_the_length() -> None:
    seen: list[int] = []

    def watch(tok: int) -> bool:
        seen.append(tok)
        return tok == 9

    seq = Accepting(2, frozenset({END}), stop=watch)
    assert take(seq, [4, 9]) == [None, FinishReason.STOP]
    assert seen == [4, 9]
    seen.clear()
    assert Accepting(5, frozenset({END}), stop=watch).accept(END) is FinishReason.END and seen == []


def test_a_complete_grammar_ends_after_a_stop_and_before_the_length() -> None:
    grammar = Grammar({1, 2, 3}, 2)
    assert take(Accepting(5, frozenset(), matcher=grammar), [1, 2]) == [None, FinishReason.GRAMMAR]  # type: ignore[arg-type]
    at_length = Accepting(2, frozenset(), matcher=Grammar({1, 2}, 2))  # type: ignore[arg-type]
    assert take(at_length, [1, 2]) == [None, FinishReason.GRAMMAR]
    stopped = Accepting(5, frozenset(), stop=lambda t: t == 2, matcher=Grammar({1, 2}, 2))  # type: ignore[arg-type]
    assert take(stopped, [1, 2]) == [None, FinishReason.STOP]


def test_a_refused_token_raises_naming_it_and_the_matchers_words() -> None:
    seq = Accepting(5, frozenset(), matcher=Grammar({1}, 3))  # type: ignore[arg-type]
    assert seq.accept(1) is None
    with pytest.raises(ConstraintRefused, match="the constraint refused token 4: 4 is not allowed"):
        seq.accept(4)


def test_each_reason_has_one_word_per_api() -> None:
    words = {r: r.openai for r in FinishReason}
    assert words == {FinishReason.END: "stop", FinishReason.STOP: "stop", FinishReason.GRAMMAR: "stop",
                     FinishReason.LENGTH: "length", FinishReason.CONTEXT: "length"}
    assert [r.value for r in FinishReason] == ["eot", "stop", "grammar", "length", "context"]
    assert FinishReason.END == "eot"  # the member is its word: `generate --json` and older callers compare strings
