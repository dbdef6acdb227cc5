"""What every command shares: the stderr console for status and tables, option aliases."""

from __future__ import annotations

import shutil
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

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
