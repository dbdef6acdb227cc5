"""Tool calls read back from a reply (tool_stream.py) and the schemas their arguments are generated under
(tools.py): a call cut at every character, streamed in pieces of every size, the Collector's response and
stream valid under the OpenAPI document, and the grammar of a non-strict `parameters` schema checked with
llguidance on the test tokenizer. No server here (the app runs in-process without its model)."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from gptport import tokenizer as bpe
from gptport.runtime.constraint import Grammars
from gptport.serve.api import protocol
from gptport.serve.api.chat_template import plain
from gptport.serve.api.collector import Collector, stream_chunks
from gptport.serve.api.tool_stream import CallReader, ReplyStream, whole_message
from gptport.serve.api.tools import OPEN, Tools, generation_schema, parse_tools, reply_spec
from gptport.serve.engine.events import Finish, Piece
from gptport.serve.http.app import create_app
from gptport.serve.settings import Settings
from tests.support.openapi_check import Conformance, pointer

# a LangChain / Agents SDK tool: no additionalProperties, no bounds
LOOSE = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
NOTE = {"type": "object", "properties": {"text": {"type": "string"}, "tags": {"type": "array", "items": {
    "type": "object", "properties": {"k": {"type": "string"}}}}}}
TOOLS = [{"type": "function", "function": {"name": "add_one", "parameters": LOOSE}},
         {"type": "function", "function": {"name": "note", "parameters": NOTE}}]
ARGS = '{"text":"a } ] \\" { [ \\\\","tags":[{"k":"x"},{"k":"{"}]}'
REPLY = f'{OPEN}{{"name":"note","arguments":{ARGS}}}</tool_call>'


def tools(choice: Any = "auto", defined: list[dict[str, Any]] | None = None) -> Tools:
    parsed = parse_tools({"tools": defined or TOOLS, "tool_choice": choice})
    assert parsed is not None
    return parsed


def test_generation_schema_closes_the_objects_it_can() -> None:
    assert generation_schema(LOOSE) == {**LOOSE, "additionalProperties": False}
    closed = generation_schema(NOTE)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["tags"]["items"]["additionalProperties"] is False
    kept = [{"type": "object"},  # no properties listed: any object, as the schema says
            {"properties": {"a": {}}, "additionalProperties": True},
            {"properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
            {"properties": {"a": {}}, "anyOf": [{"properties": {"b": {}}}]},  # closed, one would refuse the other's
            {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
            {"not": {"properties": {"a": {}}}}]
    for schema in kept:
        assert generation_schema(schema) == schema, schema
    optional = generation_schema({"anyOf": [{"properties": {"a": {}}}, {"type": "null"}]})
    assert optional["anyOf"][0]["additionalProperties"] is False  # a member alone describes its value
    assert generation_schema({"$defs": {"P": {"properties": {"a": {}}}}, "$ref": "#/$defs/P"})["$defs"]["P"] == \
        {"properties": {"a": {}}, "additionalProperties": False}


def _accepts(grammars: Grammars, tok: bpe.BPETokenizer, grammar: str, text: str) -> bool:
    matcher = grammars.matcher(grammar, json=True)
    return all(matcher.consume(t) for t in tok.encode(text))


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_a_non_strict_call_takes_only_its_listed_properties(tok: bpe.BPETokenizer, choice: str) -> None:
    grammars = Grammars(tok.json, tok.vocab_size, tok.eot_id)
    spec = reply_spec(tools(choice), None)
    assert spec is not None
    grammar = grammars.compile(spec)
    call = OPEN + '{"name":"add_one","arguments":{"a":%s}}</tool_call>'
    assert _accepts(grammars, tok, grammar, call % "12")
    assert not _accepts(grammars, tok, grammar, call % '12,"b":3')
    assert not _accepts(grammars, tok, grammar, OPEN + '{"arguments":{"a":1},"name":"add_one"}')  # the name first
    assert _accepts(grammars, tok, grammar, REPLY)
    opened = [{"type": "function", "function": {"name": "f", "parameters": {**LOOSE, "additionalProperties": True}}}]
    spec = reply_spec(tools(choice, opened), None)
    assert spec is not None
    assert _accepts(grammars, tok, grammars.compile(spec), OPEN + '{"name":"f","arguments":{"a":1,"b":2}}')


def test_a_reply_cut_anywhere_is_never_content() -> None:
    auto = tools()
    for cut in range(len(REPLY) + 1):
        text = REPLY[:cut]
        message, reason = whole_message(text, "length", auto)
        if cut == 0:  # nothing written: an empty text reply
            assert message == {"role": "assistant", "content": ""} and reason == "length"
            continue
        assert message["content"] is None and reason == ("tool_calls" if cut == len(REPLY) else "length"), text
        named = cut >= REPLY.index('"note"') + len('"note"')
        assert ("tool_calls" in message) == named, text
        if named:
            (call,) = message["tool_calls"]
            assert call["id"].startswith("call_") and call["type"] == "function"
            assert call["function"]["name"] == "note" and ARGS.startswith(call["function"]["arguments"]), text
    message, reason = whole_message(REPLY, "stop", auto)
    assert reason == "tool_calls" and json.loads(message["tool_calls"][0]["function"]["arguments"]) == json.loads(ARGS)
    stopped = whole_message(REPLY[:40], "stop", auto)  # a stop sequence inside the call: cut, said as stop
    assert stopped[1] == "stop" and stopped[0]["content"] is None and stopped[0]["tool_calls"]
    assert whole_message("<tool", "stop", auto) == ({"role": "assistant", "content": "<tool"}, "stop")  # text
    assert whole_message("hello", "length", auto) == ({"role": "assistant", "content": "hello"}, "length")


def test_one_allowed_function_is_named_from_the_first_token() -> None:
    for choice in ("required", {"type": "function", "function": {"name": "add_one"}}):
        message, reason = whole_message("<to", "length", tools(choice, TOOLS[:1] if choice == "required" else None))
        assert reason == "length" and message["tool_calls"][0]["function"] == {"name": "add_one", "arguments": ""}
    message, reason = whole_message("<to", "length", tools("required"))  # two functions: no name yet
    assert message == {"role": "assistant", "content": None} and reason == "length"


def stream(reply: ReplyStream, text: str, sizes: random.Random, reason: str) -> list[tuple[list[Any], Any]]:
    steps, at = [], 0
    while at < len(text):
        n = sizes.randint(1, 6)
        steps.append(reply.step(text[at:at + n], None))
        at += n
    steps.append(reply.step("", reason))
    return steps


@pytest.mark.parametrize("seed", range(6))
def test_a_streamed_call_is_openais_deltas(seed: int) -> None:
    rng = random.Random(seed)
    for choice, cut, reason in (("auto", len(REPLY), "stop"), ("required", len(REPLY), "stop"),
                                ("auto", rng.randint(30, len(REPLY) - 1), "length")):
        steps = stream(ReplyStream(tools(choice)), REPLY[:cut], rng, reason)
        deltas = [d for ds, _ in steps for d in ds]
        assert [r for _, r in steps[:-1]] == [None] * (len(steps) - 1)
        assert steps[-1][1] == ("tool_calls" if cut == len(REPLY) else "length")
        assert all(set(d) == {"tool_calls"} for d in deltas), deltas  # never content
        first, *rest = (d["tool_calls"] for d in deltas)
        assert first == [{"index": 0, "id": first[0]["id"], "type": "function",
                          "function": {"name": "note", "arguments": ""}}]
        assert all(len(r) == 1 and set(r[0]) == {"index", "function"} and set(r[0]["function"]) == {"arguments"}
                   and r[0]["function"]["arguments"] for r in rest), rest
        arguments = "".join(r[0]["function"]["arguments"] for r in rest)
        whole, _ = whole_message(REPLY[:cut], reason, tools(choice))
        assert arguments == whole["tool_calls"][0]["function"]["arguments"]
        name_at = REPLY.index('"note"') + len('"note"')
        held = sum(1 for ds, _ in steps if not ds)  # steps that sent nothing: before the name was whole
        assert 0 < held <= name_at


def test_streamed_text_is_held_only_while_it_may_open_a_call() -> None:
    reply = ReplyStream(tools())
    assert reply.step("<to", None) == ([], None)
    assert reply.step("ol", None) == ([], None)
    assert reply.step("s!", None) == ([{"content": "<tools!"}], None)
    assert reply.step(" and", None) == ([{"content": " and"}], None)
    assert reply.step("", "stop") == ([], "stop")
    assert ReplyStream(tools()).step("hi", "length") == ([{"content": "hi"}], "length")
    assert ReplyStream(tools()).step("<tool_c", "length") == ([], "length")  # a call cut before its name
    first = ReplyStream(tools("required", TOOLS[:1])).step("<", None)
    assert first[0][0]["tool_calls"][0]["function"] == {"name": "add_one", "arguments": ""}  # from the first token


def test_the_reader_sees_each_character_once() -> None:
    reader = CallReader()
    for c in REPLY:
        reader.feed(c)
    assert reader.name == "note" and reader.arguments == ARGS and reader.complete
    scalar = CallReader()
    scalar.feed(OPEN + '{"name": "f", "arguments": 12')
    assert scalar.arguments == "12" and not scalar.complete
    scalar.feed("} </tool_call>")
    assert scalar.arguments == "12" and scalar.complete


def test_the_collectors_calls_conform(tok: bpe.BPETokenizer) -> None:
    """A whole call, text, a call cut by length after its name and one cut before it, as api/collector.py makes
    the response and the stream from the scheduler's events: valid under the OpenAPI document, no markup."""
    check = Conformance(TestClient(create_app(Settings(Path("no-model"), model_name="m"))).get("/openapi.json").json())
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "n": 4, "logprobs": True, "tools": TOOLS}
    job = protocol.chat_job(body, tok, 1024, 4, plain)
    events = [(0, Piece(REPLY[:5])), (1, Piece("no call")), (0, Piece(REPLY[5:])), (0, Finish("stop", 9, 20)),
              (1, Finish("length", 9, 2)), (2, Piece(REPLY[:40])), (3, Piece(REPLY[:14])), (2, Finish("length", 9, 9)),
              (3, Finish("length", 9, 5))]
    collector = Collector(job, tok)
    for index, event in events:
        collector.add(index, event)
    response = collector.response()
    check.validate("components/schemas/ChatCompletion", response)
    assert [c["finish_reason"] for c in response["choices"]] == ["tool_calls", "length", "length", "length"]
    assert response["choices"][2]["message"]["tool_calls"][0]["function"] == {"name": "note", "arguments": ARGS[:2]}
    assert response["choices"][3]["message"] == {"role": "assistant", "content": None}

    async def stream() -> str:
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        for item in events:
            queue.put_nowait(item)
        return "".join([part async for part in stream_chunks(job, Collector(job, tok), queue, 4, lambda: None)])

    at = pointer("paths", "/v1/chat/completions", "post", "responses", "200", "content", "text/event-stream", "schema")
    chunks = [c["choices"][0] for c in check._events(at, asyncio.run(stream()))[:-1] if c["choices"]]
    assert not any("<tool" in (c["delta"].get("content") or "") for c in chunks)
    calls = [c for c in chunks if "tool_calls" in c["delta"]]
    assert {c["index"] for c in calls} == {0, 2}
    assert "".join(c["delta"]["tool_calls"][0]["function"]["arguments"] for c in calls if c["index"] == 0) == ARGS
    assert [c["delta"] for c in chunks if c["index"] == 3] == [{"role": "assistant", "content": ""}, {}]
