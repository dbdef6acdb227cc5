"""`gptport train-tokenizer`: train the byte-level BPE of a model directory."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from gptport import paths
from gptport import tokenizer as bpe
from gptport.cli.common import EncodingErrors, Force, err, human_bytes
from gptport.corpus import CorpusReader, resolve_sources

EXAMPLES = """Examples:

  gptport train-tokenizer corpus.txt --vocab-size 8192 --out models/mymodel

  gptport train-tokenizer texts/ --glob '*.md' --vocab-size 4096 --out models/docs --special-token '<|pad|>'

  cat a.txt b.txt | gptport train-tokenizer - --vocab-size 1024 --out models/small
"""


def train_tokenizer(
    corpus: Annotated[list[str], typer.Argument(
        help="Text files, directories (searched recursively with --glob), or '-' for stdin.",
        show_default=False)],
    vocab_size: Annotated[int, typer.Option("--vocab-size", help="Exact vocabulary size, special tokens "
                                            "and the 256 byte symbols included.")],
    out: Annotated[Path, typer.Option("--out", help="Model directory to write the tokenizer into.")],
    special_token: Annotated[list[str] | None, typer.Option(
        "--special-token", help="Extra special token (repeatable); <|endoftext|> is always one.")] = None,
    min_frequency: Annotated[int, typer.Option(help="Merge only pairs seen at least this often.")] = 2,
    glob: Annotated[str, typer.Option(help="Which files to take from directories.")] = "*.txt",
    encoding_errors: Annotated[EncodingErrors, typer.Option(
        help="strict: stop at the first byte that is not UTF-8; replace: substitute U+FFFD and count.")
    ] = EncodingErrors.strict,
    force: Force = False,
) -> None:
    """Train a byte-level BPE tokenizer on a corpus and write it into a model directory."""
    specials = bpe.special_token_list(special_token or [])
    bpe.check_vocab_size(vocab_size, len(specials))
    bpe.check_can_write(out, force)  # refuse before the (long) training, not after it
    reader = CorpusReader(resolve_sources(corpus, glob), encoding_errors.value)
    known = reader.known_bytes
    size = "stdin" if known is None else human_bytes(known)
    err.print(f"Training a {vocab_size}-token BPE on {len(reader.sources)} document(s) ({size}) …")
    tok, report = bpe.train(reader, vocab_size, specials[1:], min_frequency,
                            show_progress=sys.stderr.isatty())
    written = bpe.save(tok, out, report, force=force)
    if (out / paths.WEIGHTS).exists():
        err.print(f"[yellow]warning:[/] {out} holds a model trained with the previous tokenizer; "
                  "retrain it (`gptport train`) before exporting")
    _summary(report, tok, written)


def _summary(report: bpe.TrainReport, tok: bpe.BPETokenizer, written: list[Path]) -> None:
    mb_s = report.corpus_bytes / 1e6 / max(report.seconds, 1e-9)
    bpt = report.bytes_per_token
    compression = (f"{bpt:.2f} bytes/token on a held-out {human_bytes(report.heldout_bytes)}"
                   if bpt else "n/a (corpus too small to hold text out)")
    err.print(f"[green]done[/] in {report.seconds:.1f} s ({mb_s:.1f} MB/s)")
    err.print(f"  vocabulary   {report.vocab_size} tokens, special: "
              + ", ".join(f"{t}={i}" for t, i in tok.special_tokens.items()))
    err.print(f"  corpus       {report.documents} document(s), {human_bytes(report.corpus_bytes)}")
    if report.replaced_bytes:
        err.print(f"  [yellow]replaced[/]     {report.replaced_bytes} byte(s) that were not UTF-8 by U+FFFD")
    err.print(f"  compression  {compression}")
    err.print(f"  sha256       {tok.sha256}")
    err.print("  wrote        " + ", ".join(str(p) for p in written))
