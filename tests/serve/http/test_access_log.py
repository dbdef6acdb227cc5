"""`serve --access-log`: one line per request on a real server's stderr, written when the response is over (a
stream's when it ends, marked `incomplete` when its client left first); nothing without the option."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx

from tests.support.cli import assert_one_line_error, gptport
from tests.support.serving import LONG, Raw, attempts, serve

LINE = re.compile(r"(?P<client>[0-9.]+:[0-9]+) (?P<method>[A-Z]+) (?P<path>\S+) (?P<status>[0-9]{3}|-) "
                  r"(?P<ms>[0-9]+\.[0-9]) ms(?P<incomplete> incomplete)?")
CHAT = {"messages": [{"role": "user", "content": "the ka"}], "max_tokens": 4, "temperature": 0}


def access_lines(log: Path) -> list[dict[str, str]]:
    """The access log's lines in a server's captured output, parsed."""
    return [m.groupdict() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()
            if (m := LINE.fullmatch(line))]


def line_of(log: Path, client: str) -> dict[str, str]:
    """The access line of the request from `client` (host:port), once the server has written it."""
    for _ in attempts(300, 30):
        found = [line for line in access_lines(log) if line["client"] == client]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no access line for {client} within 30 s:\n{log.read_text(errors='replace')[-2000:]}")


def test_each_request_is_one_line_when_it_ends(trained_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    left: list[str] = []  # the clients (host:port) of streams left before their end
    with serve(trained_dir, log, "--access-log") as s:
        assert httpx.get(s.url + "/health", timeout=30).status_code == 200
        assert httpx.post(s.url + "/v1/chat/completions", json=CHAT, timeout=60).status_code == 200
        assert httpx.post(s.url + "/v1/completions", json={"prompt": "ka", "temperature": -1},
                          timeout=60).status_code == 400
        assert httpx.get(s.url + "/no/such/route?key=x", timeout=30).status_code == 404
        with httpx.stream("POST", s.url + "/v1/completions", json={"prompt": "ka", "max_tokens": 8, "stream": True},
                          timeout=60) as r:
            assert r.status_code == 200 and r.read().endswith(b"data: [DONE]\n\n")
        for _ in attempts(5, 60):  # a stream of 4 x 96 tokens left after its first chunk (retried if it had ended)
            raw = Raw(s, "/v1/completions", {"prompt": "ka", "stream": True, "n": 4, **LONG})
            status, _ = raw.head()
            assert status == 200
            raw.until(b"data: ", 1)
            host, port = raw.sock.getsockname()[:2]
            left.append(f"{host}:{port}")
            raw.close()
            if line_of(log, left[-1])["incomplete"]:
                break
    lines = access_lines(log)  # the server has exited: every line is written
    seen = {(line["method"], line["path"], line["status"]) for line in lines}
    assert {("GET", "/health", "200"), ("POST", "/v1/chat/completions", "200"), ("POST", "/v1/completions", "400"),
            ("GET", "/no/such/route", "404")} <= seen, lines
    assert all(not line["incomplete"] for line in lines if line["client"] not in left)
    streams = [line for line in lines if line["client"] == left[-1]]
    assert len(streams) == 1 and streams[0]["status"] == "200" and streams[0]["incomplete"], (left, lines)
    assert "HTTP/1.1\"" not in log.read_text(encoding="utf-8")  # uvicorn's own access log stays off


def test_no_access_log_by_default(trained_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with serve(trained_dir, log) as s:
        assert httpx.post(s.url + "/v1/chat/completions", json=CHAT, timeout=60).status_code == 200
    assert access_lines(log) == [] and "/v1/chat/completions" not in log.read_text(encoding="utf-8")


def test_access_log_is_not_rays(trained_dir: Path) -> None:
    r = gptport("serve", str(trained_dir), "--ray", "--access-log")
    assert_one_line_error(r, 2, "--access-log", "Ray Serve")
