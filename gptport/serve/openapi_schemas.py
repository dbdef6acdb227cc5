"""The JSON schemas of gptport's OpenAPI document (openapi.py): every request field the parser honours,
with the type and range it enforces, and the bodies the routes answer. The field names come from
fields.py and tokenize.py, the bounds from protocol.py: `request_body` raises KeyError for a field
with no schema here, and tests/test_openapi.py checks each schema against the parser. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gptport.serve import fields, protocol
from gptport.serve.api_error import ApiError
from gptport.serve.tokenize import DETOKENIZE, TOKENIZE

Schema = dict[str, Any]
INT64_MIN = -(2**63)
# the `code` of a 400 (tests/test_openapi.py checks this list against the codes the source raises)
CODES_400 = ["context_length_exceeded", "invalid_constraint", "invalid_json", "invalid_token", "invalid_type",
             "invalid_value", "missing", "template_error", "too_many_choices", "unrecognized_argument", "unsupported"]


@dataclass(frozen=True)
class Limits:
    """What the document says about this server: its model's name, slots, vocabulary (None while the
    model loads) and body limit."""

    model: str
    slots: int
    vocab: int | None
    max_body: int


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(properties: dict[str, Schema], required: tuple[str, ...] = (), closed: bool = True) -> Schema:
    out: Schema = {"type": "object", "properties": properties, "required": list(required)}
    if closed:
        out["additionalProperties"] = False
    return out


def nullable(schema: Schema) -> Schema:
    """A field the parser reads as absent when it is null (as OpenAI's API does)."""
    return {"anyOf": [schema, {"type": "null"}]}


def _token(limits: Limits) -> Schema:
    out: Schema = {"type": "integer", "minimum": 0}
    if limits.vocab is not None:
        out["maximum"] = limits.vocab - 1
    return out


STRING, BOOLEAN, INTEGER, NUMBER = {"type": "string"}, {"type": "boolean"}, {"type": "integer"}, {"type": "number"}
TEXT_PART = obj({"type": {"const": "text"}, "text": STRING}, ("type", "text"), closed=False)
TOOL_CALL_IN = obj({"id": STRING, "type": {"const": "function"},
                    "function": obj({"name": STRING, "arguments": {"description": "JSON text, or the arguments "
                                                                                  "themselves"}}, ("name",),
                                    closed=False)}, ("function",), closed=False)
MESSAGE = {**obj({"role": {**STRING, "description": "system, developer, user, assistant, tool, ... (the chat "
                            "template decides what a role means)"},
                   "content": nullable({"anyOf": [STRING, {"type": "array", "items": TEXT_PART}]}),
                   "tool_calls": nullable({"type": "array", "items": TOOL_CALL_IN,
                                           "description": "an assistant's earlier calls"}),
                   "tool_call_id": nullable(STRING), "name": nullable(STRING)}, ("role",), closed=False),
           "if": {"required": ["tool_calls"], "properties": {"tool_calls": {"type": "array"}}},
           "then": {"properties": {"role": {"const": "assistant"}}}}
FUNCTION = obj({"name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}, "description": nullable(STRING),
                "parameters": nullable({"type": "object", "description": "a JSON schema"}),
                "strict": nullable(BOOLEAN)}, ("name",))
TOOL = obj({"type": {"const": "function"}, "function": FUNCTION}, ("type", "function"), closed=False)
TOOLS = {"type": "array", "items": TOOL, "minItems": 1, "description": "function names differ from each other"}
TOOL_CHOICE = {"anyOf": [{"enum": ["none", "auto", "required"]},
                         obj({"type": {"const": "function"}, "function": obj({"name": STRING}, ("name",), False)},
                             ("type", "function"), closed=False)],
               "description": "anything but none needs `tools`; a named function must be among them"}
NON_EMPTY = {"type": "string", "minLength": 1}
CHOICE = {"type": "array", "items": NON_EMPTY, "minItems": 1}
JSON_SCHEMA = {"anyOf": [{"type": "object"}, STRING], "description": "a JSON schema (an object, or its JSON text)"}
RESPONSE_FORMAT = {**obj({
    "type": {"enum": ["text", "json_object", "json_schema"]},
    "json_schema": obj({"name": STRING, "schema": {"type": "object"}, "strict": nullable(BOOLEAN),
                        "description": {}}, ("name",)),
}, ("type",)), "if": {"properties": {"type": {"const": "json_schema"}}},
    "then": {"required": ["json_schema"]}, "else": {"not": {"required": ["json_schema"]}}}
CONSTRAINT = "an output constraint: at most one per request, and not beside ignore_eos"


def _common(limits: Limits) -> dict[str, Schema]:
    """The fields completions and chat share, as protocol.py and fields.py check them."""
    model: Schema = {"type": "string", "description": "this server's model (another name is a 404)",
                     "examples": [limits.model]}
    return {
        "model": model,
        "max_tokens": {"type": "integer", "minimum": 1, "default": 16, "examples": [8],
                       "description": "generation also stops at the model's context"},
        "temperature": {"type": "number", "minimum": 0, "default": 1, "examples": [0.7],
                        "description": f"0 (or below {protocol.MIN_TEMPERATURE:g}) is greedy"},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1, "examples": [0.9]},
        "n": {"type": "integer", "minimum": 1, "maximum": limits.slots, "default": 1, "examples": [1],
              "description": "choices per prompt; prompts x n is at most the server's slots"},
        "stream": {"type": "boolean", "default": False, "examples": [True]},
        "stream_options": {**obj({"include_usage": nullable(BOOLEAN),
                                  "include_obfuscation": nullable({"const": False})}),
                           "examples": [{"include_usage": True}]},
        "stop": {"anyOf": [STRING, {"type": "array", "items": STRING, "maxItems": protocol.MAX_STOPS}],
                 "examples": [["\n"]]},
        "seed": {"type": "integer", "minimum": INT64_MIN, "examples": [42],
                 "description": "taken modulo 2**63; choice j of a prompt samples with seed + j"},
        "user": {"type": "string", "examples": ["u-1"]},
        "logit_bias": {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
                       "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
                       "examples": [{"11": -5}], "description": "token id (below the vocabulary's size) -> bias"},
        "frequency_penalty": {"type": "number", "const": 0, "examples": [0],
                              "description": "only 0: use repetition_penalty"},
        "presence_penalty": {"type": "number", "const": 0, "examples": [0],
                             "description": "only 0: use repetition_penalty"},
        "top_k": {"type": "integer", "minimum": 0, "default": 0, "examples": [40], "description": "0 is off"},
        "repetition_penalty": {"type": "number", "minimum": protocol.MIN_PENALTY, "maximum": 1 / protocol.MIN_PENALTY,
                               "default": 1, "examples": [1.1], "description": "1 is off"},
        "ignore_eos": {"type": "boolean", "default": False, "examples": [True]},
        "json_schema": {**JSON_SCHEMA, "examples": [{"type": "object"}], "description": CONSTRAINT},
        "regex": {**NON_EMPTY, "examples": ["[a-z]+"], "description": CONSTRAINT},
        "grammar": {**NON_EMPTY, "examples": ['start: "yes" | "no"'],
                    "description": f"Lark or GBNF; {CONSTRAINT}"},
        "choice": {**CHOICE, "examples": [["yes", "no"]], "description": CONSTRAINT},
        "structured_outputs": {
            **obj({"json": nullable(JSON_SCHEMA), "regex": nullable(NON_EMPTY), "grammar": nullable(NON_EMPTY),
                   "choice": nullable(CHOICE)}),
            "examples": [{"regex": "[a-z]+"}], "description": f"vLLM's form, one key set; {CONSTRAINT}"},
        "response_format": {**RESPONSE_FORMAT, "examples": [{"type": "json_object"}],
                            "description": f"text (no constraint), or {CONSTRAINT}"},
    }


def _completion(limits: Limits) -> dict[str, Schema]:
    token = _token(limits)
    ids = {"type": "array", "items": token, "minItems": 1}
    return {
        "prompt": {"anyOf": [STRING, ids, {"type": "array", "items": {"anyOf": [STRING, ids]}, "minItems": 1}],
                   "examples": ["Once upon a time"],
                   "description": "a string, token ids, or a list of either (one choice set per prompt); "
                                  "each at most the model's context"},
        "logprobs": {"type": "integer", "minimum": 0, "maximum": protocol.MAX_LOGPROBS, "examples": [2],
                     "description": "log-probabilities of each token and this many alternatives"},
        "echo": {"type": "boolean", "default": False, "examples": [True],
                 "description": "the prompt comes first in the text (not beside response_format)"},
        "best_of": {"type": "integer", "minimum": 1, "examples": [1], "description": "only equal to n"},
        "suffix": {"type": "string", "maxLength": 0, "examples": [""], "description": "not supported: only empty"},
    }


def _chat(limits: Limits) -> dict[str, Schema]:
    return {
        "messages": {"type": "array", "items": MESSAGE, "minItems": 1,
                     "examples": [[{"role": "user", "content": "Hello"}]]},
        "max_completion_tokens": {"type": "integer", "minimum": 1, "examples": [8],
                                  "description": "wins over max_tokens when both are given"},
        "logprobs": {"type": "boolean", "default": False, "examples": [True]},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": protocol.MAX_LOGPROBS, "examples": [2],
                         "description": "alternatives per token, with logprobs true"},
        "safety_identifier": {"type": "string", "examples": ["u-1"]},
        "tools": {**TOOLS, "examples": [[{"type": "function", "function": {"name": "now"}}]]},
        "tool_choice": {**TOOL_CHOICE, "examples": ["none"]},
        "parallel_tool_calls": {"type": "boolean", "examples": [True], "description": "one call per reply either way"},
        "store": {"const": False, "examples": [False], "description": "gptport stores nothing: only false"},
        "service_tier": {"enum": ["auto", "default"], "examples": ["auto"]},
        "modalities": {"const": ["text"], "examples": [["text"]]},
    }


def _tokenize(limits: Limits) -> dict[str, Schema]:
    return {
        "model": {"type": "string", "examples": [limits.model]},
        "prompt": {"type": "string", "examples": ["Hello"], "description": "one of prompt, content, messages"},
        "content": {"type": "string", "examples": ["Hello"], "description": "llama-server's name for prompt"},
        "messages": {"type": "array", "items": MESSAGE, "minItems": 1,
                     "examples": [[{"role": "user", "content": "Hello"}]],
                     "description": "a chat, rendered as /v1/chat/completions renders it"},
        "tools": {**TOOLS, "examples": [[{"type": "function", "function": {"name": "now"}}]],
                  "description": "with messages"},
        "tool_choice": {**TOOL_CHOICE, "examples": ["none"], "description": "with messages"},
        "add_special_tokens": {"type": "boolean", "examples": [True], "description": "either way alike"},
        "add_special": {"type": "boolean", "examples": [True], "description": "either way alike"},
        "add_generation_prompt": {"const": True, "examples": [True], "description": "with messages; only true"},
        "return_token_strs": {"type": "boolean", "examples": [True]},
        "with_pieces": {"type": "boolean", "examples": [True], "description": "tokens as [{id, piece}]"},
    }


def _detokenize(limits: Limits) -> dict[str, Schema]:
    return {"model": {"type": "string", "examples": [limits.model]},
            "tokens": {"type": "array", "items": _token(limits), "examples": [[11, 12]]}}


ONE_TEXT = {"oneOf": [{"required": [name], "properties": {name: {"not": {"type": "null"}}}}
                      for name in ("prompt", "content", "messages")]}  # exactly one of them, not null
# (route's request, its field names, the schemas of those fields, the required ones, more keywords)
REQUESTS: dict[str, tuple[set[str], Any, tuple[str, ...], Schema]] = {
    "CompletionRequest": (fields.COMPLETION | fields.EXTRAS_COMPLETION,
                          lambda lim: {**_common(lim), **_completion(lim)}, ("prompt",), {}),
    "ChatRequest": (fields.CHAT | fields.EXTRAS_CHAT, lambda lim: {**_common(lim), **_chat(lim)}, ("messages",), {}),
    "TokenizeRequest": (TOKENIZE, _tokenize, (), ONE_TEXT),
    "DetokenizeRequest": (DETOKENIZE, _detokenize, ("tokens",), {}),
}


def request_body(name: str, limits: Limits) -> Schema:
    """The request schema: exactly the honoured fields (KeyError for one without a schema). A required field
    may not be null; any other field, and any unknown one, may (null is absent)."""
    names, table, required, more = REQUESTS[name]
    schemas = table(limits)
    props = {f: schemas[f] if f in required else nullable(schemas[f]) for f in sorted(names)}
    unused = set(schemas) - names
    if unused:
        raise KeyError(f"{name}: schemas for fields the parser does not honour: {sorted(unused)}")
    return {"type": "object", "properties": props, "required": list(required), **more,
            "additionalProperties": {"type": "null"},
            "description": "A field not listed here is refused (400 unrecognized_argument, or unsupported for "
                           "one of OpenAI's that gptport does not implement) unless it is null. Integers are "
                           "written without a fraction (2, not 2.0), as OpenAI's API requires."}


# ---- responses ----------------------------------------------------------------------------------------------------

USAGE = obj({**{k: {"type": "integer", "minimum": 0} for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
             "prompt_tokens_details": obj({"cached_tokens": {"type": "integer", "minimum": 0}}, ("cached_tokens",))},
            ("prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"))
COMPLETION_LOGPROBS = obj({
    "tokens": {"type": "array", "items": STRING},
    "token_logprobs": {"type": "array", "items": {"type": ["number", "null"]}},
    "top_logprobs": {"type": "array", "items": {"anyOf": [{"type": "object", "additionalProperties": NUMBER},
                                                          {"type": "null"}]}},
    "text_offset": {"type": "array", "items": {"type": "integer", "minimum": 0}},
}, ("tokens", "token_logprobs", "top_logprobs", "text_offset"))
_ALTERNATIVE = {"token": STRING, "logprob": NUMBER,
                "bytes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}}}
CHAT_LOGPROBS = obj({"content": {"type": "array", "items": obj(
    {**_ALTERNATIVE, "top_logprobs": {"type": "array", "items": obj(_ALTERNATIVE, tuple(_ALTERNATIVE))}},
    (*_ALTERNATIVE, "top_logprobs"))}}, ("content",))
TOOL_CALL = obj({"id": STRING, "type": {"const": "function"},
                 "function": obj({"name": STRING, "arguments": {"type": "string", "description": "JSON text"}},
                                 ("name", "arguments"))}, ("id", "type", "function"))
TOOL_CALL_DELTA = {**TOOL_CALL, "properties": {**TOOL_CALL["properties"], "index": {"type": "integer"}},
                   "required": ["index", "id", "type", "function"]}
INDEX = {"type": "integer", "minimum": 0}
REASONS = ["stop", "length"]


def envelope(kind: str, prefix: str, choice: Schema, usage: bool) -> Schema:
    """A response object: id, object, created, model, choices (and usage where always present)."""
    props = {"id": {"type": "string", "pattern": f"^{prefix}"}, "object": {"const": kind},
             "created": {"type": "integer"}, "model": STRING, "choices": {"type": "array", "items": choice},
             "usage": USAGE}
    return obj(props, ("id", "object", "created", "model", "choices", *(("usage",) if usage else ())))


def error_schema(status: int, codes: list[str] | None) -> Schema:
    """OpenAI's error object as ApiError.body() writes it for this status; `code` one of `codes` (or null)."""
    code: Schema = {"type": ["string", "null"]} if codes is None else {"enum": [*codes, None]}
    kind = ApiError(status, "").body()["error"]["type"]
    return obj({"error": obj({"message": STRING, "type": {"const": kind}, "param": {"type": ["string", "null"]},
                              "code": code}, ("message", "type", "param", "code"))}, ("error",))


def components() -> dict[str, Schema]:
    """The response schemas, by name."""
    text_choice = {"index": INDEX, "text": STRING, "logprobs": nullable(ref("CompletionLogprobs"))}
    message = obj({"role": {"const": "assistant"}, "content": {"type": ["string", "null"]},
                   "tool_calls": {"type": "array", "items": ref("ToolCall"), "minItems": 1}}, ("role", "content"))
    delta = obj({"role": {"const": "assistant"}, "content": STRING,
                 "tool_calls": {"type": "array", "items": ref("ToolCallDelta"), "minItems": 1}})
    chat_lp = nullable(ref("ChatLogprobs"))
    return {
        "Usage": USAGE, "CompletionLogprobs": COMPLETION_LOGPROBS, "ChatLogprobs": CHAT_LOGPROBS,
        "ToolCall": TOOL_CALL, "ToolCallDelta": TOOL_CALL_DELTA,
        "Completion": envelope("text_completion", "cmpl-", obj(
            {**text_choice, "finish_reason": {"enum": REASONS}}, ("index", "text", "logprobs", "finish_reason")), True),
        "CompletionChunk": envelope("text_completion", "cmpl-", obj(
            {**text_choice, "finish_reason": {"enum": [*REASONS, None]}}, ("index", "text", "logprobs",
                                                                            "finish_reason")), False),
        "ChatCompletion": envelope("chat.completion", "chatcmpl-", obj(
            {"index": INDEX, "message": message, "logprobs": chat_lp,
             "finish_reason": {"enum": [*REASONS, "tool_calls"]}}, ("index", "message", "logprobs", "finish_reason")),
            True),
        "ChatCompletionChunk": envelope("chat.completion.chunk", "chatcmpl-", obj(
            {"index": INDEX, "delta": delta, "logprobs": chat_lp,
             "finish_reason": {"enum": [*REASONS, "tool_calls", None]}}, ("index", "delta", "logprobs",
                                                                          "finish_reason")), False),
        "Tokens": obj({"tokens": {"anyOf": [{"type": "array", "items": INDEX},
                                            {"type": "array", "items": obj({"id": INDEX, "piece": STRING},
                                                                           ("id", "piece"))}]},
                       "count": INDEX, "max_model_len": INDEX, "token_strs": {"type": "array", "items": STRING}},
                      ("tokens", "count", "max_model_len")),
        "Text": obj({"prompt": STRING, "content": STRING}, ("prompt", "content")),
        "Model": obj({"id": STRING, "object": {"const": "model"}, "created": {"type": "integer"}, "owned_by": STRING},
                     ("id", "object", "created", "owned_by")),
        "ModelList": obj({"object": {"const": "list"}, "data": {"type": "array", "items": ref("Model")}},
                         ("object", "data")),
        "Health": obj({"status": {"enum": ["ok", "loading", "error"]}, "message": STRING}, ("status",)),
    }
