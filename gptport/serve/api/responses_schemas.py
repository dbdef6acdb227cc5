"""The JSON schemas GET /openapi.json gives POST /v1/responses' answers: the response object (responses/from_chat.py
writes it), its output items and usage, and the server-sent events of a stream (`event: TYPE` and `data:` a
JSON event of that type). The request's schema is made from its fields (responses_fields.py). No torch here.
"""

from __future__ import annotations

from gptport.serve.api.field_spec import Schema, nullable
from gptport.serve.api.shapes import BOOLEAN, NUMBER, STRING, obj

INDEX = {"type": "integer", "minimum": 0}
COUNT = {"type": "integer", "minimum": 0}
STATUS = {"enum": ["in_progress", "completed", "incomplete"]}
RESPONSE_EVENTS = ("response.created", "response.in_progress", "response.completed", "response.incomplete",
                   "response.failed")
ITEM_EVENTS = ("response.output_item.added", "response.output_item.done")
PART_EVENTS = ("response.content_part.added", "response.content_part.done")


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _usage() -> Schema:
    return obj({"input_tokens": COUNT, "input_tokens_details": obj({"cached_tokens": COUNT}, ("cached_tokens",)),
                "output_tokens": COUNT, "output_tokens_details": obj({"reasoning_tokens": {"const": 0}},
                                                                     ("reasoning_tokens",)),
                "total_tokens": COUNT},
               ("input_tokens", "input_tokens_details", "output_tokens", "output_tokens_details", "total_tokens"))


def _response() -> Schema:
    props: Schema = {
        "id": {"type": "string", "pattern": "^resp_"}, "object": {"const": "response"},
        "created_at": {"type": "integer"}, "status": {"enum": [*STATUS["enum"], "failed"]},
        "background": {"const": False},
        "error": nullable(obj({"code": STRING, "message": STRING}, ("code", "message"))),
        "incomplete_details": nullable(obj({"reason": {"const": "max_output_tokens"}}, ("reason",))),
        "model": STRING, "output": {"type": "array", "items": ref("ResponseOutputItem")},
        "usage": nullable(ref("ResponseUsage")), "store": {"const": False}, "truncation": {"const": "disabled"},
        "service_tier": STRING, "previous_response_id": {"type": "null"}, "max_tool_calls": {"type": "null"},
        "instructions": nullable(STRING), "max_output_tokens": nullable(COUNT), "temperature": NUMBER,
        "top_p": NUMBER, "tools": {"type": "array", "items": {"type": "object"}},
        "tool_choice": {"description": "as the request gave it (auto when it gave none)"},
        "parallel_tool_calls": BOOLEAN, "text": obj({"format": {"type": "object"}}, ("format",)),
        "metadata": {"type": "object", "additionalProperties": STRING},
        "user": nullable(STRING), "safety_identifier": nullable(STRING),
    }
    return {**obj(props, tuple(props)), "description": "status completed, or incomplete (incomplete_details) when "
            "max_output_tokens or the model's context ended the output; the request's settings repeated"}


def _items() -> dict[str, Schema]:
    text = obj({"type": {"const": "output_text"}, "text": STRING, "annotations": {"type": "array", "maxItems": 0},
                "logprobs": {"type": "array", "maxItems": 0}}, ("type", "text", "annotations"))
    message = obj({"id": {"type": "string", "pattern": "^msg_"}, "type": {"const": "message"}, "status": STATUS,
                   "role": {"const": "assistant"}, "content": {"type": "array", "items": ref("ResponseOutputText")}},
                  ("id", "type", "status", "role", "content"))
    call = obj({"id": {"type": "string", "pattern": "^fc_"}, "type": {"const": "function_call"}, "status": STATUS,
                "call_id": STRING, "name": STRING, "arguments": {"type": "string", "description": "JSON text"}},
               ("id", "type", "status", "call_id", "name", "arguments"))
    return {"ResponseOutputText": text, "ResponseMessage": message, "ResponseFunctionCall": call,
            "ResponseOutputItem": {"anyOf": [ref("ResponseMessage"), ref("ResponseFunctionCall")]}}


def _event(kind: str, props: Schema) -> Schema:
    return obj({"type": {"const": kind}, "sequence_number": INDEX, **props}, ("type", "sequence_number", *props))


def _events() -> Schema:
    """One schema per event type, as anyOf."""
    at = {"item_id": STRING, "output_index": INDEX}
    part = {**at, "content_index": INDEX}
    logprobs = {"type": "array", "maxItems": 0}
    events = [_event(k, {"response": ref("Response")}) for k in RESPONSE_EVENTS]
    events += [_event(k, {"output_index": INDEX, "item": ref("ResponseOutputItem")}) for k in ITEM_EVENTS]
    events += [_event(k, {**part, "part": ref("ResponseOutputText")}) for k in PART_EVENTS]
    events += [_event("response.output_text.delta", {**part, "delta": STRING, "logprobs": logprobs}),
               _event("response.output_text.done", {**part, "text": STRING, "logprobs": logprobs}),
               _event("response.function_call_arguments.delta", {**at, "delta": STRING}),
               _event("response.function_call_arguments.done", {**at, "name": STRING, "arguments": STRING})]
    return {"anyOf": events}


def event_types() -> list[str]:
    """Every event type a stream sends."""
    return [e["properties"]["type"]["const"] for e in _events()["anyOf"]]


def stream_schema() -> Schema:
    """One server-sent event of a streamed response: `event: TYPE` and `data:` the JSON event of that type. The
    stream ends with response.completed, response.incomplete, or response.failed (generation failed)."""
    return {"type": "object", "required": ["event", "data"],
            "description": "one event (`event:` and `data:` lines); the last is response.completed, "
                           "response.incomplete or response.failed",
            "properties": {"event": {"enum": event_types()},
                           "data": {"type": "string", "contentMediaType": "application/json",
                                    "contentSchema": ref("ResponseStreamEvent")}}}


def components() -> dict[str, Schema]:
    """The response schemas of /v1/responses, by name."""
    return {"Response": _response(), "ResponseUsage": _usage(), **_items(), "ResponseStreamEvent": _events()}
