"""GET /openapi.json checked against the implementation: the app's routes and methods, the fields the parser
honours (each documented example accepted, each value the schema refuses refused by the parser, naming the
field), the error codes the source raises, and every response these tests see (in-process without a model:
401, 404, 413, 503; a real server: 200s, streams, 400s, 429) valid under the document."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from jsonschema import Draft202012Validator
from starlette.testclient import TestClient

from gptport import tokenizer as bpe
from gptport.serve.api import fields, protocol, tokenize
from gptport.serve.api.api_error import ApiError
from gptport.serve.api.chat_template import plain
from gptport.serve.api.collector import Collector, stream_chunks
from gptport.serve.api.openapi_schemas import CODES_400, REQUESTS, Limits, request_body
from gptport.serve.api.responses import to_chat
from gptport.serve.engine.events import Finish, Piece
from gptport.serve.http import app as app_module
from gptport.serve.http import openapi
from gptport.serve.http.app import create_app
from gptport.serve.settings import Settings
from tests.support import openapi_check
from tests.support.openapi_check import Conformance
from tests.support.serving import LONG, Raw, Served, attempts, serve, wait_idle

SLOTS = 2
CTX = 1024  # the in-process parser's context: room for a tool block


def inprocess(**settings: Any) -> TestClient:
    """The app without its lifespan: the model never loads (every route that needs it answers 503)."""
    return TestClient(create_app(Settings(Path("no-model"), model_name="m", **settings)))


def test_document_is_valid_openapi_and_lists_every_route() -> None:
    client = inprocess()
    doc = client.get("/openapi.json").json()
    schemathesis.openapi.from_dict(doc).validate()  # against the OpenAPI 3.1 meta-schema
    for schema in doc["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    app = client.app.app  # type: ignore[attr-defined]  # Guard around the Starlette app
    routes = openapi.route_methods(app.routes)
    documented = {(path, method) for path, item in doc["paths"].items() for method in item}
    assert routes == documented == set(openapi.OPERATIONS), (routes ^ documented, routes ^ set(openapi.OPERATIONS))
    for path, item in doc["paths"].items():  # PUBLIC routes need no key; every other route may answer 401
        for op in item.values():
            assert (op.get("security") == []) == (path in app_module.PUBLIC), path
            assert ("401" in op["responses"]) == (path not in app_module.PUBLIC), path
    assert "/openapi.json" in app_module.PUBLIC


def test_request_fields_are_the_parsers() -> None:
    limits = Limits("m", SLOTS, 512, 1 << 20)
    expected = {"CompletionRequest": fields.COMPLETION | fields.EXTRAS_COMPLETION,
                "ChatRequest": fields.CHAT | fields.EXTRAS_CHAT,
                "TokenizeRequest": tokenize.TOKENIZE, "DetokenizeRequest": tokenize.DETOKENIZE,
                "ResponsesRequest": set(fields.ROUTE_FIELDS["responses"])}
    assert set(REQUESTS) == set(expected)
    for name, names in expected.items():
        assert set(request_body(name, limits)["properties"]) == names, name


def test_error_codes_are_the_sources() -> None:
    """Each status the serve package raises is documented with the codes it raises it with (bad() is a 400;
    499 goes to a client that has left); the documented 400 codes are the ones raised."""
    serve = Path(protocol.__file__).parents[1]  # gptport/serve: its request side, model host and HTTP app
    source = "\n".join(p.read_text() for p in serve.rglob("*.py") if p.parent.name not in ("engine", "ray"))
    raised = [(int(status or 400), code) for status, code in
              re.findall(r'(?:(?<!def )bad\(|ApiError\((\d{3}),)(?:(?!bad\(|ApiError\().){0,400}?"([a-z_]+)"\)',
                         source, re.S)]
    assert len(raised) > 20 and {s for s, _ in raised} >= {400, 401, 404, 413, 429}, raised
    for status, code in raised:
        if status != 499:
            assert status in openapi.ERRORS and code in openapi.ERRORS[status][1], (status, code)
    assert {c for s, c in raised if s == 400} == set(CODES_400)


# ---- the parser against the schemas --------------------------------------------------------------------------------


def parse(route: str, body: dict[str, Any], tok: bpe.BPETokenizer) -> Any:
    if route == "CompletionRequest":
        return protocol.completion_job(body, tok, CTX, SLOTS)
    if route == "ChatRequest":
        return protocol.chat_job(body, tok, CTX, SLOTS, plain)
    if route == "TokenizeRequest":
        return tokenize.tokenize(body, tok, CTX, plain)
    if route == "ResponsesRequest":
        return to_chat.responses_job(body, tok, CTX, SLOTS, plain)
    return tokenize.detokenize(body, tok)


BASE = {"CompletionRequest": {"prompt": "ka"}, "ChatRequest": {"messages": [{"role": "user", "content": "hi"}]},
        "TokenizeRequest": {"messages": [{"role": "user", "content": "hi"}]}, "DetokenizeRequest": {"tokens": [1]},
        "ResponsesRequest": {"input": "hi"}}
POOL: list[Any] = ["x", "", 1.5, True, False, 0, -1, 7, 10**30, -(10**30), [], [1], ["x"], {}, {"x": 1}, 101, -101,
                   float("inf"), [1.5], [True], [{"role": 1}], [{"type": "function"}]]


def candidates(schema: dict[str, Any]) -> list[Any]:
    """Values to try on a field: a fixed pool and the values just past the schema's bounds."""
    out = list(POOL)
    for s in [schema, *schema.get("anyOf", [])]:
        out += [s[k] - 1 for k in ("minimum",) if k in s] + [s[k] + 1 for k in ("maximum",) if k in s]
        out += [s["exclusiveMinimum"]] if "exclusiveMinimum" in s else []
        out += [["x"] * (s["maxItems"] + 1)] if "maxItems" in s else []
        items = s.get("items", {})
        out += [[items["maximum"] + 1]] if "maximum" in items else []
    return out


@pytest.mark.parametrize("route", sorted(REQUESTS))
def test_schemas_agree_with_the_parser(route: str, tok: bpe.BPETokenizer) -> None:
    """Each field's documented examples are accepted; each candidate value its schema refuses, the parser refuses
    with a 400 naming that field (`model` is the app's to check: a 404, below)."""
    limits = Limits("m", SLOTS, tok.vocab_size, 1 << 20)
    body_schema = request_body(route, limits)
    for name, schema in body_schema["properties"].items():
        examples = next((s["examples"] for s in [schema, *schema.get("anyOf", [])] if "examples" in s), None)
        assert examples, f"{route}.{name} has no example"
        base = {} if route == "TokenizeRequest" and name in ("prompt", "content", "messages") else BASE[route]
        for value in examples:
            if name != "model":
                parse(route, {**base, name: value}, tok)  # raises ApiError if refused
        if name == "model":
            continue
        validator = Draft202012Validator(schema)
        for value in candidates(schema):
            if validator.is_valid(value):
                continue
            with pytest.raises(ApiError) as e:
                parse(route, {**base, name: value}, tok)
                pytest.fail(f"{route}: {name}={value!r:.60} is refused by the schema, accepted by the parser")
            assert e.value.status == 400 and (e.value.param or "").startswith(name), (name, value, e.value.message)


# ---- responses -----------------------------------------------------------------------------------------------------


def test_answers_without_a_model_conform() -> None:
    """401 (API key), 404 (model), 413 (body), 400 (JSON), 503 (loading), /health 503, the page, the document."""
    client = inprocess(api_key="k", max_body=1000)
    check = Conformance(client.get("/openapi.json").json())
    key = {"Authorization": "Bearer k"}
    cases: list[tuple[str, str, Any, dict[str, str], int]] = [
        ("/metrics", "GET", None, {}, 401), ("/v1/models", "GET", None, {}, 401),
        ("/v1/models/{name}", "GET", None, {}, 401), ("/v1/completions", "POST", {"prompt": "ka"}, {}, 401),
        ("/health", "GET", None, {}, 503), ("/", "GET", None, {}, 200), ("/openapi.json", "GET", None, {}, 200),
        ("/metrics", "GET", None, key, 200), ("/v1/models", "GET", None, key, 200),
        ("/v1/models/{name}", "GET", None, key, 404), ("/v1/chat/completions", "POST", {"model": 5}, key, 404),
        ("/tokenize", "POST", {"prompt": "x" * 2000}, key, 413), ("/detokenize", "POST", b"{", key, 400),
        ("/v1/completions", "POST", {"prompt": "ka"}, key, 503), ("/tokenize", "POST", {"prompt": "ka"}, key, 503),
        ("/detokenize", "POST", {"tokens": [1]}, key, 503), ("/v1/chat/completions", "POST", {"n": 1}, key, 503),
        ("/v1/responses", "POST", {"input": "ka"}, {}, 401), ("/v1/responses", "POST", {"input": "ka"}, key, 503),
        ("/tokenizer_info", "GET", None, {}, 401), ("/tokenizer_info", "GET", None, key, 503),
    ]
    for path, method, body, headers, status in cases:
        url = path.replace("{name}", "other")
        data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
        r = client.request(method, url, content=data, headers=headers)
        assert r.status_code == status, (path, r.text)
        check.check(path, method, r.status_code, r.headers, r.content)


def test_tool_calls_conform(tok: bpe.BPETokenizer) -> None:
    """A reply that is a tool call, as the response and as a stream (the served model's context is too short for
    a tool block: api/collector.py is driven with the events the scheduler would send)."""
    check = Conformance(inprocess().get("/openapi.json").json())
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "n": 2,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}
    job = protocol.chat_job(body, tok, CTX, SLOTS, plain)
    reply = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    events = [(0, Piece(reply[:5])), (1, Piece("no call")), (0, Piece(reply[5:])), (0, Finish("stop", 9, 20)),
              (1, Finish("length", 9, 2))]
    collector = Collector(job, tok)
    for index, event in events:
        collector.add(index, event)
    response = collector.response()
    assert response["choices"][0]["finish_reason"] == "tool_calls", response
    check.validate("components/schemas/ChatCompletion", response)

    async def stream() -> str:
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        for item in events:
            queue.put_nowait(item)
        return "".join([part async for part in stream_chunks(job, Collector(job, tok), queue, 2, lambda: None)])

    chunks = check._events(openapi_check.pointer("paths", "/v1/chat/completions", "post", "responses", "200",
                                                 "content", "text/event-stream", "schema"), asyncio.run(stream()))
    assert any("tool_calls" in c["choices"][0]["delta"] for c in chunks[:-1] if c["choices"]), chunks


@pytest.fixture(scope="module")
def server(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Two slots and no queue (a third choice is a 429)."""
    with serve(trained_dir, tmp_path_factory.mktemp("openapi") / "serve.log", "--slots", str(SLOTS),
               "--max-queue", "0") as s:
        yield s


def test_served_answers_conform(server: Served) -> None:
    doc = httpx.get(server.url + "/openapi.json", timeout=10).json()
    assert doc["components"]["schemas"]["DetokenizeRequest"]["properties"]["tokens"]["items"]["maximum"] > 0
    check = Conformance(doc)
    msgs = [{"role": "user", "content": "ka"}]
    c, chat = "/v1/completions", "/v1/chat/completions"
    cases: list[tuple[str, str, Any, int]] = [
        ("/health", "GET", None, 200), ("/v1/models", "GET", None, 200), ("/metrics", "GET", None, 200),
        (c, "POST", {"prompt": "ka", "max_tokens": 4}, 200),
        (c, "POST", {"prompt": ["ka", [5, 6]], "max_tokens": 3, "logprobs": 2, "echo": True}, 200),
        (c, "POST", {"prompt": "ka", "max_tokens": 4, "n": 2, "stream": True,
                     "stream_options": {"include_usage": True}}, 200),
        (c, "POST", {"prompt": "ka", "max_tokens": 4, "stream": True, "logprobs": 1, "echo": True}, 200),
        (c, "POST", {"prompt": "ka", "max_tokens": 8, "choice": ["yes", "no"]}, 200),
        (chat, "POST", {"messages": msgs, "max_tokens": 4, "logprobs": True, "top_logprobs": 2}, 200),
        (chat, "POST", {"messages": msgs, "max_tokens": 4, "stream": True, "logprobs": True}, 200),
        ("/tokenize", "POST", {"prompt": "ka to", "return_token_strs": True}, 200),
        ("/tokenize", "POST", {"messages": msgs, "with_pieces": True}, 200),
        ("/detokenize", "POST", {"tokens": [5, 6]}, 200), ("/tokenizer_info", "GET", None, 200),
        (c, "POST", {"prompt": "ka", "n": 3}, 400), (c, "POST", {"prompt": "ka " * 200}, 400),
        (c, "POST", {"prompt": "ka", "frobnicate": 1}, 400), (chat, "POST", {"messages": msgs, "audio": {}}, 400),
        (c, "POST", {"prompt": "ka", "regex": "("}, 400), ("/detokenize", "POST", {"tokens": [10**6]}, 400),
        (c, "POST", {"prompt": "ka", "model": "other"}, 404),
        ("/v1/responses", "POST", {"input": "ka", "max_output_tokens": 4}, 200),
        ("/v1/responses", "POST", {"input": "ka", "store": True}, 400),
    ]
    for path, method, body, status in cases:
        r = httpx.request(method, server.url + path, json=body, timeout=60)
        assert r.status_code == status, (path, body, r.text)
        check.check(path, method, r.status_code, r.headers, r.content)
    # a 429: both slots held by a long stream (n=2), no queue (the tiny model is fast: retried)
    for _ in attempts(10, 30):
        held = Raw(server, c, {"prompt": "ka", "n": SLOTS, "stream": True, **LONG})
        third = Raw(server, c, {"prompt": "ka", "max_tokens": 2})
        try:
            status, headers = third.head()
            third.json(headers)  # the whole body is in third.buf
        finally:
            held.close()
            third.close()
        wait_idle(server, 10)
        if status == 429:
            check.check(c, "POST", status, headers, third.buf[:int(headers["content-length"])])
            return
    pytest.fail("no 429 while both slots were busy and the queue is 0")
