"""Tool calls: OpenAI's `tools` and `tool_choice` checked (their JSON schemas, whose keys and name
pattern the checks here take, are in shapes.py), and the grammar a reply must follow (tool_stream.py reads
the reply back into `tool_calls`). No torch here.

A call is written as `<tool_call>{"name": NAME, "arguments": {...}}</tool_call>` at the start of the
reply (the format of Hermes-style chat templates), one call per reply. `required` and a named function
constrain the whole reply to a call of the allowed functions, with arguments valid under the function's
`parameters`; `auto` lets the reply be free text (or the response_format's JSON) or a call: once the
reply starts with `<tool_call>`, the call's grammar holds (llama.cpp's lazy grammar, as one Lark
grammar); `none` constrains nothing and puts no tool in the prompt.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gptport.runtime.constraint import JSON_OPTIONS, Spec
from gptport.serve.api import shapes
from gptport.serve.api.api_error import bad

OPEN, CLOSE = "<tool_call>", "</tool_call>"
NAME = re.compile(shapes.FUNCTION_NAME)
FUNCTION_KEYS = set(shapes.keys(shapes.FUNCTION))
FREE_TEXT = r"/(?s:.*)/ & ~/<tool_call>(?s:.*)/"  # any text that does not start a call


@dataclass(frozen=True)
class Function:
    name: str
    description: str
    parameters: dict[str, Any]

    def card(self) -> dict[str, Any]:
        """How the plain template shows it to the model."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


@dataclass(frozen=True)
class Tools:
    """A request's tools and the choice among them: mode is none, auto or required (a named function is
    `required` with one allowed)."""

    functions: tuple[Function, ...]
    mode: str
    allowed: tuple[Function, ...]
    raw: list[dict[str, Any]]  # the request's `tools`, for a chat template

    @property
    def active(self) -> bool:
        return self.mode != "none"


def parse_tools(body: dict[str, Any]) -> Tools | None:
    """`tools` and `tool_choice` checked; None when the request has no tools."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise bad("tool_choice", "needs 'tools'", "invalid_value")
        return None
    if not isinstance(tools, list) or not tools:
        raise bad("tools", "expected a non-empty list of {type: function, function: {...}}", "invalid_type")
    functions: list[Function] = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            kind = t.get("type") if isinstance(t, dict) else None
            if kind is not None and kind != "function":
                raise bad("tools", f"item {i}: type {kind!r} is not supported; gptport takes function tools",
                          "unsupported")
            raise bad("tools", f"item {i}: expected {{type: function, function: {{name, parameters}}}}",
                      "invalid_type")
        f = t["function"]
        unknown = sorted(set(f) - FUNCTION_KEYS)
        if unknown:
            raise bad("tools", f"item {i}: unknown key {unknown[0]!r} in function", "invalid_value")
        name = f.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise bad("tools", f"item {i}: function name {name!r} must be 1-64 letters, digits, _ or -",
                      "invalid_value")
        if any(fn.name == name for fn in functions):
            raise bad("tools", f"item {i}: function {name!r} is defined twice", "invalid_value")
        params = f.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad("tools", f"item {i}: 'parameters' must be a JSON schema object", "invalid_type")
        description = f.get("description")
        if description is not None and not isinstance(description, str):
            raise bad("tools", f"item {i}: 'description' must be a string", "invalid_type")
        if f.get("strict") is not None and not isinstance(f["strict"], bool):
            raise bad("tools", f"item {i}: 'strict' must be true or false", "invalid_type")
        params, description = params or {"type": "object", "properties": {}}, description or ""
        functions.append(Function(name, description, params))
    mode, allowed = _choice(choice, functions)
    return Tools(tuple(functions), mode, allowed, tools)


def _choice(choice: Any, functions: list[Function]) -> tuple[str, tuple[Function, ...]]:
    if choice is None or choice in ("auto", "required", "none"):
        return choice or "auto", tuple(functions)
    if isinstance(choice, str):
        raise bad("tool_choice", f"must be none, auto, required or {{type: function, function: {{name}}}}, "
                  f"not {choice!r}", "invalid_value")
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        named = [f for f in functions if f.name == name]
        if not named:
            raise bad("tool_choice", f"function {name!r} is not among the tools "
                      f"({', '.join(f.name for f in functions)})", "invalid_value")
        return "required", tuple(named)
    kind = choice.get("type") if isinstance(choice, dict) else type(choice).__name__
    raise bad("tool_choice", f"{kind!r} is not supported; use none, auto, required or a function", "unsupported")


def generation_schema(schema: Any, close: bool = True) -> Any:
    """A function's `parameters` as its calls are generated: an object schema that lists `properties` and
    says nothing of `additionalProperties` (nor `unevaluatedProperties`) takes no other property, as
    llama.cpp's and vLLM's (xgrammar's strict mode) grammars read it; an explicit `additionalProperties`
    (true, or a schema) is kept. Where several schemas describe the same object (`properties` beside an
    anyOf, oneOf, allOf or $ref, the members of an allOf of several) none is closed: closed, one would
    refuse what another lists. What sits under `not`, `if`, `then`, `else` and `dependentSchemas` is left
    as it is. No bound is added (design record 0033)."""
    if isinstance(schema, list):
        return [generation_schema(s, close) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in ("properties", "patternProperties", "$defs", "definitions"):
        if isinstance(out.get(key), dict):
            out[key] = {name: generation_schema(sub) for name, sub in out[key].items()}
    for key in ("items", "prefixItems", "additionalProperties", "contains"):
        if key in out:
            out[key] = generation_schema(out[key])
    listed = isinstance(out.get("properties"), dict)
    for key in ("anyOf", "oneOf", "allOf"):  # members that describe the value by themselves are closed
        members = out.get(key)
        if isinstance(members, list):
            out[key] = generation_schema(members, not listed and (key != "allOf" or len(members) == 1))
    beside = ("additionalProperties", "unevaluatedProperties", "anyOf", "oneOf", "allOf", "$ref")
    if close and listed and not any(key in out for key in beside):
        out["additionalProperties"] = False
    return out


def call_schema(functions: tuple[Function, ...]) -> dict[str, Any]:
    """The JSON schema of one call of any of these functions, `name` first (llguidance keeps the order of
    `properties`, which the stream's reader of a call relies on)."""
    branches = [{"type": "object", "properties": {"name": {"const": f.name},
                                                  "arguments": generation_schema(f.parameters)},
                 "required": ["name", "arguments"], "additionalProperties": False} for f in functions]
    schema: dict[str, Any] = branches[0] if len(branches) == 1 else {"anyOf": branches}
    return {**schema, "x-guidance": JSON_OPTIONS}


def reply_spec(tools: Tools, text_spec: Spec | None) -> Spec | None:
    """The constraint on the whole reply: a call (required), or free text / the response_format's JSON
    or a call (auto). None for `none`."""
    if not tools.active:
        return text_spec
    call = f"call: %json {json.dumps(call_schema(tools.allowed))}"
    opened = f'"{OPEN}" call "{CLOSE}"'
    if tools.mode == "required":
        return Spec("lark", f"start: {opened}\n{call}", "'tools'")
    if text_spec is None:
        free = f"FREE_TEXT\nFREE_TEXT: {FREE_TEXT}"
    elif text_spec.kind in ("json_schema", "json_object"):
        schema = text_spec.source if text_spec.kind == "json_schema" else {"type": "object"}
        if isinstance(schema, str):
            schema = json.loads(schema)
        free = f"answer\nanswer: %json {json.dumps({'x-guidance': JSON_OPTIONS, **schema})}"
    else:
        raise bad("tools", "tools with tool_choice auto combine with response_format only, not with a regex, "
                  "grammar or choice", "invalid_value")
    return Spec("lark", f"start: {opened} | {free}\n{call}", "'tools'")


def plain_block(tools: Tools) -> str:
    """The plain template's block that offers the tools to the model."""
    lines = [json.dumps(f.card(), ensure_ascii=False, separators=(",", ":")) for f in tools.allowed]
    return ("Tools: call one by answering " + OPEN + '{"name": NAME, "arguments": {...}}' + CLOSE + "\n"
            + "\n".join(lines))


def call_text(call: dict[str, Any]) -> str:
    """An assistant message's tool call as the plain template writes it back into the prompt."""
    fn = call.get("function") if isinstance(call, dict) else None
    if isinstance(call, dict) and "type" in call and call["type"] != "function":
        raise ValueError(f"a tool call's type is 'function', not {json.dumps(call['type'])}")
    if isinstance(call, dict) and "id" in call and not isinstance(call["id"], str):
        raise ValueError("a tool call's id must be a string")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ValueError("a tool call needs function.name")
    args = fn.get("arguments", "{}")
    try:
        parsed = json.loads(args) if isinstance(args, str) else args
    except json.JSONDecodeError as e:
        raise ValueError(f"function.arguments of {fn['name']!r} is not JSON ({e})") from e
    return OPEN + json.dumps({"name": fn["name"], "arguments": parsed}, ensure_ascii=False) + CLOSE
