"""A distillation corpus (`gptport distill-corpus`): the model's own continuations of prompts drawn at
random from a corpus. A draft model trained on this text learns to predict what the model predicts
(sequence-level knowledge distillation, Kim & Rush 2016), which is what speculative decoding needs of
it: the more of its drafts the model would have chosen itself, the more tokens stand per step.

Prompts start at a line start at a random byte offset of a random file (files weighted by size), so a
large corpus is sampled without being read whole. Each sample is written as prompt + continuation,
then a `<|endoftext|>` line: `gptport train` reads that literal as the end of a document.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TextIO

from gptport.corpus import Source
from gptport.errors import InputError, UsageError
from gptport.runtime.engine import Engine
from gptport.runtime.generate import generate
from gptport.runtime.sampling import Sampling
from gptport.specials import end_ids, start_ids
from gptport.tokenizer import EOT, BPETokenizer

READ_BYTES = 16 * 1024  # read at each drawn offset: enough for the longest prompt asked of a text file
ATTEMPTS = 20  # draws per prompt before a corpus is called too sparse


@dataclass
class DistillPlan:
    """What to generate: `prompts` samples, each `prompt_tokens` of corpus text continued by up to
    `new_tokens` of the model's (greedy unless `sampling` says otherwise), `batch` rows per step."""

    prompts: int = 2000
    prompt_tokens: int = 24
    new_tokens: int = 192
    batch: int = 32
    seed: int = 0
    sampling: Sampling = field(default_factory=Sampling)

    def check(self, n_ctx: int) -> None:
        for name, value in (("--prompts", self.prompts), ("--prompt-tokens", self.prompt_tokens),
                            ("--new-tokens", self.new_tokens), ("--batch", self.batch)):
            if value < 1:
                raise UsageError(f"{name} must be at least 1, not {value}")
        if self.prompt_tokens + self.new_tokens > n_ctx:
            raise UsageError(f"--prompt-tokens {self.prompt_tokens} + --new-tokens {self.new_tokens} exceed the "
                             f"model's n_ctx {n_ctx}")


@dataclass
class DistillStats:
    samples: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0
    seconds: float = 0.0

    @property
    def tok_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


def draw_prompts(sources: Sequence[Source], tok: BPETokenizer, count: int, prompt_tokens: int,
                 rng: random.Random) -> list[list[int]]:
    """`count` prompts of `prompt_tokens` token ids (fewer where a file ends first), each from the first
    line start after a random offset of a file drawn with probability proportional to its size."""
    files = [s for s in sources if s.path is not None and (s.size or 0) > 0]
    if any(s.path is None for s in sources):
        raise UsageError("distill-corpus draws prompts from random places in files; it cannot read stdin ('-')")
    if not files:
        raise InputError(f"{', '.join(s.name for s in sources)}: no text to draw prompts from (empty)")
    weights = [float(s.size or 0) for s in files]
    out: list[list[int]] = []
    for _ in range(count * ATTEMPTS):
        src = rng.choices(files, weights)[0]
        assert src.path is not None and src.size is not None
        offset = rng.randrange(src.size)
        with open(src.path, "rb") as f:
            f.seek(offset)
            data = f.read(READ_BYTES)
        if offset > 0:  # start at the next line: a prompt that begins mid-word teaches nothing
            cut = data.find(b"\n")
            data = data[cut + 1:] if cut >= 0 else b""
        ids = tok.encode(data.decode("utf-8", errors="ignore"))[:prompt_tokens]
        if ids:
            out.append(ids)
            if len(out) == count:
                return out
    raise InputError(f"{', '.join(s.name for s in files)}: found {len(out)} of {count} prompts in "
                     f"{count * ATTEMPTS} draws (too few line starts followed by text)")


def samples(engine: Engine, tok: BPETokenizer, prompts: Sequence[list[int]], plan: DistillPlan,
            stats: DistillStats) -> Iterator[str]:
    """Each prompt with the model's continuation, as text, `plan.batch` prompts per generate() call (each
    generated after the model's begin token where its tokenizer adds one, which the text leaves out)."""
    start = start_ids(engine.config)
    for lo in range(0, len(prompts), plan.batch):
        batch = prompts[lo:lo + plan.batch]
        t0 = time.perf_counter()
        # seeds differ per batch (generate seeds every row of a call alike), so sampled batches differ
        sampling = replace(plan.sampling, seed=plan.sampling.seed + lo)
        rows = generate(engine, [[*start, *p] for p in batch], plan.new_tokens, sampling, end_ids(engine.config, tok),
                        overflow="stop")
        stats.seconds += time.perf_counter() - t0
        for prompt, row in zip(batch, rows, strict=True):
            stats.samples += 1
            stats.prompt_tokens += len(prompt)
            stats.new_tokens += len(row.new_ids)
            yield tok.decode([*prompt, *row.new_ids])


def write_corpus(engine: Engine, tok: BPETokenizer, sources: Sequence[Source], plan: DistillPlan, out: TextIO,
                 progress: Callable[[DistillStats], None] = lambda s: None) -> DistillStats:
    """Draw the prompts, generate, and write every sample followed by an `<|endoftext|>` line."""
    plan.check(engine.n_ctx)
    prompts = draw_prompts(sources, tok, plan.prompts, plan.prompt_tokens, random.Random(plan.seed))
    stats = DistillStats()
    for text in samples(engine, tok, prompts, plan, stats):
        out.write(text.replace(EOT, "") + "\n" + EOT + "\n")  # an EOT inside the text would split a sample
        progress(stats)
    return stats
