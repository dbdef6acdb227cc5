"""Tool calls as the clients of OpenAI's API receive them from a real `gptport serve`: non-strict tools as
LangChain's bind_tools and the Agents SDK send them, calls cut by max_tokens, streams of tool_calls deltas,
and every answer valid under the server's OpenAPI document."""

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
from tests.support.serving import Served, serve

# as LangChain writes a tool's parameters: no additionalProperties, no bounds
LOOSE = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOLS = [{"type": "function", "function": {"name": "add_one", "description": "Add one to a", "parameters": LOOSE}},
         {"type": "function", "function": {"name": "double", "description": "Double a", "parameters": LOOSE}}]
MESSAGES = [{"role": "system", "content": "You help."}, {"role": "user", "content": "ka to ri so ne"}]
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(structured_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(structured_dir, tmp_path_factory.mktemp("serve") / "serve.log", "--slots", "4") as s:
        yield s


@pytest.fixture(scope="module")
def client(server: Served) -> Any:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(server: Served) -> str:
    return str(server.get("/v1/models")[1]["data"][0]["id"])


@pytest.fixture(scope="module")
def conformance(server: Served) -> Conformance:
    return Conformance(httpx.get(server.url + "/openapi.json", timeout=10).json())


def answer(server: Served, check: Conformance, body: dict[str, Any]) -> Any:
    """A chat response (a stream's parsed chunks), checked against the OpenAPI document."""
    r = httpx.post(server.url + CHAT, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return check.check(CHAT, "post", r.status_code, r.headers, r.content)


def streamed(server: Served, check: Conformance, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream's chunk choices, each chunk checked against the OpenAPI document."""
    chunks = answer(server, check, {**body, "stream": True})
    return [c["choices"][0] for c in chunks[:-1] if c["choices"]]


def no_markup(choices: list[dict[str, Any]]) -> str:
    """The content a stream sent, which holds none of the call's markup."""
    content = "".join(c["delta"].get("content") or "" for c in choices)
    assert "<tool_call" not in content and "</tool_call>" not in content, content
    return content


def deltas(choices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for c in choices for d in c["delta"].get("tool_calls") or []]


def assert_openai_deltas(items: list[dict[str, Any]], names: set[str]) -> tuple[str, str]:
    """OpenAI's streaming shape: the first item names the call (index 0, id, type, arguments ""), the others
    carry pieces of the arguments; (name, the arguments joined)."""
    first, *rest = items
    assert first["index"] == 0 and first["id"].startswith("call_") and first["type"] == "function", first
    assert first["function"]["name"] in names and first["function"]["arguments"] == "", first
    assert all(set(d) == {"index", "function"} and d["index"] == 0 and set(d["function"]) == {"arguments"}
               for d in rest), rest
    return first["function"]["name"], "".join(d["function"]["arguments"] for d in rest)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "double"}}],
                         ids=["required", "named"])
def test_non_strict_tools_end_in_calls_clients_parse(server: Served, client: Any, model: str,
                                                     conformance: Conformance, choice: Any) -> None:
    names = {"double"} if isinstance(choice, dict) else {"add_one", "double"}
    for seed in range(3):
        body = {"model": model, "messages": MESSAGES, "tools": TOOLS, "tool_choice": choice, "max_tokens": 150,
                "temperature": 0.9, "seed": seed}
        whole = client.chat.completions.create(**body).choices[0]
        assert whole.finish_reason == "tool_calls" and whole.message.content is None, whole
        (call,) = whole.message.tool_calls
        assert call.type == "function" and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), {**LOOSE, "additionalProperties": False})
        raw = answer(server, conformance, body)["choices"][0]
        assert raw["message"]["tool_calls"][0]["function"] == call.function.model_dump()  # the same seed
        choices = streamed(server, conformance, body)
        assert not no_markup(choices)
        name, arguments = assert_openai_deltas(deltas(choices), names)
        assert (name, arguments) == (call.function.name, call.function.arguments)
        assert [c["finish_reason"] for c in choices if c["finish_reason"]] == ["tool_calls"]
        assert all(c["delta"] for c in choices[:-1]), "no empty chunk while the call is held"


def test_auto_with_non_strict_tools_never_shows_markup(server: Served, model: str, conformance: Conformance) -> None:
    for seed in range(3):
        body = {"model": model, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 40, "temperature": 1.0,
                "seed": seed}
        choice = answer(server, conformance, body)["choices"][0]
        if choice["finish_reason"] == "tool_calls":
            json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])
        else:
            assert "<tool_call" not in (choice["message"]["content"] or ""), choice
        choices = streamed(server, conformance, body)
        assert no_markup(choices) == (choice["message"]["content"] or "")


def test_a_call_cut_by_max_tokens_comes_back_as_length(server: Served, client: Any, model: str,
                                                        conformance: Conformance) -> None:
    one = TOOLS[:1]  # one function allowed: the call is named from its first token
    body = {"model": model, "messages": MESSAGES, "tools": one, "tool_choice": "required", "max_tokens": 5,
            "temperature": 0}
    whole = client.chat.completions.create(**body).choices[0]
    assert whole.finish_reason == "length" and whole.message.content is None, whole
    (call,) = whole.message.tool_calls
    assert call.function.name == "add_one" and call.function.arguments == ""  # 5 tokens: '<tool_call>' not yet whole
    answer(server, conformance, body)
    choices = streamed(server, conformance, body)
    assert choices[0]["delta"] == {"role": "assistant", "content": ""}
    assert "tool_calls" in choices[1]["delta"], choices  # the first token's chunk
    assert not no_markup(choices)
    assert assert_openai_deltas(deltas(choices), {"add_one"}) == ("add_one", "")
    assert [c["finish_reason"] for c in choices if c["finish_reason"]] == ["length"]
    assert all(c["delta"] for c in choices[:-1])
    # two functions: cut before the model wrote a name, there is no call to give
    body = {**body, "tools": TOOLS}
    whole = client.chat.completions.create(**body).choices[0]
    assert (whole.finish_reason, whole.message.content, whole.message.tool_calls) == ("length", None, None)
    choices = streamed(server, conformance, body)
    assert not deltas(choices) and not no_markup(choices)
    assert [c["delta"] for c in choices] == [{"role": "assistant", "content": ""}, {}]
    assert choices[-1]["finish_reason"] == "length"
    # cut after the name, inside the arguments: the arguments written so far
    full = answer(server, conformance, {**body, "max_tokens": 150, "logprobs": True})["choices"][0]
    tokens = [entry["token"] for entry in full["logprobs"]["content"]]
    opened = next(k for k in range(len(tokens)) if '"arguments":' in "".join(tokens[:k]))
    whole = client.chat.completions.create(**{**body, "max_tokens": opened + 2}).choices[0]
    assert whole.finish_reason == "length" and whole.message.content is None, whole
    (call,) = whole.message.tool_calls
    (wanted,) = full["message"]["tool_calls"]
    assert call.function.name == wanted["function"]["name"], (call, wanted)
    assert call.function.arguments and wanted["function"]["arguments"].startswith(call.function.arguments)
    choices = streamed(server, conformance, {**body, "max_tokens": opened + 2})
    assert assert_openai_deltas(deltas(choices), {call.function.name}) == (call.function.name,
                                                                           call.function.arguments)
