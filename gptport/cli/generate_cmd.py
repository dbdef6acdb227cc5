"""`gptport generate`: text from a model directory, on onnxruntime (no torch) or on the torch model."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, cast

import typer

from gptport.cli import options as opt
from gptport.cli.common import ModelDir, err, open_engine
from gptport.runtime.accept import FinishReason

EXAMPLES = """Examples:

  gptport generate models/mymodel "To be or not"

  gptport generate models/mymodel "ROMEO:" --temperature 0.8 --top-p 0.95 --seed 7 --max-new-tokens 200

  gptport generate models/mymodel "ROMEO:" --temperature 0.8 --min-p 0.05 --presence-penalty 0.5

  gptport generate models/mymodel --file prompts.txt --precision int8 --json

  gptport generate models/mymodel "Hello" --provider cuda --fallback

  gptport generate models/mymodel "A person:" --json-schema person.schema.json --temperature 0.7

  gptport generate models/mymodel "Date:" --regex "[0-9]{4}-[0-9]{2}-[0-9]{2}"

  gptport generate models/mymodel "ROMEO:" --draft models/draft --max-new-tokens 256
"""


class Overflow(str, Enum):
    slide = "slide"
    stop = "stop"


def generate(
    model_dir: ModelDir,
    prompt: Annotated[list[str] | None, typer.Argument(help="Prompt(s); several run as one batch.",
                                                       show_default=False)] = None,
    file: Annotated[Path | None, typer.Option("--file", help="Prompts, one per line.")] = None,
    provider: opt.Provider = "cpu",
    precision: opt.Precision = "fp32",
    engine: Annotated[str, typer.Option(help="onnx, or torch (the reference; needs the train extra).")] = "onnx",
    graph_format: opt.GraphFormat = "onnx",
    kv_cache: opt.KvCache = "auto",
    kv_dtype: opt.KvDtype = "float32",
    max_new_tokens: Annotated[int, typer.Option(help="New tokens per prompt, at most.")] = 64,
    temperature: Annotated[float, typer.Option(help="0 is greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option(help="Sample from the k likeliest tokens (0: off).")] = 0,
    top_p: Annotated[float, typer.Option(help="Sample from the smallest set of probability p (1: off).")] = 1.0,
    repetition_penalty: Annotated[float, typer.Option(help="> 1 discourages repeats (1: off).")] = 1.0,
    presence_penalty: Annotated[float, typer.Option(help="-2..2, subtracted once from the logit of each token "
                                                    "generated so far, as OpenAI's (0: off).")] = 0.0,
    frequency_penalty: Annotated[float, typer.Option(help="-2..2, subtracted from a token's logit once per time it "
                                                     "was generated, as OpenAI's (0: off).")] = 0.0,
    min_p: Annotated[float, typer.Option(help="0..1: after temperature, drop tokens less likely than min-p times the "
                                         "likeliest (0: off).")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the sampling.")] = 0,
    stop: Annotated[list[str] | None, typer.Option("--stop", help="Stop at this text (repeatable).")] = None,
    threads: opt.Threads = 0,
    context_overflow: Annotated[Overflow, typer.Option(
        help="At n_ctx: slide (re-prefill the last half window and go on) or stop.")] = Overflow.slide,
    fallback: opt.Fallback = False,
    no_truncate: Annotated[bool, typer.Option("--no-truncate", help="Refuse a prompt longer than n_ctx "
                                              "instead of keeping its last n_ctx tokens.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per prompt on stdout.")] = False,
    json_schema: Annotated[Path | None, typer.Option("--json-schema", help="Constrain the output to JSON valid "
                                                     "under this JSON schema file.")] = None,
    regex: Annotated[str | None, typer.Option("--regex", help="Constrain the output to match this regular "
                                              "expression (Rust regex syntax).")] = None,
    grammar: Annotated[Path | None, typer.Option("--grammar", help="Constrain the output to this grammar file "
                                                 "(Lark, or llama.cpp's GBNF).")] = None,
    draft: opt.Draft = None,
    draft_tokens: opt.DraftTokens = None,
    prompt_lookup: Annotated[int | None, typer.Option("--prompt-lookup", help="Speculative decoding without a "
                                                      "draft model: copy drafts from the latest earlier match of "
                                                      "the last N tokens (N-grams down to 2).")] = None,
    draft_precision: opt.DraftPrecision = None,
    draft_threads: opt.DraftThreads = None,
    bursts: Annotated[int, typer.Option("--bursts", help="--provider cuda with export --cuda's graphs, greedy "
                                        "only: decode steps per run (each step's argmax feeds the next on the "
                                        "GPU). Its session takes seconds to make: for long outputs. 0: off.")] = 0,
) -> None:
    """Generate text: one prefill, then one token per step through the KV cache."""
    from gptport.errors import UsageError
    from gptport.runtime.detok import TextStream
    from gptport.runtime.generate import generate as run
    from gptport.runtime.loader import encode_prompts, read_prompt_file
    from gptport.runtime.sampling import Sampling
    from gptport.specials import end_ids

    sampling = Sampling(temperature, top_k, top_p, repetition_penalty, seed, presence_penalty, frequency_penalty,
                        min_p)
    if max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be at least 1, not {max_new_tokens}")
    texts = list(prompt or []) + (read_prompt_file(file) if file else [])
    warn = lambda msg: err.print(f"[yellow]warning:[/] {msg}")  # noqa: E731
    # with a draft model two sessions take turns: workers that spin on after their step (onnxruntime's
    # default) would hold the cores the other session's step needs (--draft ran at half speed)
    spin = "step" if draft is not None else "always"
    opened = open_engine(model_dir, engine, opt.graph_choice(precision, kv_cache, kv_dtype, graph_format),
                         opt.run_options(provider, threads, spin, fallback), say=warn)
    if bursts:
        check_bursts(bursts, opened.engine, opened.provider, sampling.plain, (json_schema, regex, grammar),
                     (draft, prompt_lookup))
        from gptport.runtime.engine import Bursting

        cast(Bursting, opened.engine).bursts = bursts  # Capability.BURST (check_bursts)
    ids = encode_prompts(opened.tok, texts, opened.engine.n_ctx, truncate=not no_truncate, warn=warn,
                         config=opened.engine.config)
    ends = end_ids(opened.engine.config, opened.tok)
    streams = [TextStream(opened.tok, stop or []) for _ in ids]
    live = len(ids) == 1 and not as_json

    def on_token(row: int, token: int) -> bool:
        text = streams[row].push(token)
        if live and text:
            sys.stdout.write(text)
            sys.stdout.flush()
        return streams[row].stopped

    matchers = None
    spec = constraint_spec(json_schema, regex, grammar)
    drafter = open_drafter(opened, model_dir, draft, draft_tokens, prompt_lookup, spec is not None,
                           draft_threads, draft_precision)
    if spec is not None:
        from gptport.runtime.constraint import Grammars

        grammars = Grammars(opened.tok.json, opened.engine.config.vocab_size, opened.tok.eot_id)
        compiled = grammars.compile(spec)
        matchers = [grammars.matcher(compiled, spec.json_like) for _ in ids]
    stats = None
    if drafter is None:
        results = run(opened.engine, ids, max_new_tokens, sampling, ends,
                      overflow=context_overflow.value, on_token=on_token, matchers=matchers)
    else:  # one prompt at a time: drafts are verified at batch 1
        from gptport.runtime.speculative import SpecStats, speculate

        stats = SpecStats()
        results = []
        for i, p in enumerate(ids):
            results.append(speculate(opened.engine, drafter(), p, max_new_tokens, sampling, ends,
                                     context_overflow.value, lambda _, t, i=i: on_token(i, t), draft_tokens, stats))
    for i, (res, stream) in enumerate(zip(results, streams, strict=True)):
        tail = stream.finish()
        if as_json:
            print(json.dumps({"prompt": texts[i], "text": stream.text, "token_ids": res.new_ids,
                              "prompt_tokens": len(res.prompt_ids), "finish_reason": res.finish_reason.value,
                              "prefill_ms": round(res.prefill_ms, 3), "decode_tok_s": round(res.decode_tok_s, 2),
                              "engine": opened.engine_name, "provider": opened.provider,
                              "precision": opened.precision, "kv_cache": opened.cache, "kv_dtype": kv_dtype,
                              **({} if stats is None else {"drafted": stats.drafted, "accepted": stats.accepted})},
                             ensure_ascii=False))
        elif live:
            sys.stdout.write(tail + "\n")
        else:
            err.print(f"[bold]── prompt {i + 1}:[/] {texts[i]!r}")
            sys.stdout.write(stream.text + "\n")
        if res.finish_reason is FinishReason.LENGTH and spec is not None:
            err.print(f"prompt {i + 1}: --max-new-tokens {max_new_tokens} ended the output before the constraint "
                      "was complete")
        if res.finish_reason is FinishReason.CONTEXT:
            err.print(f"prompt {i + 1}: stopped at the model's context of {opened.engine.n_ctx} tokens "
                      "(--context-overflow slide goes on)")
    sys.stdout.flush()
    r = results[0]
    graph = f" {opened.cache} cache" + (f" ({kv_dtype})" if kv_dtype != "float32" else "") \
        if opened.engine_name == "onnx" else ""
    err.print(f"[dim]{opened.engine_name} {opened.provider} {opened.precision}{graph}: prefill {r.prefill_ms:.1f} ms, "
              f"decode {r.decode_tok_s:,.1f} tok/s per row, batch {len(results)}[/]")
    if stats is not None:
        source = f"draft model, {draft_precision or opened.precision}" if draft is not None else "prompt lookup"
        err.print(f"[dim]drafts ({source}): {stats.drafted} drafted, {stats.accepted} accepted "
                  f"({stats.acceptance:.0%}), {stats.tokens_per_step:.2f} tokens per step[/]")


def check_bursts(bursts: int, engine: Any, provider: str, greedy: bool, constraints: tuple[Any, ...],
                 drafts: tuple[Any, ...]) -> None:
    """Refuse --bursts where generate could not burst: a size of 1 or below 0, an engine other than
    export --cuda's graphs on CUDA, sampling, a constraint, speculative decoding."""
    from gptport.errors import UsageError
    from gptport.runtime.burst import check_burst_size
    from gptport.runtime.burst import refusal as burst_refusal

    check_burst_size(bursts)
    why = burst_refusal(engine, provider)
    if why:
        raise UsageError(why)
    if not greedy:
        raise UsageError("--bursts: bursts choose each token by argmax on the GPU; sampling options (temperature, "
                         "top-k, top-p, min-p, penalties) need one step a run")
    if any(c is not None for c in constraints):
        raise UsageError("--bursts: a constraint (--json-schema, --regex, --grammar) masks each step on the host")
    if any(d is not None for d in drafts):
        raise UsageError("--bursts: speculative decoding (--draft, --prompt-lookup) verifies a step at a time")


def open_drafter(opened: Any, model_dir: Path, draft: Path | None, draft_tokens: int | None,
                 prompt_lookup: int | None, constrained: bool, draft_threads: int | None,
                 draft_precision: str | None = None
                 ) -> Any:
    """A function making a fresh drafter per prompt (--draft or --prompt-lookup), or None."""
    from gptport.errors import UsageError
    from gptport.runtime import speculative

    if draft is not None and prompt_lookup is not None:
        raise UsageError("--draft and --prompt-lookup: one way of drafting at a time")
    if draft_precision is not None and draft is None:
        raise UsageError("--draft-precision needs --draft")
    speculative.check_draft_threads(draft_threads, draft)
    if draft is None and prompt_lookup is None:
        if draft_tokens is not None:
            raise UsageError("--draft-tokens needs --draft or --prompt-lookup")
        return None
    if draft_tokens is not None and draft_tokens < 1:
        raise UsageError(f"--draft-tokens must be at least 1, not {draft_tokens}")
    if constrained:
        raise UsageError("--draft/--prompt-lookup with an output constraint (--json-schema, --regex, --grammar) "
                         "is not supported: drafting verifies unconstrained tokens")
    speculative.static_model(opened.engine, "--draft" if draft is not None else "--prompt-lookup")
    if prompt_lookup is not None:
        if prompt_lookup < speculative.LOOKUP_MIN:
            raise UsageError(f"--prompt-lookup must be at least {speculative.LOOKUP_MIN} (tokens matched), "
                             f"not {prompt_lookup}")
        return lambda: speculative.LookupDrafter(prompt_lookup)
    from gptport.runtime.choice import GraphChoice, RunOptions, Spin
    from gptport.runtime.loader import open_model

    assert draft is not None
    small = open_model(draft, GraphChoice.parse(draft_precision or opened.precision),
                       RunOptions(opened.provider, speculative.draft_threads(draft_threads), Spin.STEP))
    speculative.check_tokenizers(model_dir, opened.tok.sha256, draft, small.tok.sha256)
    return lambda: speculative.ModelDrafter(small.engine)


def constraint_spec(json_schema: Path | None, regex: str | None, grammar: Path | None) -> Any:
    """The one output constraint the options ask for (runtime.constraint.Spec), or None."""
    from gptport.errors import UsageError
    from gptport.runtime.constraint import Spec

    given = [(n, v) for n, v in (("--json-schema", json_schema), ("--regex", regex), ("--grammar", grammar))
             if v is not None]
    if len(given) > 1:
        raise UsageError(f"{given[0][0]} and {given[1][0]}: one output constraint at a time")
    if not given:
        return None
    name, value = given[0]
    if name == "--regex":
        return Spec("regex", value, f"--regex {value!r}")
    try:
        text = Path(value).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{name} {value}: cannot read it ({e})") from e
    return Spec("json_schema" if name == "--json-schema" else "grammar", text, f"{name} {value}")
