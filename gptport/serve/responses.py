"""A job's events turned into OpenAI's response objects: the whole response at the end, or the
server-sent events of a stream, each chunk carrying everything that arrived since the last. No torch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from gptport.serve.engine.events import Failure, Finish, Piece, PromptLogprobs, TokenLogprob
from gptport.serve.protocol import ApiError, Job, chat_logprobs, completion_logprobs, envelope, usage
from gptport.serve.tools import maybe_call, read_call
from gptport.tokenizer import BPETokenizer


class Collector:
    """What each choice of a job has produced so far."""

    def __init__(self, job: Job, tok: BPETokenizer) -> None:
        self.job, self.tok = job, tok
        count = len(job.prompts) * job.n
        self.texts: list[list[str]] = [[] for _ in range(count)]
        self.entries: list[list[TokenLogprob]] = [[] for _ in range(count)]
        self.prompt_entries: list[list[TokenLogprob]] = [[] for _ in range(count)]
        self.reasons: list[str | None] = [None] * count
        self.completion = [0] * count
        self.cached = [0] * count  # each choice's prompt positions from a kept cache
        self.offsets = [0] * count  # text offsets of streamed logprobs; with echo, the prompt's tokens come first
        self.error: str | None = None
        self.held = [""] * count  # a stream's reply text held back while it may be a tool call
        self.plain_text = [job.tools is None] * count  # the reply is text, not a call (streams decide early)

    def add(self, index: int, event: Any) -> None:
        if isinstance(event, Piece):
            self.texts[index].append(event.text)
            if event.logprobs:
                self.entries[index] += event.logprobs
        elif isinstance(event, PromptLogprobs):
            self.prompt_entries[index] = event.entries
        elif isinstance(event, Finish):
            self.reasons[index], self.completion[index] = event.reason, event.completion_tokens
            self.cached[index] = event.cached_tokens
        elif isinstance(event, Failure):
            self.error = self.error or event.message

    @staticmethod
    def failed(event: Any) -> bool:
        return isinstance(event, Failure)

    def usage(self) -> dict[str, Any]:
        """OpenAI's usage; a prompt counts once however many choices it has, and so do its cached tokens
        (the least any of its choices reused: the others copied that one's prefill)."""
        n = self.job.n
        cached = sum(min(self.cached[i * n:(i + 1) * n]) for i in range(len(self.job.prompts)))
        return usage(sum(len(p) for p in self.job.prompts), sum(self.completion), cached)

    def response(self) -> dict[str, Any]:
        """The non-streamed response object."""
        if self.error is not None:
            raise ApiError(503 if "shutting down" in self.error else 500, self.error, None, "generation_failed")
        job, choices = self.job, []
        for i, reason in enumerate(self.reasons):
            text = "".join(self.texts[i])
            if job.chat:
                lp = {"content": chat_logprobs(self.entries[i], self.tok)} if job.logprobs is not None else None
                message: dict[str, Any] = {"role": "assistant", "content": text}
                call = read_call(text) if job.tools is not None and reason == "stop" else None
                if call is not None:
                    message, reason = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
                choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": reason})
                continue
            prompt = job.prompt_texts[i // job.n] if job.echo else ""
            lp = completion_logprobs(self.prompt_entries[i] + self.entries[i], self.tok) \
                if job.logprobs is not None else None
            choices.append({"index": i, "text": prompt + text, "logprobs": lp, "finish_reason": reason})
        return {**envelope(job, False), "choices": choices, "usage": self.usage()}

    def chunk_choice(self, index: int, text: str, entries: list[TokenLogprob], reason: str | None,
                     first: bool = False) -> dict[str, Any]:
        """One choice of a stream chunk."""
        job = self.job
        if job.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else ({"content": text} if text
                                                                                        or reason is None else {})
            if not first and not self.plain_text[index]:
                delta, reason = self._tool_delta(index, text, reason)
            lp = {"content": chat_logprobs(entries, self.tok)} if job.logprobs is not None and entries else None
            return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": reason}
        lp = None
        if job.logprobs is not None and entries:
            lp = completion_logprobs(entries, self.tok, self.offsets[index])
            self.offsets[index] += sum(len(t) for t in lp["tokens"])
        return {"index": index, "text": text, "logprobs": lp, "finish_reason": reason}

    def _tool_delta(self, index: int, text: str, reason: str | None) -> tuple[dict[str, Any], str | None]:
        """A stream's delta where the reply may be a tool call: text is held while it could still open a
        call; a call goes out whole, as one tool_calls delta, when the choice finishes."""
        self.held[index] += text
        held = self.held[index]
        if not maybe_call(held):  # text after all: everything held goes out now
            self.plain_text[index], self.held[index] = True, ""
            return {"content": held}, reason
        if reason is None:
            return {}, None
        call = read_call(held) if reason == "stop" else None
        if call is None:
            return ({"content": held} if held else {}), reason
        return {"tool_calls": [{"index": 0, **call}]}, "tool_calls"


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def stream_chunks(job: Job, col: Collector, queue: asyncio.Queue[tuple[int, Any]], n: int,
                        cancel: Callable[[], None]) -> AsyncIterator[str]:
    """The server-sent events of a streamed job; `cancel` runs if the client leaves before the end."""
    head = envelope(job, True)
    finished = 0
    try:
        if job.chat:  # the assistant's role comes first, as OpenAI sends it
            yield "".join(_sse({**head, "choices": [col.chunk_choice(i, "", [], None, first=True)]}) for i in range(n))
        elif job.echo and job.logprobs is None:
            yield "".join(_sse({**head, "choices": [col.chunk_choice(i, job.prompt_texts[i // job.n], [], None)]})
                          for i in range(n))
        while finished < n:
            items = [await queue.get()]
            while not queue.empty():  # everything that arrived meanwhile goes out together
                items.append(queue.get_nowait())
            order: dict[int, tuple[list[str], list[TokenLogprob], list[str | None]]] = {}
            failure = None
            for index, event in items:
                col.add(index, event)
                texts, entries, reason = order.setdefault(index, ([], [], [None]))
                if isinstance(event, Piece):
                    texts.append(event.text)
                    entries += event.logprobs or []
                elif isinstance(event, PromptLogprobs):  # echo with logprobs: the prompt and its entries
                    texts.insert(0, job.prompt_texts[index // job.n])
                    entries[:0] = event.entries
                elif isinstance(event, Finish):
                    reason[0] = event.reason
                    finished += 1
                elif isinstance(event, Failure):
                    failure = event.message
                    finished += 1
            out = [_sse({**head, "choices": [col.chunk_choice(i, "".join(t), e, r[0])]})
                   for i, (t, e, r) in order.items() if t or e or r[0]]
            if failure is not None:
                out.append(_sse(ApiError(500, failure, None, "generation_failed").body()))
                yield "".join(out)
                finished = n
                break
            if out:
                yield "".join(out)
        tail = [_sse({**head, "choices": [], "usage": col.usage()})] if job.include_usage else []
        yield "".join([*tail, "data: [DONE]\n\n"])
    finally:
        if finished < n:
            cancel()
