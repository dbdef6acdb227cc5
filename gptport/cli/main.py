"""Wiring: the Typer app, its commands, `--version`, and the one error boundary of the CLI."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand

from gptport import __version__
from gptport.cli import (
    bench_cmd,
    bench_serve_cmd,
    demo_cmd,
    distill_cmd,
    eval_cmd,
    export_cmd,
    generate_cmd,
    gguf_cmd,
    hf_cmd,
    providers_cmd,
    serve_cmd,
    tokenizer_cmd,
    train_cmd,
    web_cmd,
)
from gptport.errors import GptportError


def verbatim(text: str) -> str:
    """Help text whose paragraphs click prints as written ("\\b" before each): example commands keep their
    lines rather than being rewrapped into one another at the terminal's width."""
    return "\n\n".join(f"\b\n{paragraph}" for paragraph in text.split("\n\n"))


class ExamplesAsWritten(TyperCommand):
    """A command whose epilog, its examples, --help prints as written (the epilog itself stays plain text,
    as the documentation's CLI reference reads it)."""

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        if self.epilog:
            formatter.write_paragraph()
            with formatter.indentation():
                formatter.write_text(verbatim(self.epilog))


# Click's own help layout, not Rich's panels (rich_markup_mode=None): at 80 columns Rich's options table
# cut option names short (--no-prefix-cac…) and squeezed the help into a column of 17 characters, and it
# read brackets in help texts as markup ('gptport[ray]' lost '[ray]'). Click puts a long option on a line
# of its own and wraps the help at the terminal's width.
app = typer.Typer(
    name="gptport",
    help="From a raw text corpus to a portable, fast ONNX GPT.\n\n"
    + verbatim("Example:\n\n  gptport train-tokenizer corpus.txt --vocab-size 8192 --out models/mymodel"),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gptport {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """From a raw text corpus to a portable, fast ONNX GPT."""


app.command("train-tokenizer", epilog=tokenizer_cmd.EXAMPLES, cls=ExamplesAsWritten)(tokenizer_cmd.train_tokenizer)
app.command("train", epilog=train_cmd.EXAMPLES, cls=ExamplesAsWritten)(train_cmd.train)
app.command("export", epilog=export_cmd.EXAMPLES, cls=ExamplesAsWritten)(export_cmd.export)
app.command("generate", epilog=generate_cmd.EXAMPLES, cls=ExamplesAsWritten)(generate_cmd.generate)
app.command("providers", epilog=providers_cmd.EXAMPLES, cls=ExamplesAsWritten)(providers_cmd.providers)
app.command("bench", epilog=bench_cmd.EXAMPLES, cls=ExamplesAsWritten)(bench_cmd.bench)
app.command("serve", epilog=serve_cmd.EXAMPLES, cls=ExamplesAsWritten)(serve_cmd.serve)
app.command("bench-serve", epilog=bench_serve_cmd.EXAMPLES, cls=ExamplesAsWritten)(bench_serve_cmd.bench_serve)
app.command("eval", epilog=eval_cmd.EXAMPLES, cls=ExamplesAsWritten)(eval_cmd.eval_)
app.command("demo", epilog=demo_cmd.EXAMPLES, cls=ExamplesAsWritten)(demo_cmd.demo)
app.command("export-hf", epilog=hf_cmd.EXPORT_EXAMPLES, cls=ExamplesAsWritten)(hf_cmd.export_hf)
app.command("import-hf", epilog=hf_cmd.IMPORT_EXAMPLES, cls=ExamplesAsWritten)(hf_cmd.import_hf)
app.command("export-gguf", epilog=gguf_cmd.EXAMPLES, cls=ExamplesAsWritten)(gguf_cmd.export_gguf)
app.command("import-gguf", epilog=gguf_cmd.IMPORT_EXAMPLES, cls=ExamplesAsWritten)(gguf_cmd.import_gguf)
app.command("export-web", epilog=web_cmd.EXAMPLES, cls=ExamplesAsWritten)(web_cmd.export_web)
app.command("distill-corpus", epilog=distill_cmd.EXAMPLES, cls=ExamplesAsWritten)(distill_cmd.distill_corpus)


def main(argv: list[str] | None = None) -> None:
    """Entry point. Typer reports usage errors itself (exit 2); a GptportError becomes one line on
    stderr and its exit code; GPTPORT_DEBUG=1 shows the traceback instead."""
    try:
        app(args=argv, prog_name="gptport")
    except GptportError as e:
        _fail(f"error: {e}", e.exit_code, e)
    except KeyboardInterrupt as e:
        _fail("interrupted", 130, e)
    except OSError as e:  # disk full, permission denied, ...: the OS's message names the file
        _fail(f"error: {e}", 1, e)


def _fail(message: str, code: int, exc: BaseException) -> NoReturn:
    if os.environ.get("GPTPORT_DEBUG") == "1":
        raise exc
    print(f"gptport: {message}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
