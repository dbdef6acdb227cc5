"""One sequence for the scheduler to generate (scheduler.py): its prompt, how to continue it, and the
scheduler's state of it. No torch here."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
    prompt_lp: list[TokenLogprob] = field(default_factory=list)

    def start(self, tok: BPETokenizer) -> None:
        """Begin generating, once the choice holds a slot: a fresh generator from its seed, fresh counts
        where the frequency or presence penalty is on, and a text stream over its stop strings."""
        self.rng = np.random.default_rng(self.sampling.seed)
        self.counts = Counter() if self.sampling.penalized else None
        self.text_stream = TextStream(tok, self.stops)
