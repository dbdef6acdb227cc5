"""A request's output constraint: OpenAI's `response_format`, and beside it, as vLLM and llama-server
offer, `json_schema`, `regex`, `grammar` (Lark or GBNF) and `choice`, or vLLM's `structured_outputs`
object holding one of json, regex, grammar, choice. At most one per request. Their JSON schemas, whose
keys the checks here take, are in shapes.py. No torch here.
"""

from __future__ import annotations

from typing import Any

from gptport.runtime.constraint import Spec
from gptport.serve.api import shapes
from gptport.serve.api.api_error import bad

TOP_LEVEL = {"json_schema": "json_schema", "regex": "regex", "grammar": "grammar", "choice": "choice"}
# structured_outputs' keys (shapes.py) and the kind of constraint each is: json holds a JSON schema
STRUCTURED_OUTPUTS = {key: "json_schema" if key == "json" else key for key in shapes.keys(shapes.STRUCTURED_OUTPUTS)}
RESPONSE_FORMAT_KEYS = set(shapes.keys(shapes.RESPONSE_FORMAT))
JSON_SCHEMA_KEYS = set(shapes.keys(shapes.JSON_SCHEMA_FORMAT))


def output_spec(body: dict[str, Any]) -> Spec | None:
    """The one constraint the body asks for, checked for shape (the grammar itself compiles later)."""
    found: list[tuple[str, Spec]] = []
    fmt = _response_format(body.get("response_format"))
    if fmt is not None:
        found.append(("response_format", fmt))
    for name, kind in TOP_LEVEL.items():
        value = body.get(name)
        if value is not None:
            found.append((name, Spec(kind, _source(name, kind, value), f"'{name}'")))  # type: ignore[arg-type]
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise bad("structured_outputs", "expected an object with one of json, regex, grammar, choice",
                      "invalid_type")
        unknown = sorted(set(so) - set(STRUCTURED_OUTPUTS))
        if unknown:
            raise bad("structured_outputs", f"unsupported key {unknown[0]!r}; gptport takes one of "
                      f"{', '.join(STRUCTURED_OUTPUTS)}", "unsupported")
        for key, value in so.items():
            if value is not None:
                kind = STRUCTURED_OUTPUTS[key]
                field = f"structured_outputs.{key}"
                found.append((field, Spec(kind, _source(field, kind, value), f"'{field}'")))  # type: ignore[arg-type]
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise bad(found[1][0], f"one output constraint per request, not {len(found)} ({names})", "invalid_value")
    return found[0][1] if found else None


def _response_format(value: Any) -> Spec | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise bad("response_format", "expected an object with a 'type'", "invalid_type")
    unknown = sorted(set(value) - RESPONSE_FORMAT_KEYS)
    if unknown:
        raise bad("response_format", f"unknown key {unknown[0]!r}", "invalid_value")
    kind = value["type"]
    if kind in ("text", "json_object") and "json_schema" in value:
        raise bad("response_format.json_schema", f"goes with type json_schema, not {kind}", "invalid_value")
    if kind == "text":
        return None
    if kind == "json_object":
        return Spec("json_object", None, "'response_format'")
    if kind == "json_schema":
        js = value.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("name"), str):
            raise bad("response_format.json_schema", "expected an object with a 'name' and a 'schema'",
                      "invalid_type")
        unknown = sorted(set(js) - JSON_SCHEMA_KEYS)
        if unknown:
            raise bad("response_format.json_schema", f"unknown key {unknown[0]!r}", "invalid_value")
        if js.get("strict") is not None and not isinstance(js["strict"], bool):
            raise bad("response_format.json_schema.strict", "expected true or false", "invalid_type")
        schema = js.get("schema", {})
        if not isinstance(schema, dict):
            raise bad("response_format.json_schema.schema", "expected a JSON schema object", "invalid_type")
        return Spec("json_schema", schema, "'response_format.json_schema.schema'")
    raise bad("response_format.type", f"must be text, json_object or json_schema, not {kind!r}", "invalid_value")


def _source(field: str, kind: str, value: Any) -> Any:
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise bad(field, "expected a non-empty list of non-empty strings", "invalid_type")
        return value
    if kind == "json_schema":
        if not isinstance(value, (dict, str)):
            raise bad(field, "expected a JSON schema (an object)", "invalid_type")
        return value
    if not isinstance(value, str) or not value:
        raise bad(field, "expected a non-empty string", "invalid_type")
    return value
