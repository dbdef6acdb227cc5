"""tests.support.server_proc: a server started as a child process, waited for until healthy, stopped by its
pid; one that exits or never answers is an error quoting its log."""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support import server_proc

# a server whose /health answers 200 once it listens, and which says so in its log
HEALTH = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
print("listening", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_running_waits_for_health_and_stops_by_pid(tmp_path: Path) -> None:
    port = server_proc.free_port()
    url, log = server_proc.url_of(port), tmp_path / "logs" / "server.log"
    with server_proc.running([sys.executable, "-c", HEALTH, str(port)], url, log, limit=30, stop_timeout=10) as proc:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            assert r.status == 200
        assert proc.poll() is None
    assert proc.returncode is not None  # stopped when the block ended
    assert "listening" in log.read_text()


def test_a_server_that_exits_is_an_error_quoting_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"]
    with pytest.raises(server_proc.ServerStartError, match=r"exited with 3 .*no model here"):
        with server_proc.running(cmd, server_proc.url_of(server_proc.free_port()), log, limit=30):
            pass


def test_a_server_that_never_answers_times_out(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
    proc = server_proc.start(cmd, tmp_path / "server.log")
    try:
        with pytest.raises(server_proc.ServerStartError, match="did not answer 200 within 0.5 s"):
            server_proc.wait_healthy(server_proc.url_of(server_proc.free_port()), proc, limit=0.5)
    finally:
        server_proc.stop(proc, timeout=10)
    assert proc.returncode is not None


def test_start_appends_only_when_asked(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    for append in (False, True):
        proc = server_proc.start([sys.executable, "-c", "print('run')"], log, append=append)
        proc.wait(timeout=30)
        server_proc.stop(proc)  # a process that has exited already: nothing to do
    assert log.read_text().split() == ["run", "run"]
    server_proc.start([sys.executable, "-c", "print('run')"], log).wait(timeout=30)
    assert log.read_text().split() == ["run"]
