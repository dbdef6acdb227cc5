"""Running the `gptport` CLI as a user would (a subprocess) and checking its one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys


def gptport(*args: str, stdin: str | None = None, debug: bool = False,
            columns: int | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a subprocess, as a user would (in a terminal `columns` wide, when given)."""
    # the test runner's own terminal size is not the user's (pytest-xdist's workers set COLUMNS=80): output
    # goes to a pipe, as when a user redirects it, unless `columns` says otherwise
    env = {k: v for k, v in os.environ.items() if k not in ("GPTPORT_DEBUG", "COLUMNS", "LINES")}
    if debug:
        env["GPTPORT_DEBUG"] = "1"
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "gptport.cli.main", *args], input=stdin,
                          capture_output=True, env=env, check=False, text=True, encoding="utf-8")


def assert_one_line_error(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """The run exited `code` with no traceback, its last stderr line `gptport: error: ...` holding every needle."""
    assert r.returncode == code
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("gptport: error: ")
    assert "Traceback" not in r.stderr
    for needle in needles:
        assert needle in lines[-1]
