"""The servers the serving benchmarks load: `gptport serve` and llama.cpp's `llama-server` as command lines
(PORT stands for the port, filled in at start), each started on a free port, loaded, stopped by its pid
(tests.support.server_proc), in rounds that alternate which server goes first."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.harness.run import Round, say
from tests.support import server_proc

T = TypeVar("T")
PORT = "PORT"


def gptport_serve(d: Path, *options: str, python: str = sys.executable) -> list[str]:
    """`gptport serve D --port PORT OPTIONS`."""
    return [python, "-m", "gptport.cli.main", "serve", str(d), "--port", PORT, *options]


def llama_server(binary: Path, d: Path, slots: int, threads: int, n_ctx: int, weights: str = "f32",
                 cache: str = "f16") -> list[str]:
    """llama-server on the directory's GGUF of `weights` (f32, q8_0), `slots` slots of n_ctx each, its keys
    and values in `cache` (f16, its default, or q8_0)."""
    return llama_server_on(binary, d / f"model.{weights}.gguf", slots, threads, n_ctx, cache)


def llama_server_on(binary: Path, gguf: Path, slots: int, threads: int, n_ctx: int, cache: str = "f16",
                    *options: str) -> list[str]:
    """llama-server on the file `gguf`, `slots` slots of n_ctx each, its keys and values in `cache`, and
    `options` (e.g. -fa on, -ub 512)."""
    return [str(binary), "-m", str(gguf), "--host", server_proc.HOST, "--port", PORT, "-np", str(slots), "-t",
            str(threads), "-c", str(slots * n_ctx), "--no-webui", "-ctk", cache, "-ctv", cache, *options]


def served(cmd: Sequence[str], log: Path, run: Callable[[str, subprocess.Popen[bytes]], T],
           limit: float = 300.0) -> T:
    """Start `cmd` on a free port (its output appended to `log`), wait until healthy, `run(url, process)`,
    stop it by its pid."""
    port = server_proc.free_port()
    url = server_proc.url_of(port)
    filled = [str(port) if a == PORT else a for a in cmd]
    with server_proc.running(filled, url, log, limit=limit, append=True) as proc:
        return run(url, proc)


def each_server(rnd: Round, servers: dict[str, list[str]], log: Callable[[str], Path],
                run: Callable[[str, Round], Any]) -> None:
    """Every server of `servers` in the round's order: started, `run(url, round)` into round.data[name],
    stopped; `log(name)` is its log file."""
    for name in rnd.order(list(servers)):
        say(f"   {name}")
        rnd.data[name] = served(servers[name], log(name), lambda url, _proc: run(url, rnd))


def log_name(name: str) -> str:
    """A server's name as a log file's name part."""
    return "".join(c if c.isalnum() or c in "-." else "_" for c in name)
