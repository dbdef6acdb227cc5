"""The JSON schemas of the compound request values (messages, prompts, tools, output constraints, ...)
and the bounds they carry. fields.py gives them to its fields; the modules that check the values take
their keys and bounds from here (structured.py, tools.py, protocol.py), so that what GET /openapi.json
says and what the parser checks are written once. No torch here.
"""

from __future__ import annotations

from gptport.serve.api.field_spec import Limits, Schema, nullable

MAX_STOPS = 256  # stop sequences per request (vLLM and llama-server take any number; this bounds the work)
MAX_STOP_BYTES = 16 * 1024  # their UTF-8 bytes together
MAX_BIAS = 100  # a logit_bias is in [-MAX_BIAS, MAX_BIAS]
FUNCTION_NAME = "^[A-Za-z0-9_-]{1,64}$"


def obj(properties: dict[str, Schema], required: tuple[str, ...] = (), closed: bool = True) -> Schema:
    """An object of these properties (no others when `closed`)."""
    out: Schema = {"type": "object", "properties": properties, "required": list(required)}
    if closed:
        out["additionalProperties"] = False
    return out


def token(limits: Limits) -> Schema:
    """A token id of this server's vocabulary (any id >= 0 while the model loads)."""
    out: Schema = {"type": "integer", "minimum": 0}
    if limits.vocab is not None:
        out["maximum"] = limits.vocab - 1
    return out


def token_ids(limits: Limits) -> Schema:
    return {"type": "array", "items": token(limits)}


def prompt(limits: Limits) -> Schema:
    """A string, token ids, or a non-empty list of either."""
    ids = {"type": "array", "items": token(limits), "minItems": 1}
    return {"anyOf": [STRING, ids, {"type": "array", "items": {"anyOf": [STRING, ids]}, "minItems": 1}]}


STRING, BOOLEAN, INTEGER, NUMBER = {"type": "string"}, {"type": "boolean"}, {"type": "integer"}, {"type": "number"}
NON_EMPTY = {"type": "string", "minLength": 1}
STOP = {"anyOf": [STRING, {"type": "array", "items": STRING, "maxItems": MAX_STOPS}]}
STREAM_OPTIONS = obj({"include_usage": nullable(BOOLEAN), "include_obfuscation": nullable({"const": False})})
LOGIT_BIAS = {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
              "additionalProperties": {"type": "number", "minimum": -MAX_BIAS, "maximum": MAX_BIAS}}

# ---- messages ------------------------------------------------------------------------------------------------------

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
MESSAGES = {"type": "array", "items": MESSAGE, "minItems": 1}

# ---- tools ---------------------------------------------------------------------------------------------------------

FUNCTION = obj({"name": {"type": "string", "pattern": FUNCTION_NAME}, "description": nullable(STRING),
                "parameters": nullable({"type": "object", "description": "a JSON schema"}),
                "strict": nullable(BOOLEAN)}, ("name",))
TOOL = obj({"type": {"const": "function"}, "function": FUNCTION}, ("type", "function"), closed=False)
TOOLS = {"type": "array", "items": TOOL, "minItems": 1, "description": "function names differ from each other"}
TOOL_CHOICE = {"anyOf": [{"enum": ["none", "auto", "required"]},
                         obj({"type": {"const": "function"}, "function": obj({"name": STRING}, ("name",), False)},
                             ("type", "function"), closed=False)],
               "description": "anything but none needs `tools`; a named function must be among them"}

# ---- output constraints --------------------------------------------------------------------------------------------

JSON_SCHEMA = {"anyOf": [{"type": "object"}, STRING], "description": "a JSON schema (an object, or its JSON text)"}
CHOICE = {"type": "array", "items": NON_EMPTY, "minItems": 1}
STRUCTURED_OUTPUTS = obj({"json": nullable(JSON_SCHEMA), "regex": nullable(NON_EMPTY),
                          "grammar": nullable(NON_EMPTY), "choice": nullable(CHOICE)})
JSON_SCHEMA_FORMAT = obj({"name": STRING, "schema": {"type": "object"}, "strict": nullable(BOOLEAN),
                          "description": {}}, ("name",))
RESPONSE_FORMAT = {**obj({"type": {"enum": ["text", "json_object", "json_schema"]}, "json_schema": JSON_SCHEMA_FORMAT},
                         ("type",)),
                   "if": {"properties": {"type": {"const": "json_schema"}}},
                   "then": {"required": ["json_schema"]}, "else": {"not": {"required": ["json_schema"]}}}


def keys(shape: Schema) -> tuple[str, ...]:
    """The keys an object shape names, in order."""
    return tuple(shape["properties"])
