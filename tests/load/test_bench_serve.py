"""bench-serve: the metric functions on hand-made timings, and the load generator against a fake streaming server."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gptport.errors import UsageError
from gptport.load import loadgen, loadstats
from gptport.load.loadstats import RequestRecord

# ---- the metric functions ---------------------------------------------------------------------------


def test_request_latencies_tpot_differs_from_itl() -> None:
    # 5 tokens in 3 text chunks: TTFT 100 ms, E2EL 300 ms, TPOT (300 - 100) / 4 = 50 ms, ITL 50 and 100 ms
    r = RequestRecord(start=10.0, end=10.3, text_times=[10.1, 10.15, 10.25], prompt_tokens=8, completion_tokens=5)
    lat = loadstats.request_latencies(r)
    assert lat["ttft"] == pytest.approx(0.1)
    assert lat["e2el"] == pytest.approx(0.3)
    assert lat["tpot"] == pytest.approx(0.05)
    assert lat["itl"] == pytest.approx([0.05, 0.1])


def test_one_token_has_no_tpot_and_no_text_has_no_ttft() -> None:
    assert loadstats.request_latencies(RequestRecord(start=0, end=0.2, text_times=[0.2], completion_tokens=1))[
        "tpot"] is None
    lat = loadstats.request_latencies(RequestRecord(start=0, end=0.2, completion_tokens=0))
    assert lat["ttft"] is None and lat["tpot"] is None and lat["itl"] == []


def test_level_metrics_on_hand_made_records() -> None:
    records = [
        RequestRecord(start=0.0, end=0.3, text_times=[0.1, 0.15, 0.25], prompt_tokens=8, completion_tokens=5),
        RequestRecord(start=1.0, end=1.2, text_times=[1.2], prompt_tokens=8, completion_tokens=1),
        RequestRecord(start=2.0, end=2.2, text_times=[2.05, 2.1]),  # no usage: 2 chunks, prompt_len tokens
        RequestRecord(start=3.0, end=3.1, error="HTTP 500: boom"),
    ]
    m = loadstats.level_metrics(records, duration_s=4.0, prompt_len=10)
    assert (m["completed"], m["failed"]) == (3, 1)
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (8 + 8 + 10, 5 + 1 + 2)
    assert m["request_throughput"] == pytest.approx(3 / 4)
    assert m["output_throughput"] == pytest.approx(8 / 4)
    assert m["total_token_throughput"] == pytest.approx(34 / 4)
    assert m["mean_prompt_tokens"] == 8.0 and m["requests_without_usage"] == 1
    ttft = [100.0, 200.0, 50.0]
    assert m["mean_ttft_ms"] == pytest.approx(350 / 3, abs=1e-3)
    assert m["median_ttft_ms"] == pytest.approx(100.0)
    assert m["std_ttft_ms"] == pytest.approx(math.sqrt(sum((x - 350 / 3) ** 2 for x in ttft) / 3), abs=1e-3)
    assert m["p99_ttft_ms"] == pytest.approx(100 + 0.98 * 100)  # rank 1.98 between 100 and 200
    assert m["median_tpot_ms"] == pytest.approx(100.0)  # 50 ms (5 tokens) and 150 ms (2 tokens, (200-50)/1)
    assert m["p99_tpot_ms"] == pytest.approx(50 + 0.99 * 100)
    assert m["mean_itl_ms"] == pytest.approx((50 + 100 + 50) / 3, abs=1e-3)
    assert m["median_itl_ms"] == pytest.approx(50.0)
    assert m["median_e2el_ms"] == pytest.approx(200.0) and m["mean_e2el_ms"] == pytest.approx(700 / 3, abs=1e-3)
    assert m["errors"] == [{"message": "HTTP 500: boom", "count": 1}]


def test_level_metrics_with_nothing_completed() -> None:
    m = loadstats.level_metrics([RequestRecord(start=0, end=1, error="x")], duration_s=1.0, prompt_len=4)
    assert (m["completed"], m["failed"], m["request_throughput"]) == (0, 1, 0)
    assert m["median_ttft_ms"] is None and m["p99_e2el_ms"] is None and m["mean_prompt_tokens"] is None
    json.dumps(m, allow_nan=False)


def test_percentile_matches_numpy() -> None:
    import numpy as np  # a dependency of gptport itself
    rng = random.Random(1)
    for n in (1, 2, 7, 100):
        values = [rng.random() for _ in range(n)]
        for q in (0, 50, 90, 99, 100):
            assert loadstats.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_distinct_errors_keeps_a_few_with_counts() -> None:
    failed = [RequestRecord(start=0, error=f"e{i % 7}") for i in range(21)]
    errors = loadstats.distinct_errors(failed)
    assert [e["message"] for e in errors] == [f"e{i}" for i in range(loadstats.MAX_ERRORS_KEPT)]
    assert all(e["count"] == 3 for e in errors)


def test_option_parsing() -> None:
    assert loadgen.parse_concurrency("1, 4,16") == (1, 4, 16)
    for bad in ("", "0", "1,x", "-2"):
        with pytest.raises(UsageError, match="--concurrency"):
            loadgen.parse_concurrency(bad)
    assert loadgen.parse_rate("inf") == math.inf and loadgen.parse_rate("2.5") == 2.5
    for bad in ("0", "-1", "nan", "fast"):
        with pytest.raises(UsageError, match="--request-rate"):
            loadgen.parse_rate(bad)
    assert loadgen.base_url("127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"


def test_prompts_and_arrivals_are_seeded() -> None:
    prompts = loadgen.make_prompts(5, 12, seed=3)
    assert prompts == loadgen.make_prompts(5, 12, seed=3) != loadgen.make_prompts(5, 12, seed=4)
    assert all(len(p.split()) == 12 for p in prompts)
    assert loadgen.arrival_gaps(3, math.inf, 0) == [0.0, 0.0, 0.0]
    gaps = loadgen.arrival_gaps(4000, 10.0, 0)
    assert gaps == loadgen.arrival_gaps(4000, 10.0, 0)
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.1)


# ---- a fake OpenAI streaming server -----------------------------------------------------------------

CHUNKS = 6  # text chunks per completion, each said to carry TOKENS_PER_CHUNK tokens
TOKENS_PER_CHUNK = 2
FIRST_DELAY_S = 0.05
GAP_S = 0.01


class FakeState:
    def __init__(self) -> None:
        self.count = 0
        self.bodies: list[dict[str, Any]] = []
        self.probes: list[dict[str, Any]] = []


def make_app(state: FakeState) -> Any:
    """Every 5th completion request fails with HTTP 500; the model name picks a behaviour: 'nousage' sends
    no usage chunk, 'midfail' an error object mid-stream, 'slow' waits 2 s before its first chunk."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def sse(obj: dict[str, Any]) -> str:
        return f"data: {json.dumps(obj)}\n\n"

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def completions(request: Request) -> Any:
        body = await request.json()
        if not body.get("stream"):  # bench-serve's calibration probe: this tokenizer makes 2 tokens of a word
            n_in = 2 * len(body["prompt"].split())
            state.probes.append(body)
            if n_in > 400:  # this server's context
                return JSONResponse({"error": {"message": f"{n_in} tokens is past the context of 400"}},
                                    status_code=400)
            return JSONResponse({"choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": n_in, "completion_tokens": 1, "total_tokens": n_in + 1}})
        state.count += 1
        state.bodies.append(body)
        if state.count % 5 == 0:
            return JSONResponse({"error": {"message": "injected failure", "type": "server_error"}}, status_code=500)
        mode = body["model"]

        async def stream() -> Any:
            await asyncio.sleep(2.0 if mode == "slow" else FIRST_DELAY_S)
            yield sse({"choices": [{"index": 0, "text": ""}], "usage": None})  # carries no text
            for i in range(CHUNKS):
                if i:
                    await asyncio.sleep(GAP_S)
                if mode == "midfail" and i == 2:
                    yield sse({"error": {"message": "boom mid-stream", "code": 500}})
                    return
                yield sse({"choices": [{"index": 0, "text": f" w{i}", "finish_reason": None}], "usage": None})
            if mode != "nousage" and body.get("stream_options", {}).get("include_usage"):
                n_in = 2 * len(body["prompt"].split())
                usage = {"prompt_tokens": n_in, "completion_tokens": CHUNKS * 2, "total_tokens": n_in + CHUNKS * 2}
                if mode == "cached":  # a server with prefix caching says how many prompt tokens it reused
                    usage["prompt_tokens_details"] = {"cached_tokens": 8}
                yield sse({"choices": [], "usage": usage})
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"])])


@pytest.fixture(scope="module")
def _server() -> Iterator[tuple[str, FakeState]]:
    import uvicorn

    state = FakeState()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(make_app(state), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the fake server did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", state
    server.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture
def server(_server: tuple[str, FakeState]) -> tuple[str, FakeState]:
    _server[1].__init__()  # each test counts its requests from 1
    return _server


def test_load_generator_against_the_fake_server(server: tuple[str, FakeState]) -> None:
    url, state = server
    settings = loadgen.Settings(url=url, concurrency=(1, 3), num_prompts=10, prompt_len=12, max_tokens=12,
                                temperature=0.5, timeout_s=20)
    result = loadgen.run(settings)
    assert result["model"] == "fake-model"  # the first id of GET /v1/models
    assert result["settings"]["concurrency"] == [1, 3] and result["machine"]["cores"] == os.cpu_count()
    body = state.bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["max_tokens"] == 12 and body["temperature"] == 0.5
    assert len(state.bodies) == 20
    assert len(state.probes) == 1 and result["settings"]["prompt_words"] == 6  # 12 tokens at 2 tokens a word
    assert {len(b["prompt"].split()) for b in state.bodies} == {6}
    for level, c in zip(result["results"], (1, 3), strict=True):
        assert level["concurrency"] == c
        assert (level["completed"], level["failed"]) == (8, 2)  # requests 5 and 10 of each level
        assert level["errors"] == [{"message": "HTTP 500: injected failure", "count": 2}]
        assert level["total_output_tokens"] == 8 * CHUNKS * TOKENS_PER_CHUNK
        assert level["mean_prompt_tokens"] == 12 and level["requests_without_usage"] == 0
        assert level["median_ttft_ms"] >= FIRST_DELAY_S * 1000
        assert level["median_e2el_ms"] >= level["median_ttft_ms"]
        # chunks with text come GAP_S apart (the first, textless chunk does not count as one)
        assert level["median_itl_ms"] >= 0.8 * GAP_S * 1000 and level["median_tpot_ms"] > 0
        assert level["request_throughput"] > 0 and level["total_token_throughput"] > level["output_throughput"]
    json.dumps(result, allow_nan=False)


def test_no_usage_falls_back_to_chunks(server: tuple[str, FakeState]) -> None:
    url, _ = server
    result = loadgen.run(loadgen.Settings(url=url, model="nousage", concurrency=(2,), num_prompts=4, prompt_len=7,
                                          request_rate=50.0, timeout_s=20))
    level = result["results"][0]
    assert level["completed"] == 4 and level["requests_without_usage"] == 4
    assert level["total_output_tokens"] == 4 * CHUNKS and level["total_input_tokens"] == 4 * 7
    assert level["mean_prompt_tokens"] is None


def test_stream_errors_and_timeouts_count_as_failed(server: tuple[str, FakeState]) -> None:
    url, _ = server
    level = loadgen.run(loadgen.Settings(url=url, model="midfail", concurrency=(4,), num_prompts=6,
                                         timeout_s=20))["results"][0]
    assert (level["completed"], level["failed"]) == (0, 6)
    messages = {e["message"]: e["count"] for e in level["errors"]}
    assert messages == {"error in stream: boom mid-stream": 5, "HTTP 500: injected failure": 1}
    t0 = time.perf_counter()
    level = loadgen.run(loadgen.Settings(url=url, model="slow", concurrency=(2,), num_prompts=2,
                                         timeout_s=0.3))["results"][0]
    assert time.perf_counter() - t0 < 1.9
    assert level["failed"] == 2 and level["errors"] == [{"message": "timed out after 0.3 s", "count": 2}]


def test_shared_prefix(server: tuple[str, FakeState]) -> None:
    """--shared-prefix: every prompt of every level starts with the same text of about N tokens, then its own
    fresh part of --prompt-len; the prefix's tokens and the server's cached tokens are reported; a prompt
    the server refuses is a one-line error naming both options."""
    url, state = server
    result = loadgen.run(loadgen.Settings(url=url, model="cached", concurrency=(1, 2), num_prompts=4, prompt_len=12,
                                          max_tokens=12, shared_prefix=20, timeout_s=20))
    assert result["settings"]["shared_prefix"] == 20 and result["settings"]["shared_prefix_tokens"] == 20
    prompts = [b["prompt"] for b in state.bodies]
    prefix = prompts[0].split("\n\n")[0] + "\n\n"
    assert len(prefix.split()) == 10 and all(p.startswith(prefix) for p in prompts)  # 2 tokens a word
    own = [p[len(prefix):] for p in prompts]
    assert {len(o.split()) for o in own} == {6} and len(set(own)) == len(own)  # fresh per request and level
    assert not any(o.startswith(prefix.split()[0] + " " + prefix.split()[1]) for o in own)
    for level in result["results"]:
        assert level["cached_prompt_tokens"] == 8 * level["completed"]
    state.__init__()
    plain = loadgen.run(loadgen.Settings(url=url, concurrency=(1,), num_prompts=2, prompt_len=12, timeout_s=20))
    assert plain["settings"]["shared_prefix_tokens"] is None and plain["results"][0]["cached_prompt_tokens"] is None
    with pytest.raises(UsageError, match="--shared-prefix 500 with --prompt-len 12"):
        loadgen.run(loadgen.Settings(url=url, concurrency=(1,), num_prompts=2, prompt_len=12, shared_prefix=500))


# ---- the CLI ----------------------------------------------------------------------------------------


def gptport(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPTPORT_DEBUG"}
    return subprocess.run([sys.executable, "-m", "gptport.cli.main", *args], capture_output=True, env=env,
                          check=False, text=True, encoding="utf-8", timeout=120)


def test_cli_table_and_json(server: tuple[str, FakeState], tmp_path: Path) -> None:
    url, _ = server
    r = gptport("bench-serve", url, "--concurrency", "2", "--num-prompts", "5", "--max-tokens", "12", "--json", "-")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert set(result) == {"url", "model", "settings", "machine", "results"}
    assert result["results"][0]["failed"] == 1
    assert "TTFT" in r.stderr and "injected failure" in r.stderr
    out = tmp_path / "serve.json"
    r = gptport("bench-serve", url, "--model", "nousage", "--concurrency", "1", "--num-prompts", "2",
                "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert json.loads(out.read_text())["results"][0]["requests_without_usage"] == 2
    assert "no usage chunk" in r.stderr


def _assert_one_line_error(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("gptport: error: ")
    for needle in needles:
        assert needle in line


def test_cli_unreachable_url_and_bad_options() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    _assert_one_line_error(gptport("bench-serve", url, "--num-prompts", "2"), 1, url, "does not answer")
    _assert_one_line_error(gptport("bench-serve", url, "--concurrency", "0,2"), 2, "--concurrency")
    _assert_one_line_error(gptport("bench-serve", url, "--request-rate", "-1"), 2, "--request-rate")
    _assert_one_line_error(gptport("bench-serve", url, "--shared-prefix", "-1"), 2, "--shared-prefix")
