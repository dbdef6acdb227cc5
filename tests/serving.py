"""Starting and stopping `gptport serve` in tests: 127.0.0.1, a free port, stopped by pid."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """A running server: its process, base URL and a captured stderr file."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        return request(self.url + path, None, headers)

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        return request(self.url + path, body, headers)

    def metric(self, name: str) -> float:
        """A metric's value from /metrics (summed over its label sets)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name) and (line[len(name)] in " {"))


def request(url: str, body: Any = None, headers: dict[str, str] | None = None, timeout: float = 60
            ) -> tuple[int, Any]:
    """(status, parsed JSON or text) of a GET, or a POST of `body` (bytes are sent as they are)."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


@contextmanager
def serve(model_dir: Path, log: Path, *args: str, env: dict[str, str] | None = None, wait: float = 60.0
          ) -> Iterator[Served]:
    """`gptport serve MODEL_DIR --port <free> ARGS` until /health says ok; SIGTERM (then SIGKILL) after."""
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gptport.cli.main", "serve", str(model_dir), "--port",
                                 str(port), *args], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
    served = Served(proc, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + wait
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gptport serve exited with {proc.returncode}: {log.read_text()}")
            try:
                if served.get("/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"gptport serve did not come up in {wait} s: {log.read_text()}")
            time.sleep(0.1)
        yield served
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
