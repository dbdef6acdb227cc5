"""POST /v1/responses' request translated onto the chat path: each field checked by its definition
(responses_fields.py), then the body rewritten as a chat completions body (input items as chat messages,
function tools and tool_choice in chat's shape, text.format as response_format, max_output_tokens as
max_completion_tokens) that protocol.chat_job turns into the Job the scheduler runs, as llama-server
serves the Responses API. A refusal names this route's field: one the chat path raises is renamed (messages
-> input, ...). The settings the response object repeats come back beside the Job. No torch here.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from gptport.serve.api import protocol, responses_fields
from gptport.serve.api.api_error import ApiError, bad
from gptport.serve.api.protocol import Job
from gptport.serve.api.shapes import FUNCTION_NAME
from gptport.tokenizer import BPETokenizer

ROLES = ("user", "system", "developer", "assistant")
PARTS = ("input_text", "output_text")
MESSAGE_KEYS = frozenset(responses_fields.MESSAGE_ITEM["properties"])
CALL_KEYS = frozenset(responses_fields.CALL_ITEM["properties"])
OUTPUT_KEYS = frozenset(responses_fields.OUTPUT_ITEM["properties"])
PART_KEYS = frozenset(responses_fields.TEXT_PART["properties"])
TOOL_KEYS = frozenset(responses_fields.TOOL["properties"])
SCHEMA_KEYS = frozenset(responses_fields.FORMAT_SCHEMA["properties"])
NAME = re.compile(FUNCTION_NAME)
# a chat field's name -> this route's (longest first: a prefix is renamed with what follows it)
RENAMED = (("response_format.json_schema.schema", "text.format.schema"), ("response_format.json_schema", "text.format"),
           ("response_format", "text.format"), ("max_completion_tokens", "max_output_tokens"), ("messages", "input"))
ITEMS = "message, function_call and function_call_output"


def responses_job(body: Any, tok: BPETokenizer, n_ctx: int, slots: int, render: Any) -> tuple[Job, dict[str, Any]]:
    """The Job of a Responses request, and the settings its response repeats (instructions, sampling, tools,
    tool_choice, text, metadata, ...)."""
    f = responses_fields.reader(body)
    for name in ("store", "background", "truncation", "include", "service_tier"):
        f.read(name)
    responses_fields.stream_options(f.read("stream_options"))
    instructions, user, safety = f.read("instructions"), f.read("user"), f.read("safety_identifier")
    meta = responses_fields.metadata(f.read("metadata"))
    messages = input_messages(f.body.get("input"))
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    tools, parallel = function_tools(f.body.get("tools")), f.read("parallel_tool_calls")
    choice = tool_choice(f.body.get("tool_choice"))
    if not tools and choice == "auto":  # the default, without tools: nothing to choose from
        choice = None
    text = f.read("text")
    response_format = text_format(text)
    temperature, top_p, most = f.read("temperature"), f.read("top_p"), f.read("max_output_tokens")
    stream = f.read("stream")
    chat: dict[str, Any] = {"messages": messages, "temperature": temperature, "top_p": top_p,
                            "max_completion_tokens": most or n_ctx, "stream": stream,
                            "tools": [{"type": "function", "function": _function(t)} for t in tools] or None,
                            "tool_choice": choice, "parallel_tool_calls": parallel, "response_format": response_format}
    if stream:
        chat["stream_options"] = {"include_usage": True}  # the last chunk's usage goes into response.completed
    try:
        job = protocol.chat_job(chat, tok, n_ctx, slots, render)
    except ApiError as e:
        raise renamed(e) from e
    if job.spec is not None and job.spec.origin.startswith("'response_format"):
        job = replace(job, spec=replace(job.spec, origin="'text.format.schema'"))
    echo = {"instructions": instructions, "max_output_tokens": most, "temperature": temperature, "top_p": top_p,
            "tools": tools, "tool_choice": f.body.get("tool_choice") or "auto",
            "parallel_tool_calls": True if parallel is None else parallel,
            "text": {"format": (text or {}).get("format") or {"type": "text"}}, "metadata": meta, "user": user,
            "safety_identifier": safety}
    return job, echo


def renamed(e: ApiError) -> ApiError:
    """A refusal of the chat path with the field named as this route names it."""
    param = e.param or ""
    for old, new in RENAMED:
        if param == old or param.startswith(old + "."):
            to = new + param[len(old):]
            return ApiError(e.status, e.message.replace(f"'{param}'", f"'{to}'", 1), to, e.code)
    return e


def input_messages(value: Any) -> list[dict[str, Any]]:
    """`input` as chat messages: a string is one user message; a function_call item is an assistant's
    tool call (consecutive calls, and a call after an assistant's text, join that assistant message);
    a function_call_output item is a tool message answering an earlier call."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if value is None:
        raise bad("input", "is required", "missing")
    if not isinstance(value, list) or not value:
        raise bad("input", f"expected a string or a non-empty list of items ({ITEMS})", "invalid_type")
    out: list[dict[str, Any]] = []
    calls: set[str] = set()
    for i, raw in enumerate(value):
        if not isinstance(raw, dict):
            raise bad("input", f"item {i}: expected an object ({ITEMS})", "invalid_type")
        item = {k: v for k, v in raw.items() if v is not None}
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            out.append(_message(i, item))
        elif kind == "function_call":
            call = _call(i, item)
            calls.add(call["id"])
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            _keys(i, item, OUTPUT_KEYS)
            call_id = item.get("call_id")
            if call_id not in calls:
                raise bad("input", f"item {i}: no function_call before it has call_id {call_id!r}", "invalid_value")
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(i, item.get("output"), "output")})
        elif isinstance(kind, str):
            why = "gptport keeps no items: send the item itself" if kind == "item_reference" else \
                f"gptport takes {ITEMS}"
            raise bad("input", f"item {i}: type {kind!r} is not supported; {why}", "unsupported")
        else:
            raise bad("input", f"item {i}: needs a 'type' ({ITEMS}) or a 'role'", "invalid_type")
    return out


def _keys(i: int, item: dict[str, Any], known: frozenset[str]) -> None:
    unknown = sorted(set(item) - known)
    if unknown:
        raise bad("input", f"item {i}: unknown key {unknown[0]!r} in a {item.get('type', 'message')} item",
                  "invalid_value")
    for key in ("id", "status"):
        if key in item and not isinstance(item[key], str):
            raise bad("input", f"item {i}: '{key}' must be a string", "invalid_type")


def _message(i: int, item: dict[str, Any]) -> dict[str, Any]:
    _keys(i, item, MESSAGE_KEYS)
    role = item.get("role")
    if role not in ROLES:
        raise bad("input", f"item {i}: role must be one of {', '.join(ROLES)}, not {role!r:.40}", "invalid_value")
    return {"role": role, "content": _text(i, item.get("content"), "content")}


def _text(i: int, content: Any, key: str) -> str:
    """A message's content or a call's output: a string, or a list of text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad("input", f"item {i}: '{key}' must be a string or a list of text parts", "invalid_type")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind not in PARTS:
            raise bad("input", f"item {i}: content part type {kind!r} is not supported; gptport takes text "
                      f"({', '.join(PARTS)})", "unsupported")
        if kind is None or not isinstance(part.get("text"), str) or set(part) - PART_KEYS:
            raise bad("input", f"item {i}: a content part is {{type: input_text or output_text, text}}",
                      "invalid_type")
        texts.append(part["text"])
    return "".join(texts)


def _call(i: int, item: dict[str, Any]) -> dict[str, Any]:
    """A function_call item as chat's tool call."""
    _keys(i, item, CALL_KEYS)
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not isinstance(call_id, str) or not call_id:
        raise bad("input", f"item {i}: a function_call needs a call_id", "invalid_type")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise bad("input", f"item {i}: function name {name!r:.70} must be 1-64 letters, digits, _ or -",
                  "invalid_value")
    if not isinstance(arguments, str):
        raise bad("input", f"item {i}: 'arguments' must be JSON text (a string)", "invalid_type")
    try:
        json.loads(arguments)
    except json.JSONDecodeError as e:
        raise bad("input", f"item {i}: the arguments of {name!r} are not JSON ({e})", "invalid_value") from e
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def function_tools(value: Any) -> list[dict[str, Any]]:
    """The function tools ({type: function, name, description, parameters, strict}); chat_job checks each
    one's values as chat's tools (the same item numbers)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad("tools", "expected a list of {type: function, name, parameters}", "invalid_type")
    for i, t in enumerate(value):
        kind = t.get("type") if isinstance(t, dict) else None
        if isinstance(kind, str) and kind != "function":
            raise bad("tools", f"item {i}: type {kind!r} is not supported; gptport takes function tools",
                      "unsupported")
        if kind is None:
            raise bad("tools", f"item {i}: expected {{type: function, name, parameters}}", "invalid_type")
        unknown = sorted(set(t) - TOOL_KEYS)
        if unknown:
            raise bad("tools", f"item {i}: unknown key {unknown[0]!r} in a function tool", "invalid_value")
        if not isinstance(t.get("name"), str) or not NAME.fullmatch(t["name"]):
            raise bad("tools", f"item {i}: function name {t.get('name')!r:.70} must be 1-64 letters, digits, _ or -",
                      "invalid_value")
    return [{k: v for k, v in t.items() if v is not None} for t in value]


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in tool.items() if k != "type"}


def tool_choice(value: Any) -> Any:
    """tool_choice in chat's shape: none, auto, required, or {type: function, function: {name}}."""
    if value is None or value in ("none", "auto", "required"):
        return value
    if isinstance(value, str):
        raise bad("tool_choice", f"must be none, auto, required or {{type: function, name}}, not {value!r:.40}",
                  "invalid_value")
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise bad("tool_choice", "expected none, auto, required or {type: function, name}", "invalid_type")
    if value["type"] != "function":
        raise bad("tool_choice", f"{value['type']!r:.40} is not supported; use none, auto, required or a function",
                  "unsupported")
    if set(value) - {"type", "name"} or not isinstance(value.get("name"), str):
        raise bad("tool_choice", "a function is {type: function, name}", "invalid_value")
    return {"type": "function", "function": {"name": value["name"]}}


def text_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """text.format as chat's response_format (None: no constraint)."""
    if text is None:
        return None
    unknown = sorted(set(text) - {"format"})
    if unknown:
        what = "is not supported" if unknown[0] == "verbosity" else "is not a key of text (format is)"
        raise bad(f"text.{unknown[0]}", what, "unsupported" if unknown[0] == "verbosity" else "invalid_value")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise bad("text.format", "expected an object with a 'type'", "invalid_type")
    kind = fmt["type"]
    if kind in ("text", "json_object"):
        if set(fmt) != {"type"}:
            raise bad("text.format", f"type {kind} takes no other key", "invalid_value")
        return None if kind == "text" else {"type": "json_object"}
    if kind != "json_schema":
        raise bad("text.format.type", f"must be text, json_object or json_schema, not {kind!r:.40}", "invalid_value")
    unknown = sorted(set(fmt) - SCHEMA_KEYS)
    if unknown:
        raise bad("text.format", f"unknown key {unknown[0]!r}", "invalid_value")
    name, schema = fmt.get("name"), fmt.get("schema")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise bad("text.format.name", "must be 1-64 letters, digits, _ or -", "invalid_value")
    if not isinstance(schema, dict):
        raise bad("text.format.schema", "expected a JSON schema object", "invalid_type")
    for key, kinds, what in (("strict", bool, "true or false"), ("description", str, "a string")):
        if fmt.get(key) is not None and not isinstance(fmt[key], kinds):
            raise bad(f"text.format.{key}", f"expected {what}", "invalid_type")
    spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
    return {"type": "json_schema", "json_schema": spec}
