"""A README walk-through run as written (tests/export/test_gguf_smollm2.py, test_gguf_gemma3.py): the bash
block after a `<!-- walkthrough:NAME -->` marker, a command a line (continuations joined), split around its
`gptport serve` line; each command run in bash in a fresh directory; the served one started on a free port of
127.0.0.1 and stopped by its pid."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support import server_proc

README = Path(__file__).resolve().parents[2] / "README.md"
README_PORT = "8000"  # the port the README's commands name


def commands(marker: str) -> tuple[list[str], str, list[str]]:
    """The commands of the bash block after `marker`: those before `gptport serve`, that one, and those after."""
    text = README.read_text(encoding="utf-8")
    assert marker in text, f"README.md has no {marker} block"
    block = text.split(marker, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]
    serve = next(i for i, c in enumerate(lines) if c.startswith("gptport serve "))
    return lines[:serve], lines[serve], lines[serve + 1:]


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`command` in bash in `cwd`, this interpreter's scripts (gptport, pip) first on PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(["bash", "-c", command], cwd=cwd, env={**os.environ, "PATH": path}, capture_output=True,
                          text=True, check=False, timeout=3600)


def before_serve(marker: str, cwd: Path) -> dict[str, str]:
    """The commands before `gptport serve` run in `cwd`: each command's stderr by its second word (`import-gguf`,
    `export`, ...). Skipped, saying why, when pip cannot download a package (no network or no index)."""
    stderr = {}
    for command in commands(marker)[0]:
        r = shell(command, cwd)
        if r.returncode != 0 and command.startswith("pip download"):
            pytest.skip(f"{command}: pip could not download it: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
        assert r.returncode == 0, f"{command}: exit {r.returncode}: {r.stderr[-3000:]}"
        stderr[command.split()[1]] = r.stderr
    return stderr


@contextmanager
def served(serve: str, model: str, cwd: Path, log: Path) -> Iterator[int]:
    """The README's `gptport serve MODEL ... --port 8000 &` line run from `cwd` on a free port (yielded), until
    the block exits."""
    args = shlex.split(serve.removesuffix("&"))
    assert args[1:3] == ["serve", model] and args[-2:] == ["--port", README_PORT], serve
    port = server_proc.free_port()
    cmd = [sys.executable, "-m", "gptport.cli.main", "serve", str(cwd / model), *args[3:-1], str(port)]
    with server_proc.running(cmd, server_proc.url_of(port), log, limit=600):
        yield port


def after_serve(after: list[str], port: int, cwd: Path) -> list[str]:
    """Each command after the serve line, its `localhost:8000` made the served port: their stdouts."""
    outputs = []
    for command in after:
        r = shell(command.replace(f"localhost:{README_PORT}", f"127.0.0.1:{port}"), cwd)
        assert r.returncode == 0, f"{command}: exit {r.returncode}: {r.stderr[-3000:]}"
        outputs.append(r.stdout)
    return outputs
