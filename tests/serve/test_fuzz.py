"""Fuzzing a real `gptport serve` against its own OpenAPI document (GET /openapi.json): schemathesis generates
requests that fit the document (positive) and requests that break it (negative), a few hundred in all, under a
time limit. No answer is a 500; each has a documented status, content type, headers and body; a request the
document refuses is refused; afterwards a normal request succeeds and no slot is left busy. The raw bodies
the JSON parser sees are fuzzed in tests/serve/test_fuzz_body.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support.serving import Served, serve, wait_idle

SLOTS = 2
MAX_TOKENS = 4  # the document allows any max_tokens >= 1 (generation stops at n_ctx); the fuzz run caps it
BUDGET_S = 75.0  # all operations together; each stops generating when it runs out
EXAMPLES = {"post": 60, "get": 15}  # per operation and mode
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


@pytest.fixture(scope="module")
def server(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(trained_dir, tmp_path_factory.mktemp("fuzz") / "serve.log", "--slots", str(SLOTS)) as s:
        yield s


def integers(value: Any) -> Any:
    """Integral floats as ints: JSON Schema takes 2.0 for an integer, gptport (as OpenAI) does not, and
    half the generated token lists would be refused for it. The same JSON number: validity does not change."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [integers(v) for v in value]
    if isinstance(value, dict):
        return {k: integers(v) for k, v in value.items()}
    return value


def short(case: Any) -> Any:
    """Generated requests stay short: max_tokens, max_completion_tokens and max_output_tokens above MAX_TOKENS
    become MAX_TOKENS (any value >= 1 is valid, so a positive case stays positive and a negative one negative);
    integral floats become ints."""
    if isinstance(case.body, dict):
        case.body = integers(case.body)
    body = case.body
    if isinstance(body, dict):
        for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            value = body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
                body[name] = MAX_TOKENS
    return case


def fuzz(operation: Any, mode: GenerationMode, url: str, deadline: float) -> dict[int, int]:
    """Run one operation's generated cases in one mode until its examples or the deadline run out; how many
    answers of each status."""
    statuses: dict[int, int] = {}
    checks = CHECKS + ([negative_data_rejection] if mode is GenerationMode.NEGATIVE else [])

    @settings(max_examples=EXAMPLES[operation.method.lower()], deadline=None, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck), derandomize=True)
    @given(case=operation.as_strategy(generation_mode=mode).map(short))
    def run(case: Any) -> None:
        if time.monotonic() > deadline:
            return
        response = case.call(base_url=url, timeout=30)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        case.validate_response(response, checks=checks)

    run()
    return statuses


def test_schemathesis(server: Served) -> None:
    doc = httpx.get(server.url + "/openapi.json", timeout=10).json()
    schema = schemathesis.openapi.from_dict(doc)
    deadline = time.monotonic() + BUDGET_S
    seen: dict[str, dict[int, int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        post = operation.method.lower() == "post"  # a body to break (a string path parameter cannot be broken)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if post else (GenerationMode.POSITIVE,):
            t0 = time.monotonic()
            seen[f"{operation.label} {mode.value}"] = fuzz(operation, mode, server.url, deadline)
            print(f"{operation.label} {mode.value}: {time.monotonic() - t0:.1f} s")
    total = sum(sum(s.values()) for s in seen.values())
    print(f"schemathesis: {total} requests:", seen)
    assert 150 <= total <= 1000, seen  # fewer: the budget ran out (the machine is slow, or the server is)
    assert all(seen[f"POST {path} positive"].get(200) for path in ("/v1/completions", "/v1/chat/completions",
                                                                    "/v1/responses")), seen
    assert server.post("/v1/completions", {"prompt": "ka", "max_tokens": 2})[0] == 200
    wait_idle(server, 10)
    assert server.proc.poll() is None
