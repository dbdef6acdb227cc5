"""Starting and stopping `gptport serve` in tests (127.0.0.1, a free port, stopped by pid), and the checks the
serving tests share: metrics, streams, error shapes, raw sockets."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.support import server_proc
from tests.support.server_proc import free_port


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
    cmd = [sys.executable, "-m", "gptport.cli.main", "serve", str(model_dir), "--port", str(port), *args]
    with server_proc.running(cmd, server_proc.url_of(port), log, limit=wait, env=env, stop_timeout=40) as proc:
        yield Served(proc, server_proc.url_of(port), log)


def stop(proc: subprocess.Popen[bytes], sig: int, timeout: float, kill: Callable[[], None]) -> None:
    """Send `sig` to a running process; `kill()` when it has not exited within `timeout` seconds."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill()
            proc.wait()


N_CTX = 96  # trained_dir's context
LONG = {"max_tokens": 10_000, "ignore_eos": True, "temperature": 0}  # runs to n_ctx: 96 tokens after a 1-token prompt


# ---- helpers ------------------------------------------------------------------------------------------------------


def metrics(server: Served, headers: dict[str, str] | None = None) -> str:
    r = httpx.get(server.url + "/metrics", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    return r.text


def sample(text: str, name: str, **labels: str) -> float | None:
    """The sum of a metric's samples whose labels include `labels`; None when it has none."""
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name) or line[len(name):len(name) + 1] not in (" ", "{"):
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0] if "{" in line else ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total, found = total + float(line.rsplit(" ", 1)[1]), True
    return total if found else None


def value(server: Served, name: str, **labels: str) -> float:
    return sample(metrics(server), name, **labels) or 0.0


def wait_idle(server: Served, within: float = 2.0) -> None:
    """Poll /metrics until no slot is busy and nothing waits; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        text = metrics(server)
        if sample(text, "gptport_slots_busy") == 0 and sample(text, "gptport_queue_depth") == 0:
            return
        assert time.monotonic() < deadline, f"the server is still busy after {within} s:\n{text}"
        time.sleep(0.02)


def events(server: Served, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> list[Any]:
    """A streamed POST's `data:` payloads, parsed; the last is the string "[DONE]"."""
    out: list[Any] = []
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, headers=headers, timeout=60) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                out.append(data if data == "[DONE]" else json.loads(data))
    assert out and out[-1] == "[DONE]" and out.count("[DONE]") == 1, out[-3:]
    return out


def streamed_text(chunks: list[Any], index: int = 0) -> str:
    return "".join(c["choices"][0]["text"] for c in chunks[:-1] if c["choices"] and c["choices"][0]["index"] == index)


def assert_error(status: int, body: Any, expected: int, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: {"error": {"message", "type", "param", "code"}} with the expected status and param."""
    assert status == expected, body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str), err
    assert err["param"] == param, err
    return err


def cli_generate(model_dir: Path, prompt: str, max_new_tokens: int) -> str:
    """`gptport generate MODEL_DIR PROMPT --max-new-tokens N`'s stdout (greedy), without its trailing newline."""
    out = subprocess.run([sys.executable, "-m", "gptport.cli.main", "generate", str(model_dir), prompt,
                          "--max-new-tokens", str(max_new_tokens)], capture_output=True, timeout=120, check=True)
    text = out.stdout.decode("utf-8")
    assert text.endswith("\n"), text
    return text[:-1]


class Raw:
    """One HTTP/1.1 POST over a plain socket, so that a test can leave at any point (close = disconnect)."""

    def __init__(self, server: Served, path: str, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None,
                 length: int | None = None) -> None:
        parts = urlsplit(server.url)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        head = [f"POST {path} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json",
                f"Content-Length: {len(data) if length is None else length}",
                *(f"{k}: {v}" for k, v in (headers or {}).items())]
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        self.buf = b""

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError(f"the server closed the connection; got {self.buf[:300]!r}")
        self.buf += data

    def head(self) -> tuple[int, dict[str, str]]:
        """The response's status and headers (lower-case names); the body stays in the buffer."""
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        fields = dict(line.split(":", 1) for line in lines[1:])
        return int(lines[0].split()[1]), {k.strip().lower(): v.strip() for k, v in fields.items()}

    def json(self, headers: dict[str, str]) -> Any:
        """A body with a Content-Length, parsed."""
        n = int(headers["content-length"])
        while len(self.buf) < n:
            self._more()
        return json.loads(self.buf[:n])

    def until(self, marker: bytes, count: int) -> None:
        """Read until the body holds `count` of `marker`."""
        while self.buf.count(marker) < count:
            self._more()

    def close(self) -> None:
        self.sock.close()


def attempts(n: int, seconds: float) -> Iterator[int]:
    """At most n tries within `seconds` (timing-dependent checks retry; each loop is bounded both ways)."""
    deadline = time.monotonic() + seconds
    for i in range(n):
        if i and time.monotonic() > deadline:
            return
        yield i


# ---- fixtures -----------------------------------------------------------------------------------------------------


def session_processes(sid: int) -> dict[int, str]:
    """pid -> command line of the live processes of session `sid` (ps)."""
    out = subprocess.run(["ps", "-eo", "pid=,sid=,stat=,args="], capture_output=True, text=True, check=True).stdout
    procs = {}
    for line in out.splitlines():
        parts = line.split(None, 3)
        if int(parts[1]) == sid and not parts[2].startswith("Z"):
            procs[int(parts[0])] = parts[3] if len(parts) > 3 else ""
    return procs


def listening_sockets(pids: set[int]) -> list[tuple[int, str, Any, int]]:
    """(pid, protocol, address, port) of every listening TCP socket and every bound UDP socket the processes
    `pids` hold, from /proc (what `ss -lntup` shows); an IPv4-mapped IPv6 address as the IPv4 one."""
    import ipaddress

    owner: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    owner[link[8:-1]] = pid
        except OSError:  # the process ended, or a descriptor closed while being read
            continue
    out = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        for line in Path(f"/proc/net/{proto}").read_text().splitlines()[1:]:
            f = line.split()
            local, state, inode = f[1], f[3], f[9]
            if inode not in owner or (proto.startswith("tcp") and state != "0A"):  # 0A: LISTEN
                continue
            hex_ip, hex_port = local.split(":")
            raw = b"".join(bytes.fromhex(hex_ip[i:i + 8])[::-1] for i in range(0, len(hex_ip), 8))  # host order
            ip = ipaddress.ip_address(raw)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            out.append((owner[inode], proto, ip, int(hex_port, 16)))
    return out
