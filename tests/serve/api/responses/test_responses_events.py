"""POST /v1/responses' translation of the chat path's answers, in process (no model): a chat stream driven with
the scheduler's events (a failure mid-stream, a client that leaves), and the chat shapes a tool call may take
(whole at the end, or in pieces from its first token, cut short by max_output_tokens, after some text), each
turned into Responses events and objects valid under the server's OpenAPI document."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from gptport import tokenizer as bpe
from gptport.serve.api.chat_template import plain
from gptport.serve.api.collector import Collector, stream_chunks
from gptport.serve.api.responses.from_chat import Reply
from gptport.serve.api.responses.to_chat import responses_job
from gptport.serve.engine.events import Failure, Piece
from gptport.serve.http.app import create_app
from gptport.serve.settings import Settings
from tests.support.openapi_check import Conformance

TOOLS = [{"type": "function", "name": "add", "parameters": {"type": "object"}}]


@pytest.fixture(scope="module")
def document() -> Conformance:
    client = TestClient(create_app(Settings(Path("no-model"), model_name="m")))
    return Conformance(client.get("/openapi.json").json())


def reply(tok: bpe.BPETokenizer, **body: Any) -> Reply:
    job, echo = responses_job({"input": "hi", **body}, tok, 1024, 2, plain)
    job = replace(job, model="m")  # as the route names it (Jobs are frozen)
    return Reply(job, echo)


def sse(chunk: dict[str, Any] | str) -> str:
    return f"data: {chunk if isinstance(chunk, str) else json.dumps(chunk)}\n\n"


async def chunks_of(parts: list[str]) -> AsyncIterator[str]:
    for part in parts:
        yield part


def run(r: Reply, chunks: AsyncIterator[str], document: Conformance) -> list[dict[str, Any]]:
    """Every event of the translated stream, each checked against the document."""
    async def collect() -> str:
        return "".join([part async for part in r.stream(chunks)])

    out = []
    for block in asyncio.run(collect())[:-2].split("\n\n"):
        head, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        document.validate("components/schemas/ResponseStreamEvent", event)
        out.append(event)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def delta(**d: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": d, "finish_reason": None}]}


def finish(reason: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
                                  "prompt_tokens_details": {"cached_tokens": 2}}}


def test_a_call_in_pieces_cut_short_after_text(tok: bpe.BPETokenizer, document: Conformance) -> None:
    """Text, then a call streamed from its first token and cut short by max_output_tokens: a message item closed
    before the function_call item opens, both incomplete, and response.incomplete with the chat usage."""
    r = reply(tok, tools=TOOLS)
    parts = [sse(delta(role="assistant", content="")), sse(delta(content="I add")),
             sse(delta(tool_calls=[{"index": 0, "id": "call_1", "type": "function",
                                    "function": {"name": "add", "arguments": ""}}])),
             sse(delta(tool_calls=[{"index": 0, "function": {"arguments": '{"a"'}}])),
             sse(delta(tool_calls=[{"index": 0, "function": {"arguments": ": 1"}}])) + sse(finish("length")),
             sse(USAGE) + sse("[DONE]")]
    events = run(r, chunks_of(parts), document)
    kinds = [e["type"] for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                     "response.content_part.done", "response.output_item.done", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done", "response.incomplete"]
    final = events[-1]["response"]
    message, call = final["output"]
    assert message["content"][0]["text"] == "I add" and message["status"] == "completed"  # done before the call
    assert (call["call_id"], call["name"], call["arguments"], call["status"]) == ("call_1", "add", '{"a": 1',
                                                                                  "incomplete")
    assert [e["output_index"] for e in events[2:-1]] == [0] * 6 + [1] * 5
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["usage"] == {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 2}, "output_tokens": 7,
                              "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 12}
    whole = r.response({"choices": [{"index": 0, "finish_reason": "length", "message": {
        "role": "assistant", "content": "I add", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "add", "arguments": '{"a": 1'}}]}}], "usage": USAGE["usage"]})
    document.validate("components/schemas/Response", whole)
    strip = [{k: v for k, v in item.items() if k != "id"} for item in whole["output"]]
    assert strip == [{k: v for k, v in item.items() if k != "id"} for item in final["output"]]
    assert whole["status"] == "incomplete"


def test_a_whole_call_and_an_empty_reply(tok: bpe.BPETokenizer, document: Conformance) -> None:
    call = {"index": 0, "id": "call_2", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}
    events = run(reply(tok, tools=TOOLS), chunks_of([sse(delta(role="assistant", content="")),
                                                     sse(delta(tool_calls=[call])) + sse(finish("tool_calls")),
                                                     sse(USAGE) + sse("[DONE]")]), document)
    assert events[-1]["type"] == "response.completed"
    (item,) = events[-1]["response"]["output"]
    assert (item["type"], item["arguments"], item["status"]) == ("function_call", '{"a": 2}', "completed")
    empty = run(reply(tok), chunks_of([sse(delta(role="assistant", content="")) + sse(finish("stop")),
                                       sse(USAGE) + sse("[DONE]")]), document)
    (message,) = empty[-1]["response"]["output"]
    assert message["content"][0]["text"] == "" and "response.output_text.delta" not in [e["type"] for e in empty]


def test_a_failure_mid_stream_is_response_failed(tok: bpe.BPETokenizer, document: Conformance) -> None:
    """The scheduler's events through the chat stream (api/collector.py) into the translation: text, then a failure."""
    r = reply(tok)
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    for event in (Piece("ka"), Failure("the engine failed")):
        queue.put_nowait((0, event))
    events = run(r, stream_chunks(r.job, Collector(r.job, tok), queue, 1, lambda: None), document)
    assert [e["type"] for e in events][-2:] == ["response.output_text.delta", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"] == {"code": "server_error", "message": "the engine failed"}


def test_a_client_that_leaves_cancels_the_choice(tok: bpe.BPETokenizer) -> None:
    r = reply(tok, max_output_tokens=50)
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    cancelled: list[bool] = []

    async def leave() -> list[str]:
        stream = r.stream(stream_chunks(r.job, Collector(r.job, tok), queue, 1, lambda: cancelled.append(True)))
        got = [await anext(stream)]  # response.created and response.in_progress
        queue.put_nowait((0, Piece("ka")))
        got.append(await anext(stream))
        await stream.aclose()  # what Starlette does when the client disconnects
        return got

    got = asyncio.run(leave())
    assert "response.in_progress" in got[0] and "response.output_text.delta" in got[1]
    assert cancelled == [True]
