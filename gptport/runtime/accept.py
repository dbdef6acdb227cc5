"""The one step that takes a sampled token into a sequence, and the reasons a sequence ends. generate(),
speculative decoding, the bench and the server's scheduler each choose tokens their own way (one row or
many, from logits, a burst or a verified draft) and hand each to `Accepting.accept`, which, in order:
notes an end id; records the token and the penalties' counts; feeds it to the stop-string watcher; advances
the constraint; and says why the sequence ends, if it does. No torch here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from gptport.errors import GptportError

if TYPE_CHECKING:  # llguidance loads only when a constraint is asked for
    from gptport.runtime.constraint import Matcher


class FinishReason(str, Enum):
    """Why a sequence ended; the value (the member is that string) is the word `gptport generate --json`
    prints."""

    END = "eot"  # an end token (specials.end_ids)
    STOP = "stop"  # a stop string
    GRAMMAR = "grammar"  # the constraint is complete
    LENGTH = "length"  # the most new tokens asked for
    CONTEXT = "context"  # the context is full and the caller stops there

    @property
    def openai(self) -> str:
        """The word OpenAI's chat and completions APIs use (`finish_reason`); the Responses API reads
        "length" as an incomplete response."""
        return "length" if self in (FinishReason.LENGTH, FinishReason.CONTEXT) else "stop"


class ConstraintRefused(GptportError):
    """The constraint refused a token that was sampled under its own mask (a matcher's bug, not the user's)."""


StopWatch = Callable[[int], bool]  # fed each accepted token (never an end token); True: a stop string completed


@dataclass
class Accepting:
    """One sequence's accepted tokens and what ends it: its end ids, its most new tokens, its stop-string
    watcher, its constraint. `keep_end`: the end token is recorded like any other (the server counts it
    in the usage; generate() leaves it out of the text)."""

    max_new: int
    ends: frozenset[int]
    new_ids: list[int] = field(default_factory=list)
    counts: Counter[int] | None = None  # the generated tokens' counts, where a frequency or presence penalty is on
    stop: StopWatch | None = None
    matcher: Matcher | None = None
    keep_end: bool = False

    def accept(self, tok: int) -> FinishReason | None:
        """Take `tok`; the reason the sequence ends with it (END, STOP, GRAMMAR, LENGTH, in that order of
        precedence), or None. Raises ConstraintRefused when the constraint refuses the token."""
        end = tok in self.ends
        if end and not self.keep_end:
            return FinishReason.END
        self.new_ids.append(tok)
        if self.counts is not None:
            self.counts[tok] += 1
        if end:
            return FinishReason.END
        stopped = self.stop is not None and self.stop(tok)
        if self.matcher is not None and not self.matcher.consume(tok):
            raise ConstraintRefused(f"the constraint refused token {tok}: {self.matcher.error}")
        if stopped:
            return FinishReason.STOP
        if self.matcher is not None and self.matcher.finished:
            return FinishReason.GRAMMAR
        if len(self.new_ids) >= self.max_new:
            return FinishReason.LENGTH
        return None
