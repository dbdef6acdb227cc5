"""`gptport distill-corpus`: the model's own continuations of corpus prompts, text to train a draft on."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gptport.cli import options as opt
from gptport.cli.common import Force, ModelDir, err, open_engine

EXAMPLES = """Examples:

  gptport distill-corpus models/mymodel corpus.txt --out models/draft-corpus.txt

  gptport train models/draft-corpus.txt --model-dir models/draft --preset tiny --tokenizer-from models/mymodel

  gptport generate models/mymodel "ROMEO:" --draft models/draft --draft-precision int8
"""


def distill_corpus(
    model_dir: ModelDir,
    corpus: Annotated[list[str], typer.Argument(help="Text files or directories to draw prompts from.",
                                                show_default=False)],
    out: Annotated[Path, typer.Option("--out", help="The text file to write (samples separated by "
                                      "<|endoftext|> lines).", show_default=False)],
    prompts: Annotated[int, typer.Option(help="Samples: prompts drawn from the corpus.")] = 2000,
    prompt_tokens: Annotated[int, typer.Option(help="Corpus tokens per prompt.")] = 24,
    new_tokens: Annotated[int | None, typer.Option(help="The model's tokens per sample, fewer when it ends "
                                                   "with <|endoftext|> (default: 192, or what n_ctx leaves "
                                                   "after the prompt).", show_default=False)] = None,
    batch: Annotated[int, typer.Option(help="Prompts generated together per step.")] = 32,
    temperature: Annotated[float, typer.Option(help="0 is greedy: what a draft for greedy decoding should "
                                               "learn.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seeds the prompts' draw (and sampling).")] = 0,
    precision: opt.DistillPrecision = "fp32",
    threads: opt.RuntimeThreads = 0,
    glob: Annotated[str, typer.Option(help="Which files to take from directories.")] = "*.txt",
    force: Force = False,
) -> None:
    """Write the model's continuations of prompts drawn at random from a corpus: train a draft model
    on them (`gptport train --tokenizer-from`) so that it drafts what the model would choose."""
    from gptport import atomic
    from gptport.corpus import resolve_sources
    from gptport.errors import InputError
    from gptport.runtime.distill import DistillPlan, DistillStats, write_corpus
    from gptport.runtime.sampling import Sampling

    if out.is_dir():
        raise InputError(f"--out {out}: is a directory; name a file")
    if out.exists() and not force:
        raise InputError(f"--out {out}: exists; pass --force to replace it")
    sources = resolve_sources(corpus, glob)
    opened = open_engine(model_dir, "onnx", opt.graph_choice(precision), opt.run_options("cpu", threads),
                         say=lambda m: err.print(f"[yellow]warning:[/] {m}"))
    n_ctx = opened.engine.n_ctx
    new = new_tokens if new_tokens is not None else max(1, min(192, n_ctx - prompt_tokens))
    plan = DistillPlan(prompts, prompt_tokens, new, batch, seed, Sampling(temperature, seed=seed))
    plan.check(n_ctx)
    out.parent.mkdir(parents=True, exist_ok=True)
    with err.status("drawing prompts") as status, atomic.atomic_path(out) as tmp, \
            open(tmp, "w", encoding="utf-8", newline="\n") as f:

        def progress(s: DistillStats) -> None:
            status.update(f"{s.samples:,}/{prompts:,} samples, {s.new_tokens:,} tokens, {s.tok_s:,.0f} tok/s")

        stats = write_corpus(opened.engine, opened.tok, sources, plan, f, progress)
        f.flush()
    err.print(f"wrote {out}: {stats.samples:,} samples, {stats.prompt_tokens:,} prompt and {stats.new_tokens:,} "
              f"generated tokens ({opened.precision}, {stats.tok_s:,.0f} tok/s)")

