"""The chat path's answer translated back into OpenAI's Responses API: a chat completion into the response
object (a `message` item with the reply's text and a `function_call` item per tool call), and a chat
stream's chunks into the Responses events (response.created ... response.completed), each `event: TYPE`
and `data: {...}` with its sequence_number. Only chat's output shapes are read (message.content and
message.tool_calls; delta.content, and delta.tool_calls by index with id, function.name and pieces of
function.arguments; finish_reason; usage), so this holds whether a call arrives whole or in pieces, and
whether a call cut short by max_tokens is returned. No torch here.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from gptport.serve.api.protocol import Job

EMPTY_USAGE = {"prompt_tokens": 0, "completion_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}}


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(24)


def usage(chat: dict[str, Any]) -> dict[str, Any]:
    """Chat's usage in the Responses API's words."""
    cached = (chat.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": chat["prompt_tokens"], "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": chat["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat["prompt_tokens"] + chat["completion_tokens"]}


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [] if status == "in_progress" else [text_part(text)]}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}


@dataclass
class Reply:
    """One request's response object: its id, the settings it repeats, and the translations of the chat
    path's answer (app.run calls `response` with a chat completion, `stream` with a chat stream)."""

    job: Job
    echo: dict[str, Any]
    id: str = field(default_factory=lambda: new_id("resp_"))

    def envelope(self, status: str, output: list[dict[str, Any]], use: dict[str, Any] | None,
                 reason: str | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response object: what was generated and the request's settings."""
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.job.created, "status": status,
                "background": False, "error": error, "incomplete_details": incomplete, "model": self.job.model,
                "output": output, "usage": use, "store": False, "truncation": "disabled", "service_tier": "default",
                "previous_response_id": None, "max_tool_calls": None, **self.echo}

    def response(self, chat: dict[str, Any]) -> dict[str, Any]:
        """A chat completion (one choice) as the response object."""
        choice = chat["choices"][0]
        message, reason = choice["message"], choice["finish_reason"]
        status = "incomplete" if reason == "length" else "completed"
        calls = message.get("tool_calls") or []
        output = []
        if message.get("content") or not calls:
            output.append(message_item(new_id("msg_"), message.get("content") or "", "completed"))
        output += [call_item(new_id("fc_"), c["id"], c["function"]["name"], c["function"]["arguments"], "completed")
                   for c in calls]
        output[-1]["status"] = status  # the last item is the one the finish ended (cut short: incomplete)
        return self.envelope(status, output, usage(chat["usage"]))

    def stream(self, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        """A chat stream's chunks as the Responses API's events."""
        return Events(self).run(chunks)


class Events:
    """The state of one streamed response: its items so far, the one open, and the next sequence number."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # each item as it will be when done
        self.open: dict[str, Any] | None = None  # the item being generated
        self.text: list[str] = []  # the open message's text so far
        self.calls: dict[int, dict[str, Any]] = {}  # chat's tool call index -> its function_call item
        self.reason: str | None = None
        self.use: dict[str, Any] | None = None

    def event(self, kind: str, **data: Any) -> str:
        body = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"

    async def run(self, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        head = self.reply.envelope("in_progress", [], None)
        yield self.event("response.created", response=head) + self.event("response.in_progress", response=head)
        try:
            async for part in chunks:
                out = []
                for block in part.split("\n\n"):
                    if not block.startswith("data: "):
                        continue
                    data = block[len("data: "):]
                    if data == "[DONE]":
                        out += self.finish()
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        out.append(self.failed(chunk["error"]))
                        yield "".join(out)
                        return
                    out += self.chunk(chunk)
                if out:
                    yield "".join(out)
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()  # a client that left: the chat stream cancels its choices

    def chunk(self, chunk: dict[str, Any]) -> list[str]:
        """One chat chunk's events."""
        if chunk.get("usage"):
            self.use = usage(chunk["usage"])
        out: list[str] = []
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self.content(delta["content"])
            for call in delta.get("tool_calls") or ():
                out += self.call(call)
            if choice.get("finish_reason"):
                self.reason = choice["finish_reason"]
        return out

    def content(self, text: str) -> list[str]:
        """A piece of the reply's text: a delta of the open message (opened first where none is)."""
        out = [] if self.open is not None and self.open["type"] == "message" else self.open_message()
        assert self.open is not None
        self.text.append(text)
        return [*out, self.event("response.output_text.delta", item_id=self.open["id"], output_index=len(self.output),
                                 content_index=0, delta=text, logprobs=[])]

    def open_message(self) -> list[str]:
        """The open item closed, and a message item with one output_text part opened."""
        out = self.close()
        self.open, self.text = message_item(new_id("msg_"), "", "in_progress"), []
        index = len(self.output)
        return [*out, self.event("response.output_item.added", output_index=index, item=self.open),
                self.event("response.content_part.added", item_id=self.open["id"], output_index=index,
                           content_index=0, part=text_part(""))]

    def call(self, call: dict[str, Any]) -> list[str]:
        """A tool call's delta: its first opens a function_call item, each piece of arguments is a delta."""
        out = []
        index = call.get("index", 0)
        fn = call.get("function") or {}
        item = self.calls.get(index)
        if item is None or item is not self.open:
            out += self.close()
            item = call_item(new_id("fc_"), call.get("id") or new_id("call_"), fn.get("name") or "", "", "in_progress")
            self.calls[index], self.open = item, item
            out.append(self.event("response.output_item.added", output_index=len(self.output), item=dict(item)))
        if fn.get("name") and not item["name"]:
            item["name"] = fn["name"]
        if fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            out.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                  output_index=len(self.output), delta=fn["arguments"]))
        return out

    def status(self) -> str:
        return "incomplete" if self.reason == "length" else "completed"

    def close(self) -> list[str]:
        """The open item's closing events; it joins the output."""
        item, self.open = self.open, None
        if item is None:
            return []
        index, status = len(self.output), self.status()
        if item["type"] == "message":
            text = "".join(self.text)
            item = message_item(item["id"], text, status)
            out = [self.event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                              text=text, logprobs=[]),
                   self.event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                              part=text_part(text))]
        else:
            item = {**item, "status": status}
            out = [self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                              name=item["name"], arguments=item["arguments"])]
        self.output.append(item)
        return [*out, self.event("response.output_item.done", output_index=index, item=item)]

    def finish(self) -> list[str]:
        """The chat stream's end: the open item closes (a reply of nothing is an empty message), and the whole
        response goes out in response.completed (response.incomplete at max_output_tokens)."""
        out = []
        if self.open is None and not self.output:
            out += self.open_message()
        out += self.close()
        status = self.status()
        use = self.use or usage(EMPTY_USAGE)
        whole = self.reply.envelope(status, self.output, use)
        return [*out, self.event(f"response.{status}", response=whole)]

    def failed(self, error: dict[str, Any]) -> str:
        """Generation failed mid-stream: response.failed with the items so far and the error."""
        self.open = None
        whole = self.reply.envelope("failed", self.output, None,
                                    error={"code": "server_error", "message": str(error.get("message", ""))})
        return self.event("response.failed", response=whole)
