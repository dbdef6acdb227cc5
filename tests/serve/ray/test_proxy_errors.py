"""The proxy's error middleware (gptport.serve.ray.proxy_errors): what a proxy in front of the replicas answers itself
becomes OpenAI's error object; a stream cut off mid-way ends with an error event and [DONE]. Driven with fake
inner apps (no Ray)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gptport.serve.ray.proxy_errors import OpenAIErrors
from tests.support.serving import assert_error


def call(inner: Any) -> tuple[int, dict[bytes, bytes], bytes]:
    """(status, headers, body) of one request through OpenAIErrors(inner)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(OpenAIErrors(inner)({"type": "http", "path": "/v1/completions"}, receive, send))
    assert sent[0]["type"] == "http.response.start", sent
    assert not sent[-1].get("more_body", False), sent  # the response ends
    return sent[0]["status"], dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


async def dies_first(scope: Any, receive: Any, send: Any) -> None:
    raise RuntimeError("the actor died")


async def says_nothing(scope: Any, receive: Any, send: Any) -> None:
    return None


async def text_timeout(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 408, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"Request timed out after 5s."})


async def stream_then_dies(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": b'data: {"choices": []}\n\n', "more_body": True})
    raise RuntimeError("the actor died")


async def good_json(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"error": {"message": "m", "type": "t", "param": "p", '
                                                      b'"code": null}}'})


def test_no_answer_is_a_502_error_object() -> None:
    for inner in (dies_first, says_nothing):
        status, headers, body = call(inner)
        assert headers[b"content-type"] == b"application/json"
        err = assert_error(status, json.loads(body), 502)
        assert err["type"] == "server_error" and err["code"] == "replica_failed"


def test_a_text_error_keeps_its_status_in_openai_shape() -> None:
    status, _, body = call(text_timeout)
    err = assert_error(status, json.loads(body), 408)
    assert "timed out" in err["message"]


def test_a_cut_stream_ends_with_an_error_event_and_done() -> None:
    status, _, body = call(stream_then_dies)
    assert status == 200
    events = [line[len("data: "):] for line in body.decode().split("\n\n") if line.startswith("data: ")]
    assert events[0] == '{"choices": []}' and events[-1] == "[DONE]", events
    assert_error(502, json.loads(events[1]), 502)


def test_replica_answers_pass_through() -> None:
    status, _, body = call(good_json)
    assert status == 400 and json.loads(body)["error"]["param"] == "p"
