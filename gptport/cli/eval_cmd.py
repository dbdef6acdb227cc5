"""`gptport eval`: perplexity and bits per byte of held-out text."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer

from gptport.cli import options as opt
from gptport.cli.common import EncodingErrors, ModelDir, err, open_engine

EXAMPLES = """Examples:

  gptport eval models/mymodel heldout.txt

  gptport eval models/mymodel heldout.txt --precision int8 --stride 128 --json

  gptport eval models/mymodel heldout.txt --engine torch

  gptport eval models/mymodel sample.txt --json --tokens
"""


def eval_(
    model_dir: ModelDir,
    text: Annotated[list[str], typer.Argument(help="Text files or directories (or '-' for stdin).",
                                              show_default=False)],
    engine: Annotated[str, typer.Option(help="onnx, or torch (needs the train extra).")] = "onnx",
    provider: opt.Provider = "cpu",
    precision: opt.Precisions = "fp32",
    graph_format: opt.GraphFormat = "onnx",
    kv_dtype: opt.KvDtype = "float32",
    stride: Annotated[int | None, typer.Option(help="Window step in tokens (default n_ctx / 2).")] = None,
    threads: opt.RuntimeThreads = 0,
    glob: Annotated[str, typer.Option(help="Which files to take from directories.")] = "*.txt",
    encoding_errors: Annotated[EncodingErrors, typer.Option(help="strict or replace.")] = EncodingErrors.strict,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")] = False,
    tokens: Annotated[bool, typer.Option("--tokens", help="With --json: add each scored token's id, text and "
                                         "log-probability (natural log) as `token_logprobs`.")] = False,
) -> None:
    """Perplexity and bits per byte of text, over a sliding window of n_ctx tokens."""
    from gptport.corpus import CorpusReader, resolve_sources
    from gptport.errors import UsageError
    from gptport.runtime.evaluate import evaluate

    if tokens and not as_json:
        raise UsageError("--tokens needs --json (the per-token log-probabilities are printed as JSON)")

    reader = CorpusReader(resolve_sources(text, glob), encoding_errors.value)
    body = "".join(reader.chunks())
    precisions = [p.strip() for p in precision.split(",") if p.strip()] if engine == "onnx" else ["fp32"]
    for one in precisions:
        opened = open_engine(model_dir, engine, opt.graph_choice(one, "auto", kv_dtype, graph_format),
                             opt.run_options(provider, threads), say=lambda m: err.print(f"[yellow]warning:[/] {m}"))
        with err.status(f"evaluating {engine} {one}") as status:

            def progress(done: int, total: int, label: str = one) -> None:
                status.update(f"evaluating {label}: {done:,}/{total:,} tokens")

            result = evaluate(opened.engine, opened.tok, body, stride, progress=progress, per_token=tokens)
        summary = {k: v for k, v in asdict(result).items() if k not in ("token_ids", "token_logprobs")}
        payload = {**summary, "engine": opened.engine_name, "provider": opened.provider,
                   "precision": opened.precision, "kv_dtype": kv_dtype,
                   "stride": opened.engine.n_ctx // 2 if stride is None else stride,
                   "sources": [s.name for s in reader.sources]}
        if tokens:
            payload["token_logprobs"] = [{"id": t, "text": opened.tok.decode([t]), "logprob": lp}
                                 for t, lp in zip(result.token_ids, result.token_logprobs, strict=True)]
        if as_json:
            print(json.dumps(payload))
        else:
            kv = f" ({kv_dtype} KV cache)" if kv_dtype != "float32" else ""
            print(f"{opened.engine_name} {opened.provider} {opened.precision}{kv}: perplexity {result.perplexity:.4f}  "
                  f"bits/byte {result.bits_per_byte:.4f}  ({result.tokens:,} tokens, {result.bytes:,} bytes, "
                  f"{result.windows} windows)")
