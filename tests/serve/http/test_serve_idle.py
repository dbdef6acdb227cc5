"""`gptport serve` against connections that hold on without asking: sockets that connect and send nothing,
keep-alive sockets that idle, slowloris sockets (headers a line at a time, or a body a byte at a time); and a
short flood, whose surplus must be refused with 429 and Retry-After. A real server process per module.
Tests bound how long a request may be kept waiting ("not blocked"); they assert no speed."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.serving import Served, assert_error, serve, wait_idle

SLOTS, QUEUE, MAX_CONNECTIONS = 2, 2, 100
TIMEOUT = 1.0  # the server's --header-timeout and --body-timeout, seconds
NOT_BLOCKED = 10.0  # seconds within which a real request must be answered however many sockets idle


@pytest.fixture(scope="module")
def server(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """2 slots, a queue of 2, 100 connections, 1 s for a request's head and for its body, 1 s keep-alive."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048 <= hard or (soft < 2048 and hard == resource.RLIM_INFINITY):
        resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))  # this test holds ~350 sockets at once
    with serve(trained_dir, tmp_path_factory.mktemp("idle") / "serve.log", "--slots", str(SLOTS), "--max-queue",
               str(QUEUE), "--max-connections", str(MAX_CONNECTIONS), "--header-timeout", str(TIMEOUT),
               "--body-timeout", str(TIMEOUT), "--keep-alive", "1") as s:
        yield s


def _connect(server: Served, first: bytes = b"") -> socket.socket:
    parts = urlsplit(server.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=NOT_BLOCKED)
    if first:
        sock.sendall(first)
    return sock


def _ending(sock: socket.socket, within: float) -> bytes | None:
    """What the server sent before it closed the socket (b"" for nothing); None when still open after `within`."""
    sock.settimeout(0.05)
    got, deadline = b"", time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return got
        if not data:
            return got
        got += data
    return None


def _real_request(server: Served) -> tuple[int, float]:
    """A completion on a new connection, tried again while the server says it has no room for one (503, or a
    connection it closes at once: too many are open): its status and how long until it was answered."""
    t0 = time.monotonic()
    while True:
        try:
            r = httpx.post(server.url + "/v1/completions", json={"prompt": "ka", "max_tokens": 4}, timeout=NOT_BLOCKED)
            if r.status_code != 503:
                return r.status_code, time.monotonic() - t0
        except httpx.TransportError:
            pass
        if time.monotonic() - t0 > NOT_BLOCKED:
            return 0, time.monotonic() - t0
        time.sleep(0.05)


def test_idle_and_slow_sockets_do_not_block_a_request(server: Served) -> None:
    """20 slow-body, 10 slow-header and 20 idle keep-alive sockets, then 300 that send nothing (more than
    --max-connections): a real completion is answered within 10 s, the slowloris sockets get 408 with OpenAI's
    error object, the idle ones are closed, and the server is as before."""
    host = urlsplit(server.url).netloc
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    slow_body = [_connect(server, (head + "Content-Length: 1000\r\n\r\n{").encode()) for _ in range(20)]
    slow_head = [_connect(server, head.encode()) for _ in range(10)]
    keep_alive = [_connect(server, f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()) for _ in range(20)]
    stop = threading.Event()

    def dribble() -> None:  # a byte of body, a header line, every 0.2 s (bounded: the test's sockets end sooner)
        for i in range(100):
            if stop.wait(0.2):
                return
            for sock, data in [*((s, b" ") for s in slow_body), *((s, f"X-{i}: a\r\n".encode()) for s in slow_head)]:
                try:
                    sock.sendall(data)
                except OSError:  # the server closed it
                    pass

    writer = threading.Thread(target=dribble, daemon=True)
    writer.start()
    idle = [_connect(server) for _ in range(300)]
    try:
        status, waited = _real_request(server)
        assert status == 200, f"a real request was not answered within {NOT_BLOCKED} s ({status}, {waited:.1f} s)"
        for sock in slow_body + slow_head:
            end = _ending(sock, NOT_BLOCKED)
            assert end is not None, "a slowloris socket was still open after 10 s"
            status_line, _, rest = end.partition(b"\r\n")
            assert status_line == b"HTTP/1.1 408 Request Timeout", end[:300]
            body = json.loads(rest.split(b"\r\n\r\n", 1)[1])
            code = assert_error(408, body, 408)["code"]
            assert code == ("body_timeout" if sock in slow_body else "header_timeout"), body
        for sock in keep_alive:
            end = _ending(sock, NOT_BLOCKED)
            assert end is not None and end.startswith(b"HTTP/1.1 200 OK"), end
        assert all(_ending(sock, NOT_BLOCKED) == b"" for sock in idle), "an idle socket was still open after 10 s"
    finally:
        stop.set()
        writer.join(5)
        for sock in slow_body + slow_head + keep_alive + idle:
            sock.close()
    assert server.proc.poll() is None
    assert server.get("/health") == (200, {"status": "ok"})
    wait_idle(server, 5.0)
    status, _ = _real_request(server)
    assert status == 200


def test_flood_surplus_is_429_with_retry_after(server: Served) -> None:
    """4x (slots + queue) clients loop short streamed completions for 5 s: every answer is 200 (a whole stream)
    or 429 with Retry-After and OpenAI's error; some of each; no slot stays busy afterwards."""
    clients, seconds = 4 * (SLOTS + QUEUE), 5.0
    statuses: Counter[str] = Counter()
    problems: list[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    body = {"prompt": "ka", "max_tokens": 8, "ignore_eos": True, "temperature": 0.8, "stream": True}

    def client() -> None:
        with httpx.Client(timeout=30) as http:
            for _ in range(2000):  # bounded in requests as well as in time
                if time.monotonic() > stop:
                    return
                try:
                    with http.stream("POST", server.url + "/v1/completions", json=body) as r:
                        raw = r.read()
                        what = str(r.status_code)
                        if r.status_code == 429:
                            if not r.headers.get("retry-after", "").isdigit():
                                what = "429 without Retry-After"
                            elif json.loads(raw)["error"]["code"] != "queue_full":
                                what = f"429 {raw[:200]!r}"
                        elif r.status_code == 200 and not raw.rstrip().endswith(b"data: [DONE]"):
                            what = "200 without [DONE]"
                except httpx.TransportError as e:
                    what = f"{type(e).__name__}: {e}"
                with lock:
                    statuses[what] += 1
                    if what not in ("200", "429"):
                        problems.append(what)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 40)
    assert not any(t.is_alive() for t in threads)
    assert not problems, f"{statuses}: {problems[:5]}"
    assert statuses["200"] > 0 and statuses["429"] > 0, statuses
    wait_idle(server, 5.0)
    assert server.proc.poll() is None
    status, _ = _real_request(server)
    assert status == 200


def test_a_connection_back_before_retry_after_waits_for_its_429(server: Served) -> None:
    """A client that asks again at once on the connection that just got a 429 gets its next 429 only when the
    first one's Retry-After has passed (the server's defence against clients that ignore it)."""
    url = server.url + "/v1/completions"
    hold = {"prompt": "ka", "max_tokens": 90, "ignore_eos": True, "n": SLOTS, "stream": True}
    short = {"prompt": "ka", "max_tokens": 1}
    for _ in range(30):  # the tiny model is fast: until a retry lands while every slot and queue place is taken
        with httpx.Client(timeout=30) as busy, httpx.Client(timeout=30) as queued, httpx.Client(timeout=30) as http:
            with busy.stream("POST", url, json=hold) as held, queued.stream("POST", url, json=hold) as waiting:
                first = http.post(url, json=short)
                if first.status_code != 429:
                    continue
                t0 = time.monotonic()
                again = http.post(url, json=short)
                waited = time.monotonic() - t0
                held.read()
                waiting.read()
            if again.status_code != 429:
                continue
            told = float(first.headers["retry-after"])
            assert again.headers["retry-after"] == first.headers["retry-after"]
            assert json.loads(again.content)["error"]["code"] == "queue_full"
            assert 0.8 * told <= waited < told + NOT_BLOCKED, (waited, told)
            wait_idle(server, 5.0)
            return
    pytest.fail("no retry met a full server in 30 tries")


@pytest.mark.parametrize(("args", "message"), [
    (["--header-timeout", "0"], "--header-timeout must be > 0 and <= 3600 seconds, not 0"),
    (["--body-timeout", "nan"], "--body-timeout must be > 0 and <= 3600 seconds, not nan"),
    (["--keep-alive", "0"], "--keep-alive must be >= 1 and <= 3600 seconds, not 0"),
    (["--max-connections", "8", "--slots", "4", "--max-queue", "4"],
     "--max-connections 8 must be more than --slots + --max-queue (8): a full queue answers 429 before connections "
     "run out"),
])
def test_bad_limits_are_one_line_errors(trained_dir: Path, args: list[str], message: str) -> None:
    r = subprocess.run([sys.executable, "-m", "gptport.cli.main", "serve", str(trained_dir), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"gptport: error: {message}"]
