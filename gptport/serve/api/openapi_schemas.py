"""The JSON schemas of gptport's OpenAPI document (openapi.py): the request bodies, made from the
definitions of their fields (fields.py: each field's type, bounds, default and description, written once
and read by the parser too), and the bodies the routes answer. No torch here.
"""

from __future__ import annotations

from gptport.serve.api import responses_schemas
from gptport.serve.api.api_error import ApiError
from gptport.serve.api.field_spec import Limits, Schema, nullable, schema_of
from gptport.serve.api.fields import ROUTE_FIELDS
from gptport.serve.api.shapes import NUMBER, STRING, obj

__all__ = ["CODES_400", "REQUESTS", "Limits", "Schema", "components", "error_schema", "ref", "request_body"]
# the `code` of a 400 (tests/serve/http/test_openapi.py checks this list against the codes the source raises)
CODES_400 = ["context_length_exceeded", "invalid_constraint", "invalid_json", "invalid_token", "invalid_type",
             "invalid_value", "missing", "template_error", "too_many_choices", "unrecognized_argument", "unsupported"]
# each request body's schema and the route whose fields it lists (fields.ROUTE_FIELDS)
REQUESTS = {"CompletionRequest": "completions", "ChatRequest": "chat", "TokenizeRequest": "tokenize",
            "DetokenizeRequest": "detokenize", "ResponsesRequest": "responses"}
ONE_TEXT = {"oneOf": [{"required": [name], "properties": {name: {"not": {"type": "null"}}}}
                      for name in ("prompt", "content", "messages")]}  # /tokenize: exactly one of them, not null


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def request_body(name: str, limits: Limits) -> Schema:
    """The request schema: exactly the fields its route takes, each as fields.py defines it. A required
    field may not be null; any other field, and any unknown one, may (null is absent)."""
    route = REQUESTS[name]
    fields = ROUTE_FIELDS[route]
    required = [f for f in sorted(fields) if route in fields[f].required]
    props = {}
    for f in sorted(fields):
        schema = schema_of(fields[f], limits)
        if fields[f].extra(route):
            schema["x-gptport-extra"] = True
        props[f] = schema if f in required else nullable(schema)
    return {"type": "object", "properties": props, "required": required, **(ONE_TEXT if route == "tokenize" else {}),
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
# a streamed call: the first delta carries index, id, type and function.name (arguments ""), the next ones
# index and a piece of function.arguments (OpenAI's shape)
TOOL_CALL_DELTA = obj({**TOOL_CALL["properties"], "index": {"type": "integer", "minimum": 0},
                       "function": obj({"name": STRING, "arguments": {"type": "string",
                                                                      "description": "a piece of the JSON text"}})},
                      ("index",))
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
        "TokenizerInfo": obj({"tokenizer_class": STRING, "bos_token": nullable(STRING), "eos_token": STRING,
                              "pad_token": nullable(STRING), "chat_template": nullable(STRING),
                              "model_max_length": INDEX}, ("tokenizer_class", "bos_token", "eos_token", "pad_token",
                                                           "chat_template", "model_max_length"), closed=False),
        "Health": obj({"status": {"enum": ["ok", "loading", "error"]}, "message": STRING}, ("status",)),
        **responses_schemas.components(),  # /v1/responses
    }
