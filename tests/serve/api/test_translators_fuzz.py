"""The request path below HTTP — the body check against the route's schema (serve/api/body_check.py), then the route's
parser (the Responses translator, the chat and completions parsers, /tokenize, /detokenize) — fed valid bodies with
one value anywhere in them, however deep, replaced by JSON of another shape (hypothesis, seeded and bounded). Each
body is either taken or refused with OpenAI's 400 naming a path that is in the body; no other exception escapes.
The 500 a fuzzer found (a function_call_output item's call_id an object) is here as it was sent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptport import tokenizer as bpe
from gptport.serve.api import body_check, fields, protocol
from gptport.serve.api.api_error import ApiError
from gptport.serve.api.chat_template import plain
from gptport.serve.api.responses.to_chat import responses_job
from gptport.serve.api.tokenize import detokenize, tokenize

N_CTX, SLOTS = 1024, 2
CHECKS = body_check.for_server("m", SLOTS, 1 << 20)
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
# one valid body of each route, with nested items of every kind the route takes
VALID: dict[str, dict[str, Any]] = {
    "responses": {
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ka"}]},
                  {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "ka"}'},
                  {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                  {"role": "assistant", "content": "ok"}],
        "instructions": "be brief", "tools": [{"type": "function", "name": "weather", "parameters": WEATHER}],
        "tool_choice": {"type": "function", "name": "weather"}, "text": {"format": {"type": "text"}},
        "metadata": {"k": "v"}, "max_output_tokens": 4, "temperature": 0.5, "top_p": 0.9,
        "stream_options": {"include_obfuscation": False}},
    "chat": {
        "messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "ka"}]},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
        "tools": [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}],
        "tool_choice": "auto", "max_tokens": 4, "stop": ["\n"], "logit_bias": {"11": -5}, "stream_options": None,
        "logprobs": True, "top_logprobs": 2},
    "completions": {"prompt": ["ka", [11, 12]], "max_tokens": 4, "stop": "x", "logprobs": 1, "n": 1, "seed": 3,
                    "structured_outputs": {"choice": ["a", "b"]}, "stream": True,
                    "stream_options": {"include_usage": True}},
    "tokenize": {"messages": [{"role": "user", "content": "ka"}],
                 "tools": [{"type": "function", "function": {"name": "weather"}}], "with_pieces": True},
    "detokenize": {"tokens": [11, 12, 13]},
}
# a value of every JSON shape, the containers among them unhashable (the 500's call_id was {})
SHAPES = (None, True, 0, -1, 2**70, 1.5, "", "x", [], [1], [{}], {}, {"a": 1}, {"type": "function"})
JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                              max_size=3), max_leaves=6)


def paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into `value` (the root's own path excluded)."""
    out = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        out.append((*at, key))
        out += paths(child, (*at, key))
    return out


def replaced(body: Any, path: tuple[Any, ...], new: Any) -> Any:
    copy = json.loads(json.dumps(body))
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = new
    return copy


def run(route: str, body: Any, tok: bpe.BPETokenizer) -> None:
    """The route's request path as the app runs it: the body check, its parser, what the parser let through."""
    found = CHECKS.before(route, body)
    if route == "responses":
        responses_job(body, tok, N_CTX, SLOTS, plain)
    elif route == "chat":
        protocol.chat_job(body, tok, N_CTX, SLOTS, plain)
    elif route == "completions":
        protocol.completion_job(body, tok, N_CTX, SLOTS)
    elif route == "tokenize":
        tokenize(body, tok, N_CTX, plain)
    else:
        detokenize(body, tok)
    CHECKS.leftover(route, body, found)


@pytest.mark.parametrize("route", list(VALID))
def test_the_valid_bodies_are_taken(route: str, tok: bpe.BPETokenizer) -> None:
    run(route, VALID[route], tok)


def test_the_fuzzers_500_is_a_400_naming_the_path(tok: bpe.BPETokenizer) -> None:
    body = {"input": [{"type": "function_call_output", "call_id": {}, "output": ""}],
            "tool_choice": {"type": "function", "name": ""}, "tools": [], "temperature": 0.0, "top_p": 5e-324,
            "text": {}, "stream_options": {}, "metadata": {}}
    with pytest.raises(ApiError) as e:
        run("responses", body, tok)
    assert (e.value.status, e.value.param, e.value.code) == (400, "input[0].call_id", "invalid_type")
    assert e.value.message == "'input[0].call_id': expected a string, got object {}"


def check_answer(route: str, body: Any, tok: bpe.BPETokenizer) -> None:
    """`body` is taken, or refused with one line naming a path in it (or a field the route takes)."""
    try:
        run(route, body, tok)
    except ApiError as e:
        assert e.status == 400 and e.message and "\n" not in e.message, e.body()
        top = None if e.param is None else e.param.split(".")[0].split("[")[0]
        assert top is None or top in body or top in fields.ROUTE_FIELDS[route], (e.param, body)


@pytest.mark.parametrize("route", list(VALID))
def test_every_value_replaced_by_every_shape(route: str, tok: bpe.BPETokenizer) -> None:
    """Each value of the valid body, at every depth, replaced in turn by each of SHAPES."""
    cases = 0
    for path in paths(VALID[route]):
        for shape in SHAPES:
            check_answer(route, replaced(VALID[route], path, shape), tok)
            cases += 1
    assert cases >= 4 * len(SHAPES)


@pytest.mark.parametrize("route", list(VALID))
@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_values_replaced_by_any_json(route: str, data: st.DataObject, tok: bpe.BPETokenizer) -> None:
    """Two values anywhere in the valid body replaced by JSON of any shape (hypothesis)."""
    body = VALID[route]
    for _ in range(2):
        path = data.draw(st.sampled_from(paths(body)), label="path")
        body = replaced(body, path, data.draw(JSON, label="value"))
    check_answer(route, body, tok)
