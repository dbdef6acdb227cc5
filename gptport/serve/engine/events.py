"""What the scheduler hands out (events per choice) and reports as it goes (an Observer): the types the
response writers, the metrics and the scheduler share. No torch here."""

from __future__ import annotations

from dataclasses import dataclass

TokenLogprob = tuple[int, float | None, list[tuple[int, float]]]  # token, its log-probability, the top alternatives


@dataclass
class Piece:
    """Text that is safe to send now, and the log-probabilities of the tokens it came from."""

    text: str
    logprobs: list[TokenLogprob] | None = None


@dataclass
class PromptLogprobs:
    """echo with logprobs: each prompt token's log-probability (None for the first: nothing predicts it)."""

    entries: list[TokenLogprob]


@dataclass
class Finish:
    reason: str  # stop | length: accept.FinishReason.openai, the words every API's writer starts from
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt positions reused from a kept or copied cache (not prefilled)


@dataclass
class Failure:
    message: str


Event = Piece | PromptLogprobs | Finish | Failure


class Observer:
    """What the scheduler reports as it goes; the server's metrics override these."""

    def admitted(self, seconds: float) -> None:
        """A choice took a slot, `seconds` after it arrived."""

    def first_token(self, seconds: float) -> None: ...

    def next_token(self, seconds: float) -> None: ...

    def tokens(self, prompt: int, generated: int) -> None: ...

    def cached(self, prompt: int) -> None:
        """Prompt tokens taken from a kept cache instead of prefilled."""

    def phase(self, name: str, seconds: float) -> None: ...

    def drafts(self, drafted: int, accepted: int) -> None: ...
