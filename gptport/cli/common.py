"""What every command shares: the stderr console for status and tables, option aliases."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from gptport.errors import UsageError
from gptport.runtime.choice import DEFAULT_GRAPH, DEFAULT_RUN, GraphChoice, RunOptions

if TYPE_CHECKING:
    from gptport.runtime.loader import Opened
    from gptport.safetensors_stream import Written

# Status, progress and tables go to stderr; stdout carries only the payload (text, JSON).
# Not a terminal (CI logs, pipes): 160 columns rather than rich's 80, so that tables stay readable.
err = Console(stderr=True, highlight=False, soft_wrap=True,
              width=None if sys.stderr.isatty() else shutil.get_terminal_size((160, 24)).columns)


class EncodingErrors(str, Enum):
    strict = "strict"
    replace = "replace"


ModelDir = Annotated[Path, typer.Argument(help="Model directory.", show_default=False)]
Force = Annotated[bool, typer.Option("--force", help="Replace existing outputs.")]


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


@contextmanager
def write_progress(verb: str) -> Iterator[Callable[[Written], None]]:
    """A progress bar for a model.safetensors written tensor by tensor (safetensors_stream.Written): tensor k of n,
    bytes written of the whole; the bytes it needs said in a line when it starts."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn(verb), BarColumn(), MofNCompleteColumn(), TextColumn("tensors, {task.fields[bytes]}"),
                  TextColumn("{task.description}"), console=err, transient=True) as bar:
        task = bar.add_task("", total=None, bytes="")

        def update(w: Written) -> None:
            if w.done == 0:
                err.print(f"{verb} model.safetensors: {w.total} tensors, {human_bytes(w.bytes_total)}")
            bar.update(task, completed=w.done, total=w.total, description=w.name,
                       bytes=f"{human_bytes(w.bytes_done)} of {human_bytes(w.bytes_total)}")
        yield update


def open_engine(model_dir: Path, engine: str = "onnx", choice: GraphChoice = DEFAULT_GRAPH,
                run: RunOptions = DEFAULT_RUN,
                say: Callable[[str], None] = lambda m: None) -> Opened:
    """`--engine onnx`: the graph `choice` picks, run as `run` says (gptport.runtime.loader.open_model);
    `--engine torch`: the reference torch model (gptport.training.torch_engine, which needs the train
    extra). The choice is made here, above both stages, so that the runtime never imports the torch side."""
    if engine == "onnx":
        from gptport.runtime.loader import open_model

        return open_model(model_dir, choice, run, say=say)
    if engine != "torch":
        raise UsageError(f"--engine {engine!r} is unknown; choose onnx or torch")
    if choice.kv_dtype != "float32":
        raise UsageError(f"--engine torch --kv-dtype {choice.kv_dtype}: the torch engine's cache is float32")
    if choice.fmt != "onnx":
        raise UsageError(f"--engine torch --graph-format {choice.fmt}: the torch engine reads model.safetensors, "
                         "no graph")
    try:
        from gptport.training.torch_engine import open_torch
    except ImportError as e:
        raise UsageError(f"--engine torch needs PyTorch (pip install 'gptport[train]'): {e}") from e
    return open_torch(model_dir, run.provider, run.threads)
