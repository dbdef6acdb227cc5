"""One sequence for the scheduler to generate (scheduler.py): its prompt, how to continue it, and the
scheduler's state of it. No torch here."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gptport.runtime.accept import Accepting
from gptport.runtime.constraint import Matcher
from gptport.runtime.detok import TextStream
from gptport.runtime.sampling import Sampling
from gptport.serve.engine.events import TokenLogprob
from gptport.tokenizer import BPETokenizer


@dataclass(eq=False)
class Choice:
    """One sequence to generate: a prompt and how to continue it. `out` is the caller's handle for its
    events; setting `cancelled` (from any thread) frees its slot at the next iteration."""

    prompt_ids: list[int]
    max_tokens: int
    sampling: Sampling = field(default_factory=Sampling)
    stops: Sequence[str] = ()
    logprobs: int | None = None  # top alternatives per token (0-20); None: no log-probabilities
    prompt_logprobs: bool = False
    ignore_eos: bool = False
    matcher: Matcher | None = None  # a constraint on the output (runtime/constraint.py)
    logit_bias: dict[int, float] | None = None  # added to these tokens' logits before sampling
    out: Any = None
    cancelled: bool = False
    # the scheduler's state
    slot: int = -1
    filled: int = 0
    new_ids: list[int] = field(default_factory=list)
    t_submit: float = 0.0
    t_last: float = 0.0
    cached: int = 0  # prompt positions taken from a kept or copied cache instead of prefilled
    twin: Choice | None = None  # a choice whose first `share` prompt positions this one copies (prefix.py)
    share: int = 0
    first_logits: np.ndarray | None = None  # the logits (1, V) its first token came from (prefix caching)
    rng: np.random.Generator | None = None  # its own generator, seeded by sampling.seed (from start)
    counts: Counter[int] | None = None  # its generated tokens' counts, where frequency/presence penalties are on
    text_stream: TextStream | None = None  # its tokens detokenized, stop strings held back (from start)
    taker: Accepting | None = None  # how each token is taken (accept.py; from start)
    fresh: str = ""  # text the stream let out since the last piece sent
    prompt_lp: list[TokenLogprob] = field(default_factory=list)

    def start(self, tok: BPETokenizer, ends: Collection[int]) -> None:
        """Begin generating, once the choice holds a slot: a fresh generator from its seed, fresh counts
        where the frequency or presence penalty is on, a text stream over its stop strings, and its
        Accepting (the end token counted in the usage; no end ids with ignore_eos)."""
        self.rng = np.random.default_rng(self.sampling.seed)
        self.counts = Counter() if self.sampling.penalized else None
        self.text_stream = TextStream(tok, self.stops)
        self.taker = Accepting(self.max_tokens, frozenset() if self.ignore_eos else frozenset(ends), self.new_ids,
                               self.counts, self._watch, self.matcher, keep_end=True)

    def _watch(self, token: int) -> bool:
        """The stop watcher: the token through the text stream; True once a stop string completed."""
        stream = self.text_stream
        assert stream is not None  # from start
        self.fresh += stream.push(token)
        return stream.stopped

    def take_text(self) -> str:
        """The text let out since the last call."""
        text, self.fresh = self.fresh, ""
        return text
