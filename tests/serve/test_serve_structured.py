"""Structured outputs, tool calls, /tokenize and the fields policy over HTTP: a real
`gptport serve` driven with the `openai` client and httpx."""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from gptport import tokenizer as bpe
from gptport.serve.api import fields
from tests.support.serving import Served, assert_error, events, serve, wait_idle

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "member": {"type": "boolean"},
                                           "color": {"enum": ["red", "green", "blue"]},
                                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 5},
                                                    "maxItems": 2},
                                           "home": {"type": "object", "properties": {"zip": {"type": "integer",
                                                                                             "minimum": 0,
                                                                                             "maximum": 99999}},
                                                    "required": ["zip"], "additionalProperties": False}},
          "required": ["name", "age", "member", "color"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                        "b": {"type": "integer", "minimum": -99, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": ADD}}]
PARAMS = {"get_weather": WEATHER, "add": ADD}
MESSAGES = [{"role": "system", "content": "You help."}, {"role": "user", "content": "ka to ri so ne"}]


@pytest.fixture(scope="module")
def server(structured_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(structured_dir, tmp_path_factory.mktemp("serve") / "serve.log", "--slots", "4") as s:
        yield s


@pytest.fixture(scope="module")
def model(server: Served) -> str:
    return str(server.get("/v1/models")[1]["data"][0]["id"])


@pytest.fixture(scope="module")
def client(server: Served) -> Any:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


def test_response_format_json_schema_on_both_endpoints(client: Any, model: str) -> None:
    finished = 0
    for seed in range(4):
        chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=170, temperature=0.8,
                                              seed=seed, response_format=schema_format(PERSON))
        text = client.completions.create(model=model, prompt="ka to ri", max_tokens=170, temperature=0.8, seed=seed,
                                         extra_body={"response_format": schema_format(PERSON)})
        for reason, out in ((chat.choices[0].finish_reason, chat.choices[0].message.content),
                            (text.choices[0].finish_reason, text.choices[0].text)):
            if reason == "stop":
                jsonschema.validate(json.loads(out), PERSON)
                finished += 1
            else:
                assert reason == "length"
    assert finished >= 4, "most constrained replies finish within 170 tokens"
    obj = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=120,
                                         response_format={"type": "json_object"})
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content), dict)


def test_text_format_is_unconstrained_and_json_object_holds_on_both_endpoints(server: Served, model: str) -> None:
    for path, body in (("/v1/completions", {"prompt": "ka to ri"}), ("/v1/chat/completions", {"messages": MESSAGES})):
        base = {"model": model, "max_tokens": 24, "temperature": 0.8, "seed": 5, **body}
        replies = [server.post(path, {**base, **extra}) for extra in ({}, {"response_format": {"type": "text"}})]
        assert [status for status, _ in replies] == [200, 200], replies
        free, text = (out["choices"][0] for _, out in replies)
        assert free == text  # "text" asks for what no response_format gives: the same seeded tokens
        status, out = server.post(path, {**base, "max_tokens": 120, "response_format": {"type": "json_object"}})
        assert status == 200, out
        choice = out["choices"][0]
        reply = choice["text"] if "text" in choice else choice["message"]["content"]
        assert reply.startswith("{"), reply  # a JSON object from its first character
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(reply), dict)
        else:
            assert choice["finish_reason"] == "length"


def test_streamed_constrained_reply_equals_the_whole_one(server: Served, client: Any, model: str) -> None:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 170, "temperature": 0, "response_format":
            schema_format(PERSON)}
    whole = client.chat.completions.create(**body)
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**body, stream=True)
                   if c.choices)
    assert text == whole.choices[0].message.content


def test_extras_regex_grammar_choice(server: Served, model: str) -> None:
    cases = [({"regex": r"[a-z]{2,5}-[0-9]{2}"}, lambda t: re.fullmatch(r"[a-z]{2,5}-[0-9]{2}", t)),
             ({"choice": ["alpha", "beta", "gamma"]}, lambda t: t in ("alpha", "beta", "gamma")),
             ({"grammar": 'root ::= "yes" | "no" | "it is " [0-9]'}, lambda t: re.fullmatch(r"yes|no|it is [0-9]", t)),
             ({"grammar": 'start: "x" NUM\nNUM: /[0-9]{1,3}/'}, lambda t: re.fullmatch(r"x[0-9]{1,3}", t)),
             ({"structured_outputs": {"regex": r"(ka|to)+!"}}, lambda t: re.fullmatch(r"(ka|to)+!", t)),
             ({"json_schema": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
              lambda t: isinstance(json.loads(t), list))]
    for extra, ok in cases:
        for path, body in (("/v1/completions", {"prompt": "so ne"}), ("/v1/chat/completions", {"messages": MESSAGES})):
            status, out = server.post(path, {"model": model, "max_tokens": 40, "temperature": 1.0, "seed": 3,
                                             **body, **extra})
            assert status == 200, out
            choice = out["choices"][0]
            text = choice["text"] if "text" in choice else choice["message"]["content"]
            assert choice["finish_reason"] == "stop" and ok(text), (extra, text)


def tool_call_of(choice: Any) -> tuple[str, dict[str, Any]]:
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and choice.message.content is None
    return call.function.name, json.loads(call.function.arguments)


def test_tool_choice_required_always_calls_with_valid_arguments(client: Any, model: str) -> None:
    names = set()
    for seed in range(8):
        kw = {"model": model, "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required", "max_tokens": 120,
              "temperature": 0.9, "seed": seed}
        name, args = tool_call_of(client.chat.completions.create(**kw).choices[0])
        jsonschema.validate(args, PARAMS[name])
        names.add(name)
        chunks = list(client.chat.completions.create(**kw, stream=True))
        deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert reasons == ["tool_calls"]
        # OpenAI's shape: the call's name first (arguments ""), then the arguments in pieces as they come
        assert deltas[0].index == 0 and deltas[0].function.name == name and deltas[0].function.arguments == ""
        assert all(d.index == 0 and d.id is None and d.function.name is None for d in deltas[1:])
        arguments = "".join(d.function.arguments for d in deltas[1:])
        assert json.loads(arguments) == args  # the same seed: the same call
        assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert names == {"get_weather", "add"}, "both functions get called across seeds"


def test_named_function_auto_and_none(client: Any, model: str) -> None:
    named = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, max_tokens=100, temperature=1,
                                           tool_choice={"type": "function", "function": {"name": "add"}})
    name, args = tool_call_of(named.choices[0])
    assert name == "add"
    jsonschema.validate(args, ADD)
    none = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                          max_tokens=12, temperature=0)
    plain = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12, temperature=0)
    assert none.choices[0].message.content == plain.choices[0].message.content  # no tools in the prompt
    for seed in range(6):  # auto: text, or a valid call once the reply opens one
        choice = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, max_tokens=60,
                                                temperature=1.0, seed=seed).choices[0]
        if choice.finish_reason == "tool_calls":
            name, args = tool_call_of(choice)
            jsonschema.validate(args, PARAMS[name])
        else:  # text, or a call cut short: never the call's markup
            assert "<tool_call" not in (choice.message.content or ""), choice


def test_tool_history_reaches_the_template(server: Served, model: str, structured_dir: Path) -> None:
    history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    status, out = server.post("/tokenize", {"messages": history, "tools": TOOLS})
    assert status == 200, out
    text = bpe.load(structured_dir).decode(out["tokens"])
    assert 'Assistant: <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>' in text
    assert "\n\nTool: 3\n\nAssistant:" in text and text.index("Tools: call one by answering") < text.index("User:")
    status, out = server.post("/v1/chat/completions", {"model": model, "messages": history, "tools": TOOLS,
                                                       "max_tokens": 5})
    assert status == 200, out
    call = "messages[0].tool_calls[0]"
    for bad_call, param, words in (
            ({"type": None, "function": {"name": "add"}}, "messages", "item 0: a tool call"),
            ({"type": "custom", "function": {"name": "add"}}, "messages", "item 0: a tool call"),
            ({"id": 7, "function": {"name": "add"}}, f"{call}.id", "expected a string, got number 7"),
            ({"function": {"arguments": "{}"}}, f"{call}.function.name", "'name' is required")):
        wrong = [{"role": "assistant", "content": None, "tool_calls": [bad_call]}]
        for route, extra in (("/tokenize", {}), ("/v1/chat/completions", {"max_tokens": 2})):
            err = assert_error(*server.post(route, {"model": model, "messages": wrong, **extra}), 400, param)
            assert words in err["message"], err


def test_tokenize_and_detokenize(server: Served, model: str, structured_dir: Path) -> None:
    tok = bpe.load(structured_dir)
    status, out = server.post("/tokenize", {"model": model, "prompt": "ka to ri é", "return_token_strs": True})
    assert status == 200 and out["tokens"] == tok.encode("ka to ri é") and out["count"] == len(out["tokens"])
    assert out["max_model_len"] == 768 and "".join(out["token_strs"]) == "ka to ri é"
    status, pieces = server.post("/tokenize", {"content": "ka to", "with_pieces": True})
    assert status == 200 and [p["id"] for p in pieces["tokens"]] == tok.encode("ka to")
    status, back = server.post("/detokenize", {"tokens": out["tokens"]})
    assert status == 200 and back == {"prompt": "ka to ri é", "content": "ka to ri é"}
    assert_error(*server.post("/detokenize", {"tokens": [10**6]}), 400, "tokens")
    assert_error(*server.post("/tokenize", {"prompt": "a", "content": "b"}), 400, "prompt")
    assert_error(*server.post("/tokenize", {"prompt": "a", "bogus": 1}), 400, "bogus")


def test_bad_constraints_are_400s_naming_the_field(server: Served, model: str) -> None:
    base = {"model": model, "prompt": "ka", "max_tokens": 4}
    cases = [({"regex": "a(b"}, "regex", "unclosed group"),
             ({"grammar": "start: foo"}, "grammar", "foo"),
             ({"response_format": schema_format({"type": "strin"})}, "response_format.json_schema.schema", "strin"),
             ({"response_format": {"type": "xml"}}, "response_format.type", "xml"),
             ({"response_format": {"type": "text", "json_schema": {"name": 5}}}, "response_format.json_schema",
              "goes with type json_schema"),
             ({"regex": "a", "choice": ["b"]}, "choice", "one output constraint"),
             ({"choice": []}, "choice", "non-empty"),
             ({"regex": "a+", "ignore_eos": True}, "ignore_eos", "cannot be combined")]
    for extra, param, what in cases:
        err = assert_error(*server.post("/v1/completions", {**base, **extra}), 400, param)
        assert what in err["message"] and "\n" not in err["message"], err
    chat = {"model": model, "messages": MESSAGES, "max_tokens": 4}
    for extra, param in [({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
                         ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                          "tool_choice"),
                         ({"tool_choice": "required"}, "tool_choice"),
                         ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools")]:
        assert_error(*server.post("/v1/chat/completions", {**chat, **extra}), 400, param)
    wait_idle(server)
    status, out = server.post("/v1/completions", base)
    assert status == 200, "the server goes on after refusals"


# -- no silent substitutes -----------------------------------------------------------------------------------------
PLAUSIBLE: dict[str, Any] = {
    "audio": {"voice": "alloy", "format": "mp3"}, "best_of": 3, "echo": True, "frequency_penalty": 0.5,
    "function_call": "auto", "functions": [{"name": "f", "parameters": {"type": "object"}}],
    "logit_bias": {"5": 2.0}, "logprobs": 2, "max_completion_tokens": 4, "max_tokens": 4, "metadata": {"k": "v"},
    "modalities": ["text", "audio"], "moderation": {"model": "omni-moderation-latest"}, "n": 1,
    "parallel_tool_calls": False, "prediction": {"type": "content", "content": "x"}, "presence_penalty": 0.5,
    "prompt_cache_key": "k", "prompt_cache_options": {"mode": "auto"}, "prompt_cache_retention": "24h",
    "reasoning_effort": "low", "response_format": {"type": "json_object"}, "safety_identifier": "u1", "seed": 1,
    "service_tier": "flex", "stop": ["\n"], "store": True, "stream": False, "stream_options": {"include_usage": True},
    "suffix": "end", "temperature": 0.5, "tool_choice": "none", "tools": TOOLS, "top_logprobs": 2, "top_p": 0.9,
    "user": "u1", "verbosity": "low", "web_search_options": {"search_context_size": "low"}}
# values that gptport refuses although it reads the field (the rest of the field is honoured)
REFUSED_VALUES = {"best_of", "modalities", "service_tier", "store", "suffix"}


def openai_fields(params: Any) -> set[str]:
    out: set[str] = set()
    for cls in typing.get_args(params) or [params]:
        out |= set(typing.get_type_hints(cls))
    return out


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_every_openai_field_is_honoured_or_refused(server: Served, model: str, chat: bool) -> None:
    """Each field of the installed `openai` package's request type, with a plausible value: 200 only
    where gptport implements it (fields.COMPLETION / fields.CHAT), else a 400 naming it."""
    import openai.types as completion_types
    import openai.types.chat as chat_types

    names = openai_fields(chat_types.CompletionCreateParams if chat else completion_types.CompletionCreateParams)
    missing = sorted(names - set(PLAUSIBLE) - {"model", "messages", "prompt"})
    assert not missing, f"the openai package has fields this test has no value for: {missing}"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    base = {"model": model, "max_tokens": 4, **({"messages": MESSAGES} if chat else {"prompt": "ka"})}
    honoured = fields.CHAT if chat else fields.COMPLETION
    answered = {}
    for name in sorted(names - {"model", "messages", "prompt"}):
        plausible = True if chat and name == "logprobs" else PLAUSIBLE[name]  # chat's logprobs is a flag
        status, out = server.post(path, {**base, name: plausible})
        answered[name] = status
        if name in honoured and name not in REFUSED_VALUES:
            assert status == 200, (name, out)
        else:
            err = assert_error(status, out, 400, name)
            assert err["code"] in ("unsupported", "unrecognized_argument"), (name, err)
    assert any(s == 200 for s in answered.values()) and any(s == 400 for s in answered.values())
    err = assert_error(*server.post(path, {**base, "frobnicate": 1}), 400, "frobnicate")
    assert err["message"] == "Unrecognized request argument supplied: frobnicate"


def test_logit_bias_moves_the_logits(server: Served, model: str) -> None:
    """+100 on one token makes greedy decoding pick it every time; the logprobs stay the model's."""
    body = {"model": model, "prompt": "ka", "max_tokens": 6, "temperature": 0, "ignore_eos": True, "logprobs": 0}
    status, out = server.post("/v1/completions", {**body, "logit_bias": {"77": 100}})
    assert status == 200, out
    assert out["choices"][0]["text"] == server.post("/detokenize", {"tokens": [77] * 6})[1]["prompt"]
    status, free = server.post("/v1/completions", body)
    assert free["choices"][0]["text"] != out["choices"][0]["text"]
    assert all(lp < 0 for lp in out["choices"][0]["logprobs"]["token_logprobs"])
    assert_error(*server.post("/v1/completions", {**body, "logit_bias": {"77": 101}}), 400, "logit_bias")
    assert_error(*server.post("/v1/completions", {**body, "logit_bias": {"x": 1}}), 400, "logit_bias")


def test_streamed_events_of_a_json_reply_parse(server: Served, model: str) -> None:
    chunks = events(server, "/v1/chat/completions", {"model": model, "messages": MESSAGES, "max_tokens": 170,
                                                      "temperature": 0, "response_format": schema_format(PERSON)})
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1] if c["choices"])
    if chunks[-2]["choices"][0]["finish_reason"] == "stop":
        jsonschema.validate(json.loads(text), PERSON)
