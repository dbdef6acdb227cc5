"""The request fields of POST /v1/responses (OpenAI's Responses API, served stateless), defined once as
fields.py defines the other routes' (`Field`, field_spec.py): fields.py adds this table to its own, so
that the parser (responses/to_chat.py) and GET /openapi.json read the same definitions. The JSON schemas
of the compound values (input items, function tools, tool_choice, text.format) are here too: their keys
are the ones responses/to_chat.py takes. No torch here.
"""

from __future__ import annotations

from typing import Any

from gptport.serve.api.api_error import ApiError, bad
from gptport.serve.api.field_spec import Field, Limits, Reader, nullable
from gptport.serve.api.shapes import BOOLEAN, FUNCTION_NAME, STRING, obj

ROUTE = "responses"
R = (ROUTE,)
MAX_METADATA, MAX_KEY, MAX_VALUE = 16, 64, 512  # OpenAI's bounds of metadata: pairs, key and value characters
KEPT = "gptport keeps no responses (the API is served stateless): send the whole conversation in input"

# ---- the compound values' shapes ----------------------------------------------------------------------------------

TEXT_PART = obj({"type": {"enum": ["input_text", "output_text"]}, "text": STRING, "annotations": {},
                 "logprobs": {}}, ("type", "text"))
MESSAGE_ITEM = obj({"type": nullable({"const": "message"}),
                    "role": {"enum": ["user", "system", "developer", "assistant"]},
                    "content": {"anyOf": [STRING, {"type": "array", "items": TEXT_PART}]},
                    "id": nullable(STRING), "status": nullable(STRING)}, ("role", "content"))
CALL_ITEM = obj({"type": {"const": "function_call"}, "call_id": {**STRING, "minLength": 1},
                 "name": {"type": "string", "pattern": FUNCTION_NAME},
                 "arguments": {"type": "string", "description": "JSON text"},
                 "id": nullable(STRING), "status": nullable(STRING)}, ("type", "call_id", "name", "arguments"))
OUTPUT_ITEM = obj({"type": {"const": "function_call_output"}, "call_id": {**STRING, "minLength": 1},
                   "output": {"anyOf": [STRING, {"type": "array", "items": TEXT_PART}]},
                   "id": nullable(STRING), "status": nullable(STRING)}, ("type", "call_id", "output"))
INPUT = {"anyOf": [STRING, {"type": "array", "minItems": 1,
                            "items": {"anyOf": [MESSAGE_ITEM, CALL_ITEM, OUTPUT_ITEM]}}],
         "description": "a user message's text, or a list of items: messages (role user, system, developer or "
                        "assistant; text content), function_call items (an assistant's earlier calls) and "
                        "function_call_output items (their results, each answering an earlier call_id)"}
TOOL = obj({"type": {"const": "function"}, "name": {"type": "string", "pattern": FUNCTION_NAME},
            "description": nullable(STRING), "parameters": nullable({"type": "object", "description": "a JSON schema"}),
            "strict": nullable(BOOLEAN)}, ("type", "name"))
TOOLS = {"type": "array", "items": TOOL, "description": "function tools only; names differ from each other"}
TOOL_CHOICE = {"anyOf": [{"enum": ["none", "auto", "required"]},
                         obj({"type": {"const": "function"}, "name": STRING}, ("type", "name"))],
               "description": "anything but none needs `tools`; a named function must be among them"}
FORMAT_TEXT = obj({"type": {"const": "text"}}, ("type",))
FORMAT_JSON = obj({"type": {"const": "json_object"}}, ("type",))
FORMAT_SCHEMA = obj({"type": {"const": "json_schema"}, "name": {"type": "string", "pattern": FUNCTION_NAME},
                     "schema": {"type": "object", "description": "a JSON schema"}, "strict": nullable(BOOLEAN),
                     "description": nullable(STRING)}, ("type", "name", "schema"))
TEXT = obj({"format": nullable({"anyOf": [FORMAT_TEXT, FORMAT_JSON, FORMAT_SCHEMA]})})
METADATA = {"type": "object", "maxProperties": MAX_METADATA, "propertyNames": {"maxLength": MAX_KEY},
            "additionalProperties": {"type": "string", "maxLength": MAX_VALUE}}
STREAM_OPTIONS = obj({"include_obfuscation": nullable({"const": False})})


def _model(limits: Limits) -> dict[str, Any]:
    return {"examples": [limits.model]}


FIELDS: tuple[Field, ...] = (
    Field("model", "string", R, "one of this server's names for its model (another name is a 404); the response "
          "echoes it", limit=_model),
    Field("input", "any", R, examples=("Hello", [{"role": "user", "content": "Hello"}]), shape=INPUT, required=R),
    Field("instructions", "string", R, "a system message put before the input", ("Answer briefly.",)),
    Field("max_output_tokens", "integer", R, "generation also stops at the model's context (the default)", (8,),
          lo=1),
    Field("temperature", "number", R, "0 is greedy", (0.7,), 1, lo=0, bounds=">= 0 (0 is greedy)"),
    Field("top_p", "number", R, "", (0.9,), 1, lo=0, hi=1, above=True, bounds="in (0, 1]"),
    Field("stream", "boolean", R, "server-sent events of the response's progress", (True,), False),
    Field("stream_options", "object", R, examples=({"include_obfuscation": False},), shape=STREAM_OPTIONS),
    Field("tools", "any", R, examples=([{"type": "function", "name": "now"}],), shape=TOOLS),
    Field("tool_choice", "any", R, examples=("auto",), shape=TOOL_CHOICE),
    Field("parallel_tool_calls", "boolean", R, "accepted either way", (True,), brief=True),
    Field("text", "object", R, "text.format: text (no constraint), json_object, or json_schema {name, schema}",
          ({"format": {"type": "json_object"}},), shape=TEXT),
    Field("metadata", "object", R, f"up to {MAX_METADATA} string pairs, echoed in the response", ({"k": "v"},),
          shape=METADATA),
    Field("user", "string", R, examples=("u-1",), brief=True),
    Field("safety_identifier", "string", R, examples=("u-1",), brief=True),
    Field("store", "any", R, "gptport stores nothing: only false (the default here)", (False,), only=(False,),
          refusal=f"true is not supported: {KEPT} (false is)"),
    Field("background", "any", R, "only false", (False,), only=(False,),
          refusal="true is not supported: gptport answers within the request, and keeps no responses to poll"),
    Field("truncation", "any", R, "only disabled: an input longer than the context is refused", ("disabled",),
          only=("disabled",), refusal="{value!r} is not supported; an input longer than the context is refused "
          "(disabled)"),
    Field("include", "any", R, "only empty", ([],), only=([],),
          refusal="is not supported: gptport returns no extra output data (only [] is)"),
    Field("service_tier", "any", R, examples=("auto",), only=("auto", "default"),
          refusal="{value!r} is not supported; gptport has one tier (auto or default)"),
    # ---- OpenAI's fields this route refuses whenever they are set, and why
    *(Field(name, "any", R, refused=why) for name, why in {
        "previous_response_id": f"is not supported: {KEPT}",
        "conversation": f"is not supported: {KEPT}",
        "prompt": "(a stored prompt template) is not supported: gptport keeps no prompts",
        "reasoning": "is not supported: gptport's models do not reason before answering",
        "max_tool_calls": "is not supported",
        "top_logprobs": "is not supported on /v1/responses (chat completions return logprobs)",
        "prompt_cache_key": "is not supported: gptport keeps no prompt cache",
        "prompt_cache_retention": "is not supported: gptport keeps no prompt cache",
        "context_management": "is not supported: gptport compacts nothing",
    }.items()),
)
REFUSED = {f.name: f.refused for f in FIELDS if f.refused}
HONOURED = {f.name: f for f in FIELDS if not f.refused}


def reader(body: Any) -> Reader:
    """The body's fields by their definitions, each name checked: an unknown field is refused as OpenAI refuses
    it, a refused one as unsupported with its reason (a null value is an absent field)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", None, "invalid_json")
    for name, value in body.items():
        if value is None or name in HONOURED:
            continue
        if name in REFUSED:
            raise bad(name, REFUSED[name], "unsupported")
        raise ApiError(400, f"Unrecognized request argument supplied: {name}", name, "unrecognized_argument")
    return Reader(body, HONOURED)


def metadata(value: Any) -> dict[str, str]:
    """OpenAI's metadata: at most 16 pairs of strings, keys of at most 64 characters, values of at most 512."""
    if value is None:
        return {}
    if len(value) > MAX_METADATA:
        raise bad("metadata", f"at most {MAX_METADATA} pairs, not {len(value)}", "invalid_value")
    for key, v in value.items():
        if len(key) > MAX_KEY:
            raise bad("metadata", f"key {key[:20]!r}... is longer than {MAX_KEY} characters", "invalid_value")
        if not isinstance(v, str) or len(v) > MAX_VALUE:
            raise bad("metadata", f"the value of {key!r} must be a string of at most {MAX_VALUE} characters",
                      "invalid_value")
    return dict(value)


def stream_options(value: Any) -> None:
    """Only include_obfuscation, and only false: gptport pads no events."""
    if value is None:
        return
    unknown = sorted(set(value) - {"include_obfuscation"})
    if unknown:
        raise bad("stream_options", f"unknown option {unknown[0]!r}", "invalid_value")
    flag = value.get("include_obfuscation")
    if flag is not None and not isinstance(flag, bool):
        raise bad("stream_options.include_obfuscation", "expected true or false", "invalid_type")
    if flag:
        raise bad("stream_options.include_obfuscation", "true is not supported: gptport pads no events",
                  "unsupported")
