"""The options every benchmark takes beside its own: where its results file goes and a label for it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.harness.results import RESULTS


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser whose --help shows the module's docstring, with --results and --label."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=RESULTS, help="the folder the results file is written to")
    ap.add_argument("--label", default="", help="a label in the results file's name, for a run kept beside "
                    "another of the same day and machine (e.g. busy)")
    return ap


def settings(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    """The run's options as a results file records them (--results left out; a path as a string, an absolute one
    by its name only: no path of the machine that ran it goes into the repository)."""
    out = {k: (v.name if v.is_absolute() else str(v)) if isinstance(v, Path) else v for k, v in vars(args).items()
           if k not in ("results", "label")}
    return out | extra
