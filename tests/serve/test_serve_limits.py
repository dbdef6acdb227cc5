"""`gptport serve` under bad input and pressure: malformed bursts, body limits, the API key, a full queue,
clients that leave, SIGTERM, and the metrics that show it. A real server process per module."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai  # a dev dependency: its absence is a failure, not a skip
import pytest

from tests.support.serving import (
    LONG,
    N_CTX,
    Raw,
    Served,
    assert_error,
    attempts,
    events,
    metrics,
    sample,
    serve,
    value,
    wait_idle,
)


@pytest.fixture(scope="module")
def server(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The module's server: 4 slots, the default queue."""
    with serve(trained_dir, tmp_path_factory.mktemp("serve") / "serve.log", "--slots", "4") as s:
        yield s



def test_oversized_body(server: Served) -> None:
    big = json.dumps({"prompt": "ka", "pad": "x" * (1 << 20)}).encode()
    r = httpx.post(server.url + "/v1/completions", content=big, headers={"Content-Type": "application/json"},
                   timeout=30)
    assert_error(r.status_code, r.json(), 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is counted as the body arrives
        yield big[: 1 << 19]
        yield big[1 << 19:]

    r = httpx.post(server.url + "/v1/completions", content=chunks(), headers={"Content-Type": "application/json"},
                   timeout=30)
    assert_error(r.status_code, r.json(), 413)
    assert server.post("/v1/completions", {"prompt": "ka", "max_tokens": 2})[0] == 200


def test_burst_of_malformed_requests(server: Served) -> None:
    """50 malformed requests from 8 threads while long good ones run: each gets its 4xx, every good one
    finishes, the next good one is served, nothing was a 500, no slot stays busy and the process lives."""
    c, chat = "/v1/completions", "/v1/chat/completions"
    kinds: list[tuple[Any, int, str | None, str]] = [  # body, status, param, route
        (b"{bad", 400, None, c), (b"null", 400, None, c), (b"\xff", 400, None, c), ({"prompt": 5}, 400, "prompt", c),
        ({"prompt": "ka", "max_tokens": "ten"}, 400, "max_tokens", c),
        (b'{"prompt": "ka", "temperature": NaN}', 400, "temperature", c),
        (b'{"prompt": "ka", "repetition_penalty": NaN, "temperature": 1}', 400, "repetition_penalty", c),
        ({"prompt": [1, 10**9]}, 400, "prompt", c), ({"prompt": "ka", "n": 99}, 400, "n", c),
        ({"prompt": "ka " * 200}, 400, "prompt", c), ({"messages": [{"role": 3}]}, 400, "messages[0].role", chat),
        ({"prompt": "ka", "model": "nope"}, 404, "model", c), ({"prompt": "ka", "stream": 1}, 400, "stream", c),
        ({"prompt": "ka", "repetition_penalty": 1e-300, "temperature": 1}, 400, "repetition_penalty", c),
    ]
    goods: list[Any] = []
    burst_over = threading.Event()

    def good() -> None:  # long good requests, one after another, as long as the burst lasts
        for _ in range(100):
            try:
                goods.append(events(server, "/v1/completions", {"prompt": "ka", **LONG}))
            except Exception as e:  # noqa: BLE001 - reported below
                goods.append(e)
            if burst_over.is_set():
                return

    runner = threading.Thread(target=good)
    runner.start()

    def one(i: int) -> None:
        body, expected, param, path = kinds[i % len(kinds)]
        assert_error(*server.post(path, body), expected, param)

    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(50), timeout=60))  # raises the first failed check
    finally:
        burst_over.set()
        runner.join(60)
    assert goods and not runner.is_alive()
    for chunks in goods:  # none of them failed because of a malformed neighbour
        assert isinstance(chunks, list) and chunks[-2]["choices"][0]["finish_reason"] == "length", chunks
    for _ in range(3):  # bodies cut short by a client that leaves
        raw = Raw(server, "/v1/completions", b'{"prompt": "ka", "max_to', length=500)
        raw.close()
    status, reply = server.post("/v1/completions", {"prompt": "ka to", "max_tokens": 8})
    assert status == 200 and reply["usage"]["completion_tokens"] >= 1
    wait_idle(server)
    assert not sample(metrics(server), "gptport_requests_total", status="500")  # no request was a server error
    assert server.proc.poll() is None


# ---- metrics ------------------------------------------------------------------------------------------------------


def test_metrics(server: Served) -> None:
    before = metrics(server)
    for name in ("gptport_requests_total", "gptport_prompt_tokens_total", "gptport_generation_tokens_total",
                 "gptport_time_to_first_token_seconds_bucket", "gptport_time_per_output_token_seconds_bucket",
                 "gptport_queue_time_seconds_bucket", "gptport_queue_depth", "gptport_slots_busy",
                 "gptport_kv_cache_positions_used"):
        assert sample(before, name) is not None, name
    assert sample(before, "gptport_slots_busy") == 0 and sample(before, "gptport_kv_cache_positions_used") == 0
    ok = sample(before, "gptport_requests_total", route="/v1/completions", status="200") or 0
    refused = sample(before, "gptport_requests_total", route="/v1/completions", status="400") or 0
    status, r = server.post("/v1/completions", {"prompt": "ka to ri men", "max_tokens": 10, "ignore_eos": True})
    assert status == 200
    assert server.post("/v1/completions", {"prompt": 5})[0] == 400
    after = metrics(server)
    u = r["usage"]

    def grew(name: str) -> float:
        return (sample(after, name) or 0) - (sample(before, name) or 0)

    cached = u["prompt_tokens_details"]["cached_tokens"]  # an earlier test's prompt may have left this one's start
    assert grew("gptport_prompt_tokens_total") + cached == u["prompt_tokens"] == 4
    assert grew("gptport_prompt_tokens_cached_total") == cached
    assert grew("gptport_generation_tokens_total") == u["completion_tokens"] == 10
    assert grew("gptport_time_to_first_token_seconds_count") == 1
    assert grew("gptport_queue_time_seconds_count") == 1  # the one choice was admitted once
    assert grew("gptport_time_per_output_token_seconds_count") == u["completion_tokens"] - 1
    assert sample(after, "gptport_requests_total", route="/v1/completions", status="200") == ok + 1
    assert sample(after, "gptport_requests_total", route="/v1/completions", status="400") == refused + 1
    assert sample(after, "gptport_slots_busy") == 0 and sample(after, "gptport_queue_depth") == 0


# ---- API key ------------------------------------------------------------------------------------------------------


def test_api_key(trained_dir: Path, tmp_path: Path) -> None:
    with serve(trained_dir, tmp_path / "serve.log", "--slots", "1", env={"GPTPORT_API_KEY": "k"}) as s:
        assert s.get("/health") == (200, {"status": "ok"})
        for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": "k"}):
            assert assert_error(*s.get("/v1/models", headers), 401)["code"] == "invalid_api_key"
            assert_error(*s.post("/v1/completions", {"prompt": "ka"}, headers), 401)
            assert s.get("/metrics", headers)[0] == 401
        key = {"Authorization": "Bearer k"}
        assert s.get("/v1/models", key)[0] == 200
        assert s.post("/v1/completions", {"prompt": "ka", "max_tokens": 2}, key)[0] == 200
        assert sample(metrics(s, key), "gptport_requests_total", route="/v1/completions", status="401") == 3
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0).models.list()
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
        assert good.completions.create(model=trained_dir.name, prompt="ka", max_tokens=2).usage.completion_tokens


# ---- load: queue, disconnects, shutdown -----------------------------------------------------------------------------


def test_queue_full_is_429(trained_dir: Path, tmp_path: Path) -> None:
    """One slot and a queue of one: a long stream holds the slot, a second waits, the third is refused."""
    with serve(trained_dir, tmp_path / "serve.log", "--slots", "1", "--max-queue", "1") as s:
        stream = {"prompt": "ka", "stream": True, **LONG}
        for _ in attempts(10, 30):
            opened: list[Raw] = []
            try:
                for _ in range(2):  # one by one, so that they arrive in this order
                    opened.append(Raw(s, "/v1/completions", stream))
                    assert opened[-1].head()[0] == 200
                third = Raw(s, "/v1/completions", {"prompt": "ka", "max_tokens": 2})
                opened.append(third)
                status, headers = third.head()
                body = third.json(headers) if status == 429 else None
            finally:
                for r in opened:
                    r.close()
            wait_idle(s)
            if status == 429:
                break
        else:
            pytest.fail("no request was refused with 429 while the slot and the queue were full")
        assert int(headers["retry-after"]) >= 1
        err = assert_error(429, body, 429)
        assert err["type"] == "rate_limit_error" and err["code"] == "queue_full"
        assert s.post("/v1/completions", {"prompt": "ka", "max_tokens": 2})[0] == 200  # accepted again


@pytest.fixture(scope="module")
def one_slot(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server with one slot and room to queue: a test leaves it idle (wait_idle) for the next."""
    with serve(trained_dir, tmp_path_factory.mktemp("one_slot") / "serve.log", "--slots", "1", "--max-queue", "64"
               ) as s:
        yield s


def _tokens_decoded(server: Served) -> float:
    """Tokens decoded after a choice's first, cancelled choices' too: the per-token latency histogram's count."""
    return value(server, "gptport_time_per_output_token_seconds_count")


def _left_early(server: Served, leave: Callable[[], None], full: float) -> bool:
    """Run `leave` (a client that goes away mid-request), then check the slot is free within 2 s, a new request
    is served at once, and fewer than `full` tokens were decoded meanwhile (the request was cut short)."""
    before = _tokens_decoded(server)
    leave()
    wait_idle(server, 2.0)
    spent = _tokens_decoded(server) - before
    t0 = time.monotonic()
    status, r = server.post("/v1/completions", {"prompt": "ka", "max_tokens": 4})
    assert status == 200 and r["usage"]["completion_tokens"] >= 1 and time.monotonic() - t0 < 2.0
    return spent < full


def test_stream_disconnect_frees_the_slot(one_slot: Served) -> None:
    def leave() -> None:
        raw = Raw(one_slot, "/v1/completions", {"prompt": "ka", "stream": True, **LONG})
        assert raw.head()[0] == 200
        raw.until(b"data: ", 2)  # a couple of chunks
        raw.close()

    assert any(_left_early(one_slot, leave, N_CTX - 1) for _ in attempts(5, 30)), \
        "a stream whose client left ran to n_ctx every time"


def test_non_streamed_client_timeout_frees_the_slot(one_slot: Served) -> None:
    def leave() -> None:  # 2 ms for the reply: a whole completion of 95 tokens takes longer on any machine
        try:
            r = httpx.post(one_slot.url + "/v1/completions", json={"prompt": "ka", **LONG},
                           timeout=httpx.Timeout(10, read=0.002))
        except httpx.TimeoutException:
            return
        raise AssertionError(f"a reply came before the client's 2 ms read timeout: {r.status_code} {r.text[:300]}")

    assert any(_left_early(one_slot, leave, N_CTX - 1) for _ in attempts(5, 30)), \
        "a request whose client timed out ran to n_ctx every time"


def test_queued_requests_of_departed_clients_are_dropped(one_slot: Served) -> None:
    """30 long requests (streamed and not) queue behind one slot; their clients leave: the queue empties at once."""
    k = 30
    before = _tokens_decoded(one_slot)
    raws = []
    for i in range(k):
        raws.append(Raw(one_slot, "/v1/completions", {"prompt": "ka", "stream": i % 2 == 0, **LONG}))
        if i % 2 == 0:
            assert raws[-1].head()[0] == 200  # a stream's head comes once its choices are queued
    deadline = time.monotonic() + 5
    while value(one_slot, "gptport_queue_depth") < k // 3:  # the non-streamed ones are queued too
        assert time.monotonic() < deadline, "the requests were not queued"
        time.sleep(0.01)
    for r in raws:
        r.close()
    wait_idle(one_slot, 2.0)
    assert _tokens_decoded(one_slot) - before < k * (N_CTX - 1) / 2


def test_sigterm_finishes_running_requests(trained_dir: Path, tmp_path: Path) -> None:
    """SIGTERM with streams running and queued: they all end normally with [DONE], new connections are
    refused meanwhile, and the process exits 0."""
    with serve(trained_dir, tmp_path / "serve.log", "--slots", "1") as s:
        k = 6
        results: list[Any] = [None] * k
        submitted = threading.Semaphore(0)
        first = threading.Event()

        def consume(i: int) -> None:
            out: list[Any] = []
            try:
                with httpx.stream("POST", s.url + "/v1/completions", json={"prompt": "ka", "stream": True, **LONG},
                                  timeout=30) as r:
                    submitted.release()
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            first.set()
                            out.append(line[6:])
                results[i] = out
            except Exception as e:  # noqa: BLE001 - reported below
                results[i] = e
            finally:
                submitted.release()
                first.set()

        threads = [threading.Thread(target=consume, args=(i,)) for i in range(k)]
        for t in threads:
            t.start()
        for _ in range(k):
            assert submitted.acquire(timeout=30)
        assert first.wait(30)
        s.proc.send_signal(signal.SIGTERM)
        port = urlsplit(s.url).port
        deadline, refused, alive = time.monotonic() + 5, False, False
        while not refused and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                time.sleep(0.01)
            except ConnectionRefusedError:
                refused, alive = True, s.proc.poll() is None
        assert refused, "the server still accepted connections 5 s after SIGTERM"
        assert alive, "the server had exited (not drained) when it refused connections"
        for t in threads:
            t.join(30)
        for out in results:
            assert isinstance(out, list) and out[-1] == "[DONE]", out
            assert json.loads(out[-2])["choices"][0]["finish_reason"] == "length"
            assert sum(len(json.loads(o)["choices"][0]["text"]) for o in out[:-1]) > 0
        assert s.proc.wait(timeout=30) == 0, f"exit status {s.proc.returncode}: {s.log.read_text()}"


def test_taken_port_is_a_one_line_error(trained_dir: Path) -> None:
    """A port another process listens on: exit 1 and one line naming it, before the model loads."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "gptport.cli.main", "serve", str(trained_dir), "--port", str(port)],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [f"gptport: error: --host 127.0.0.1 --port {port}: cannot listen there "
                                             "(Address already in use)"]


def test_spin_modes(trained_dir: Path) -> None:
    """--spin: an unknown mode is a one-line usage error before anything loads; each mode sets onnxruntime's
    thread-pool options as documented (step: spin during a run, stop as it returns)."""
    from gptport.runtime.onnx_engine import session_options

    r = subprocess.run([sys.executable, "-m", "gptport.cli.main", "serve", str(trained_dir), "--spin", "sometimes"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["gptport: error: --spin 'sometimes' is unknown; choose one of always, "
                                             "step, never"]

    def entries(mode: str) -> dict[str, str]:
        opts, out = session_options(2, mode), {}
        for key in ("session.intra_op.allow_spinning", "session.force_spinning_stop"):
            try:
                out[key] = opts.get_session_config_entry(key)
            except RuntimeError:  # not set: onnxruntime's default (spinning allowed, not stopped after a run)
                pass
        return out

    assert entries("always") == {}
    assert entries("step") == {"session.force_spinning_stop": "1"}
    assert entries("never") == {"session.intra_op.allow_spinning": "0"}
