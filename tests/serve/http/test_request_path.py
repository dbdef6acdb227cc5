"""The one request path every POST route takes (serve/http/request_path.py), in process and with no model:
its steps in their order (admit -> body -> model -> ready), the same for each generation route, /tokenize
not admitted (it never reaches the scheduler)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from gptport.serve.http.app import create_app
from gptport.serve.settings import Settings

GENERATE = ("/v1/completions", "/v1/chat/completions", "/v1/responses")


@pytest.fixture
def client() -> TestClient:
    return TestClient(create_app(Settings(Path("no-model"), model_name="m", max_body=64)))  # no lifespan: no load


def code(client: TestClient, route: str, body: bytes) -> tuple[int, str]:
    r = client.post(route, content=body, headers={"content-type": "application/json"})
    return r.status_code, r.json()["error"]["code"]


@pytest.mark.parametrize("route", GENERATE)
def test_each_step_refuses_before_the_next(client: TestClient, route: str) -> None:
    assert code(client, route, b"x" * 65) == (413, "body_too_large")  # the body's limit before its JSON
    assert code(client, route, b"{") == (400, "invalid_json")  # its JSON before the model it names
    assert code(client, route, b'{"model": "other"}') == (404, "model_not_found")  # the model before loading
    assert code(client, route, b'{"model": "m"}') == (503, "not_ready")


@pytest.mark.parametrize("route", GENERATE)
def test_a_full_queue_refuses_before_the_body_is_read(client: TestClient, route: str) -> None:
    client.app.state.gptport.scheduler = SimpleNamespace(full=True)
    assert code(client, route, b"{") == (429, "queue_full")


def test_tokenize_is_not_admitted(client: TestClient) -> None:
    client.app.state.gptport.scheduler = SimpleNamespace(full=True)
    assert code(client, "/tokenize", b"{") == (400, "invalid_json")
