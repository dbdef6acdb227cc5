"""POST /v1/responses (OpenAI's Responses API, served stateless on the chat path) against a real `gptport serve`,
driven with httpx and the `openai` client: the response object and its stream of events, greedy text and usage
equal to chat completions' for the same messages, text.format, a tool call's round trip, the refusals, the API key
and /metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.support.openapi_check import Conformance
from tests.support.serving import Served, assert_error, metrics, sample, serve

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "color": {"enum": ["red", "green", "blue"]}},
          "required": ["name", "age", "color"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                        "b": {"type": "integer", "minimum": -99, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}
INSTRUCTIONS, PROMPT = "You help.", "ka to ri so ne"
MESSAGES = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": PROMPT}]
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": WEATHER,
          "strict": True},
         {"type": "function", "name": "add", "description": "Add two numbers", "parameters": ADD}]
PARAMS = {"get_weather": WEATHER, "add": ADD}
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS]


@pytest.fixture(scope="module")
def server(structured_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(structured_dir, tmp_path_factory.mktemp("serve") / "serve.log", "--slots", "4", "--api-key", "k") as s:
        yield s


KEY = {"Authorization": "Bearer k"}


@pytest.fixture(scope="module")
def model(server: Served) -> str:
    return str(server.get("/v1/models", KEY)[1]["data"][0]["id"])


@pytest.fixture(scope="module")
def client(server: Served) -> Any:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def document(server: Served) -> Conformance:
    return Conformance(httpx.get(server.url + "/openapi.json", timeout=10).json())


def post(server: Served, body: dict[str, Any], path: str = "/v1/responses") -> tuple[int, Any]:
    return server.post(path, body, KEY)


def stream(server: Served, body: dict[str, Any], document: Conformance) -> list[dict[str, Any]]:
    """A streamed response's events (each `event:` line the type of its `data:`), checked against the document."""
    out = []
    with httpx.stream("POST", server.url + "/v1/responses", json={**body, "stream": True}, headers=KEY,
                      timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.read()
        text = r.read().decode()
    assert text.endswith("\n\n"), text[-200:]
    schema_at = "paths/~1v1~1responses/post/responses/200/content/text~1event-stream/schema"
    for block in text[:-2].split("\n\n"):
        head, data = block.split("\n")
        assert head.startswith("event: ") and data.startswith("data: "), block
        document.validate(schema_at, {"event": head[len("event: "):], "data": data[len("data: "):]})
        event = json.loads(data[len("data: "):])
        document.validate("components/schemas/ResponseStreamEvent", event)
        assert event["type"] == head[len("event: "):]
        out.append(event)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def text_of(response: dict[str, Any]) -> str:
    return "".join(p["text"] for item in response["output"] if item["type"] == "message" for p in item["content"])


# ---- text ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("most", [6, 400])
def test_greedy_text_and_usage_equal_chats(server: Served, model: str, document: Conformance, most: int) -> None:
    """instructions + input give chat's system + user messages: the same greedy text, usage and finish (length:
    status incomplete, reason max_output_tokens)."""
    status, chat = post(server, {"model": model, "messages": MESSAGES, "temperature": 0, "max_tokens": most},
                        "/v1/chat/completions")
    assert status == 200, chat
    status, r = post(server, {"model": model, "instructions": INSTRUCTIONS, "input": PROMPT, "temperature": 0,
                              "max_output_tokens": most, "metadata": {"run": "1"}, "store": False, "user": "u"})
    assert status == 200, r
    document.validate("components/schemas/Response", r)
    assert r["id"].startswith("resp_") and r["object"] == "response" and r["model"] == model
    assert text_of(r) == chat["choices"][0]["message"]["content"]
    (item,) = r["output"]
    assert item["type"] == "message" and item["id"].startswith("msg_") and item["role"] == "assistant"
    u, cu = r["usage"], chat["usage"]
    assert (u["input_tokens"], u["output_tokens"], u["total_tokens"]) == \
        (cu["prompt_tokens"], cu["completion_tokens"], cu["total_tokens"])
    assert 0 < u["input_tokens_details"]["cached_tokens"] < u["input_tokens"]  # chat's prompt, kept by prefix caching
    length = chat["choices"][0]["finish_reason"] == "length"
    assert r["status"] == item["status"] == ("incomplete" if length else "completed")
    assert r["incomplete_details"] == ({"reason": "max_output_tokens"} if length else None)
    assert (r["instructions"], r["max_output_tokens"], r["temperature"], r["metadata"], r["store"], r["user"]) == \
        (INSTRUCTIONS, most, 0.0, {"run": "1"}, False, "u")
    # the same messages as input items, with content parts
    items = [{"type": "message", "role": "system", "content": [{"type": "input_text", "text": INSTRUCTIONS}]},
             {"role": "user", "content": PROMPT}]
    status, again = post(server, {"input": items, "temperature": 0, "max_output_tokens": most})
    assert status == 200 and text_of(again) == text_of(r) and again["usage"] == {
        **u, "input_tokens_details": again["usage"]["input_tokens_details"]}


def test_stream_events_build_the_same_response(server: Served, model: str, document: Conformance) -> None:
    body = {"model": model, "instructions": INSTRUCTIONS, "input": PROMPT, "temperature": 0, "max_output_tokens": 12}
    whole = post(server, body)[1]
    events = stream(server, body, document)
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{whole['status']}"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == events[-4]["text"] == text_of(whole)
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    final = events[-1]["response"]
    assert final["output"] == [events[-2]["item"]] and final["id"] == events[0]["response"]["id"]
    assert text_of(final) == text_of(whole) and final["usage"]["output_tokens"] == whole["usage"]["output_tokens"]


def test_openai_client_parses_responses_and_events(client: Any, model: str) -> None:
    r = client.responses.create(model=model, instructions=INSTRUCTIONS, input=PROMPT, temperature=0,
                                max_output_tokens=10)
    assert r.output_text and r.usage.output_tokens >= 1 and r.status in ("completed", "incomplete")
    events = list(client.responses.create(model=model, input=PROMPT, instructions=INSTRUCTIONS, temperature=0,
                                          max_output_tokens=10, stream=True))
    assert type(events[-1]).__name__ in ("ResponseCompletedEvent", "ResponseIncompleteEvent")
    assert events[-1].response.output_text == r.output_text
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text


def test_text_format_json_schema_and_json_object(server: Served, model: str) -> None:
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    status, r = post(server, {"model": model, "input": PROMPT, "instructions": INSTRUCTIONS, "temperature": 0,
                              "max_output_tokens": 200, "text": {"format": fmt}})
    assert status == 200 and r["status"] == "completed", r
    jsonschema.validate(json.loads(text_of(r)), PERSON)
    assert r["text"] == {"format": fmt}
    chat = post(server, {"model": model, "messages": MESSAGES, "temperature": 0, "max_tokens": 200,
                         "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                                                    "strict": True}}},
                "/v1/chat/completions")[1]
    assert text_of(r) == chat["choices"][0]["message"]["content"]
    status, r = post(server, {"input": PROMPT, "max_output_tokens": 40, "temperature": 0,
                              "text": {"format": {"type": "json_object"}}})
    assert status == 200 and text_of(r).startswith("{"), r  # a weak model's free object may outlast 40 tokens
    chat = post(server, {"messages": [{"role": "user", "content": PROMPT}], "temperature": 0, "max_tokens": 40,
                         "response_format": {"type": "json_object"}}, "/v1/chat/completions")[1]
    assert text_of(r) == chat["choices"][0]["message"]["content"]
    if r["status"] == "completed":
        assert isinstance(json.loads(text_of(r)), dict)


# ---- tools ---------------------------------------------------------------------------------------------------------


def test_tool_call_round_trip(server: Served, client: Any, model: str, document: Conformance) -> None:
    """tool_choice required: a function_call item with arguments valid under its parameters; sent back with its
    output, the same prompt as chat's assistant tool_calls and tool message."""
    body = {"model": model, "instructions": INSTRUCTIONS, "input": PROMPT, "tools": TOOLS, "tool_choice": "required",
            "temperature": 0, "max_output_tokens": 120}
    status, r = post(server, body)
    assert status == 200 and r["status"] == "completed", r
    document.validate("components/schemas/Response", r)
    (call,) = r["output"]
    assert call["type"] == "function_call" and call["id"].startswith("fc_") and call["status"] == "completed"
    jsonschema.validate(json.loads(call["arguments"]), PARAMS[call["name"]])
    assert r["tools"] == TOOLS and r["tool_choice"] == "required"
    events = stream(server, body, document)
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert [i["type"] for i in added] == ["function_call"] and added[0]["name"] == call["name"]
    pieces = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert pieces == done["arguments"] == call["arguments"] == events[-1]["response"]["output"][0]["arguments"]
    # the call and its output sent back
    back = [{"role": "user", "content": PROMPT}, call,
            {"type": "function_call_output", "call_id": call["call_id"], "output": "3"}]
    status, second = post(server, {"instructions": INSTRUCTIONS, "input": back, "tools": TOOLS, "temperature": 0,
                                   "max_output_tokens": 4, "tool_choice": "none"})
    assert status == 200 and second["output"][0]["type"] == "message", second
    fn = {"name": call["name"], "arguments": call["arguments"]}
    history = [*MESSAGES, {"role": "assistant", "content": None,
                           "tool_calls": [{"id": call["call_id"], "type": "function", "function": fn}]},
               {"role": "tool", "tool_call_id": call["call_id"], "content": "3"}]
    chat = post(server, {"messages": history, "tools": CHAT_TOOLS, "tool_choice": "none", "temperature": 0,
                         "max_tokens": 4}, "/v1/chat/completions")[1]
    assert second["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
    assert text_of(second) == chat["choices"][0]["message"]["content"]
    # the openai client: its own output items sent back as input
    first = client.responses.create(model=model, instructions=INSTRUCTIONS, input=PROMPT, tools=TOOLS,
                                    tool_choice={"type": "function", "name": "add"}, temperature=0,
                                    max_output_tokens=120)
    (fc,) = first.output
    assert fc.type == "function_call" and fc.name == "add"
    jsonschema.validate(json.loads(fc.arguments), ADD)
    then = client.responses.create(model=model, instructions=INSTRUCTIONS, tools=TOOLS, max_output_tokens=4,
                                   input=[{"role": "user", "content": PROMPT}, *first.output,
                                          {"type": "function_call_output", "call_id": fc.call_id, "output": "3"}])
    assert then.output[0].type in ("message", "function_call")


# ---- refusals, API key, metrics ------------------------------------------------------------------------------------


REFUSALS: list[tuple[dict[str, Any], str, str]] = [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "unsupported"),
    ({"conversation": "conv_1"}, "conversation", "unsupported"),
    ({"background": True}, "background", "unsupported"),
    ({"store": True}, "store", "unsupported"),
    ({"include": ["message.output_text.logprobs"]}, "include", "unsupported"),
    ({"reasoning": {"effort": "low"}}, "reasoning", "unsupported"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt", "unsupported"),
    ({"truncation": "auto"}, "truncation", "unsupported"),
    ({"frobnicate": 1}, "frobnicate", "unrecognized_argument"),
    ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
    ({"temperature": -1}, "temperature", "invalid_value"),
    ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", "invalid_value"),
    ({"tools": [{"type": "web_search"}]}, "tools", "unsupported"),
    ({"tools": [{"type": "function", "name": "bad name"}]}, "tools", "invalid_value"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "invalid_value"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice", "unsupported"),
    ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type", "invalid_value"),
    ({"text": {"verbosity": "low"}}, "text.verbosity", "unsupported"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}}, "text.format.schema",
     "invalid_constraint"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input", "unsupported"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input", "unsupported"),
    ({"input": [{"type": "function_call_output", "call_id": "c9", "output": "3"}]}, "input", "invalid_value"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]}, "input", "invalid_value"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input", "invalid_value"),
    ({"input": "ka " * 800}, "input", "context_length_exceeded"),
]


@pytest.mark.parametrize(("extra", "param", "code"), REFUSALS, ids=[f"{p}-{c}" for _, p, c in REFUSALS])
def test_refusals_name_the_field(server: Served, extra: dict[str, Any], param: str, code: str) -> None:
    status, body = post(server, {"input": PROMPT, "max_output_tokens": 2, **extra})
    err = assert_error(status, body, 400, param)
    assert err["code"] == code, err
    if code == "unrecognized_argument":
        assert err["message"] == f"Unrecognized request argument supplied: {param}"


def test_api_key_model_and_metrics(server: Served) -> None:
    """The API key and the model's name apply as on chat; /metrics counts the route and its tokens."""
    body = {"input": PROMPT, "max_output_tokens": 3, "temperature": 0}

    def counted(status: str) -> float:
        return sample(metrics(server, KEY), "gptport_requests_total", route="/v1/responses", status=status) or 0.0

    before = counted("200"), counted("401"), counted("404")
    tokens = sample(metrics(server, KEY), "gptport_generation_tokens_total") or 0.0
    assert_error(*server.post("/v1/responses", body), 401)
    assert_error(*post(server, {**body, "model": "other"}), 404, "model")
    status, r = post(server, body)
    assert status == 200, r
    assert (counted("200"), counted("401"), counted("404")) == (before[0] + 1, before[1] + 1, before[2] + 1)
    assert sample(metrics(server, KEY), "gptport_generation_tokens_total") == tokens + r["usage"]["output_tokens"]
