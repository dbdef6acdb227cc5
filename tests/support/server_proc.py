"""A server as a child process, for what drives one from outside (the benchmarks, the tests): a free port
on 127.0.0.1, the process started with its output in a log file, waited for until its health route
answers 200, and stopped by its pid (SIGTERM, then SIGKILL). Works for `gptport serve` and llama.cpp's
`llama-server` alike. Standard library only."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

HOST = "127.0.0.1"
LOG_TAIL = 2000  # characters of the server's log quoted when it fails to come up


class ServerStartError(RuntimeError):
    """A server that exited or did not answer its health route in time; the message quotes its log."""


def free_port(host: str = HOST) -> int:
    """A TCP port nobody listens on now (the kernel's pick; another process may take it before we do)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def url_of(port: int, host: str = HOST) -> str:
    return f"http://{host}:{port}"


def _tail(log: Path | None) -> str:
    if log is None or not log.is_file():
        return ""
    return ": " + log.read_text(errors="replace")[-LOG_TAIL:]


def wait_healthy(url: str, proc: subprocess.Popen[bytes], limit: float = 300.0, log: Path | None = None,
                 path: str = "/health") -> None:
    """Poll `url + path` until it answers 200; ServerStartError when `proc` exits first or `limit` seconds
    pass (quoting the end of `log`)."""
    deadline = time.monotonic() + limit
    while True:
        if proc.poll() is not None:
            raise ServerStartError(f"{proc.args[0] if isinstance(proc.args, list) else proc.args} exited with "
                                   f"{proc.returncode} before {url}{path} answered{_tail(log)}")
        try:
            with urllib.request.urlopen(url + path, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ServerStartError(f"{url}{path} did not answer 200 within {limit:g} s{_tail(log)}")
        time.sleep(0.1)


def start(cmd: Sequence[str], log: Path, env: dict[str, str] | None = None, append: bool = False
          ) -> subprocess.Popen[bytes]:
    """Start `cmd` with stdout and stderr written to `log` (its folder made; `append`: after what it holds);
    `env` adds to this process's environment."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab" if append else "wb") as out:
        return subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT,
                                env=None if env is None else {**os.environ, **env})


def stop(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """SIGTERM (a graceful shutdown) to a running process, SIGKILL when it has not exited within `timeout`."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def running(cmd: Sequence[str], url: str, log: Path, limit: float = 300.0, env: dict[str, str] | None = None,
            stop_timeout: float = 60.0, append: bool = False) -> Iterator[subprocess.Popen[bytes]]:
    """`cmd` started (serving at `url`, its output in `log`), healthy, yielded; stopped by its pid however
    the block ends."""
    proc = start(cmd, log, env, append)
    try:
        wait_healthy(url, proc, limit, log)
        yield proc
    finally:
        stop(proc, stop_timeout)
