"""A chat reply read as a tool call while it is generated, and told in OpenAI's chat shapes: the whole
message (`message.tool_calls`) or a stream's deltas (`delta.tool_calls`). No torch here.

The model writes a call as `<tool_call>{"name": NAME, "arguments": ARGS}</tool_call>` (tools.py's grammar
holds it to that form, the name first). A reply that opens the tag is a call from its first token: its
markup never reaches `content`. The call goes out once its name is whole, and its arguments are ARGS's text
as the model writes it, piece by piece when streamed (so a call cut short carries the arguments written so
far, as OpenAI's API does). What a reply says at its end:

- a whole call: `tool_calls: [call]`, `content: null`, finish_reason `tool_calls`;
- a call cut short (max_tokens, the context, a stop sequence) after its name: the call as far as it got
  (its arguments possibly incomplete JSON), `content: null`, the engine's finish_reason (`length`, `stop`);
- a call cut before its name was whole: `content: null`, no `tool_calls`, the engine's finish_reason
  (with tool_choice required or a named function and one function allowed, the name is whole from the
  reply's first token: the grammar leaves no other, so such a call is never cut before its name);
- text (tool_choice auto): `content`, as without tools.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from gptport.serve.api.shapes import FUNCTION_NAME
from gptport.serve.api.tools import CLOSE, OPEN, Tools

# up to the name's closing quote (a function's name: shapes.FUNCTION_NAME without its anchors)
NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"(' + FUNCTION_NAME.strip("^$") + ')"')
ARGUMENTS = re.compile(r'\s*,\s*"arguments"\s*:')
END = re.compile(r"\s*\}\s*" + re.escape(CLOSE) + r"\s*")  # after the arguments' value: the call is whole
SCALAR = frozenset("0123456789+-.eEtrufalsn")  # what a number, true, false or null is written with
SPACE = frozenset(" \t\r\n")


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


class CallReader:
    """A call's text as it arrives (the reply from its opening tag on): the name once it is whole, the
    arguments' text so far, and whether the call is whole. Each character is looked at once."""

    def __init__(self, known: str | None = None) -> None:
        self.text = ""
        self.name = known  # a name the grammar leaves no choice of is whole before it is written
        self._at: int | None = None  # where the arguments' value may start (after `"arguments":`)
        self._name_end = 0
        self._pos = 0  # the next character the value scan looks at
        self._start: int | None = None  # the value's first character
        self._end: int | None = None  # one past its last
        self._depth, self._in_string, self._escaped, self._scalar = 0, False, False, False

    def feed(self, text: str) -> None:
        self.text += text
        if not self._name_end:
            m = NAME.match(self.text, len(OPEN)) if self.text.startswith(OPEN) else None
            if m is None:
                return
            self.name, self._name_end = m.group(1), m.end()
        if self._at is None:
            m = ARGUMENTS.match(self.text, self._name_end)
            if m is None:
                return
            self._at = self._pos = m.end()
        self._scan()

    def _scan(self) -> None:
        """Advance over the arguments' JSON value: brackets counted outside strings, escapes skipped."""
        text, i = self.text, self._pos
        while i < len(text) and self._end is None:
            c = text[i]
            if self._start is None:
                if c not in SPACE:
                    self._start = i
                    self._depth = 1 if c in "{[" else 0
                    self._in_string, self._scalar = c == '"', c in SCALAR
            elif self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
                    if self._depth == 0:  # the value was a string
                        self._end = i + 1
            elif self._scalar:
                if c not in SCALAR:
                    self._end = i
                    break
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._end = i + 1
            i += 1
        self._pos = i

    @property
    def arguments(self) -> str:
        """The arguments' text so far (the whole value once it is complete)."""
        return self.arguments_since(0)

    def arguments_since(self, sent: int) -> str:
        """The arguments' text after its first `sent` characters (what a stream has not sent yet)."""
        if self._start is None:
            return ""
        return self.text[self._start + sent:self._end if self._end is not None else len(self.text)]

    @property
    def complete(self) -> bool:
        """The call is whole: its value, the object's brace and the closing tag."""
        return self._end is not None and END.fullmatch(self.text, self._end) is not None


def known_name(tools: Tools) -> str | None:
    """The name of a call that is whole before the model writes it: tool_choice required (or a named
    function) with one function allowed, where every reply is a call of that function."""
    return tools.allowed[0].name if tools.mode == "required" and len(tools.allowed) == 1 else None


def opens_call(text: str, reason: str | None, required: bool) -> bool | None:
    """Whether a reply is a call: True, False, or None while it cannot be told yet (a prefix of the
    opening tag that has not finished). With tool_choice required or a named function every reply is a
    call; a finished reply that stopped on a prefix of the tag is text (the grammar let it end there), one
    cut by length holding a part of the tag is a call cut before its name."""
    if required or text.startswith(OPEN):
        return True
    if not OPEN.startswith(text):
        return False
    if reason is None:
        return None
    return reason == "length" and text != ""


def call_item(reader: CallReader, id_: str) -> dict[str, Any]:
    """OpenAI's tool_calls item of a call whose name is whole."""
    return {"id": id_, "type": "function", "function": {"name": reader.name, "arguments": reader.arguments}}


def whole_message(text: str, reason: str, tools: Tools) -> tuple[dict[str, Any], str]:
    """A finished reply as OpenAI's chat message and its finish_reason."""
    if not opens_call(text, reason, tools.mode == "required"):
        return {"role": "assistant", "content": text}, reason
    reader = CallReader(known_name(tools))
    reader.feed(text)
    if reader.name is None:  # cut before the name was whole: nothing a client could call
        return {"role": "assistant", "content": None}, reason
    message = {"role": "assistant", "content": None, "tool_calls": [call_item(reader, call_id())]}
    return message, "tool_calls" if reader.complete else reason


class ReplyStream:
    """One streamed chat choice with tools: text is held while it may still open a call (a prefix of the
    tag), then goes out as content deltas; a call goes out as tool_calls deltas, the first once its name is
    whole (index 0, id, type, name, arguments ""), then one per batch of argument text."""

    def __init__(self, tools: Tools) -> None:
        self.required = tools.mode == "required"
        self.held = ""
        self.is_call: bool | None = True if self.required else None
        self.reader = CallReader(known_name(tools))
        self.id: str | None = None
        self.sent = 0  # characters of the arguments sent so far

    def step(self, text: str, reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
        """The deltas to send for this text (in order; none while text is held) and the finish_reason
        to send with the last of them (None until the choice finishes)."""
        deltas: list[dict[str, Any]] = []
        if self.is_call is None:
            self.held += text
            self.is_call = opens_call(self.held, reason, self.required)
            if self.is_call is None:
                return [], None
            text, self.held = self.held, ""
            if not self.is_call and text:
                deltas.append({"content": text})
        elif not self.is_call and text:
            deltas.append({"content": text})
        if not self.is_call:
            return deltas, reason
        self.reader.feed(text)
        deltas += self._call_deltas()  # with a known name, the first goes out at the first token
        if reason is not None and self.id is not None and self.reader.complete:
            reason = "tool_calls"
        return deltas, reason

    def _call_deltas(self) -> list[dict[str, Any]]:
        reader, out = self.reader, []
        if reader.name is None:
            return []
        if self.id is None:
            self.id = call_id()
            out.append({"tool_calls": [{"index": 0, "id": self.id, "type": "function",
                                        "function": {"name": reader.name, "arguments": ""}}]})
        piece = reader.arguments_since(self.sent)
        if piece:
            out.append({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            self.sent += len(piece)
        return out
