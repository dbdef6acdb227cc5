"""A job's events turned into OpenAI's response objects: the whole response at the end, or the
server-sent events of a stream, each chunk carrying everything that arrived since the last. No torch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from gptport.serve.api.protocol import ApiError, Job, chat_logprobs, completion_logprobs, envelope, usage
from gptport.serve.api.tool_stream import ReplyStream, whole_message
from gptport.serve.engine.events import Failure, Finish, Piece, PromptLogprobs, TokenLogprob
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
        # with tools, each streamed chat reply's text or call as it arrives (tool_stream.py)
        self.replies = [ReplyStream(job.tools) if job.tools is not None and job.chat else None for _ in range(count)]
        self.held_entries: list[list[TokenLogprob]] = [[] for _ in range(count)]  # logprobs of held text

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
                if job.tools is not None and reason is not None:
                    message, reason = whole_message(text, reason, job.tools)
                choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": reason})
                continue
            prompt = job.prompt_texts[i // job.n] if job.echo else ""
            lp = completion_logprobs(self.prompt_entries[i] + self.entries[i], self.tok) \
                if job.logprobs is not None else None
            choices.append({"index": i, "text": prompt + text, "logprobs": lp, "finish_reason": reason})
        return {**envelope(job, False), "choices": choices, "usage": self.usage()}

    def role_choice(self, index: int) -> dict[str, Any]:
        """A chat stream's first choice: the assistant's role, as OpenAI sends it."""
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}

    def chunk_choices(self, index: int, text: str, entries: list[TokenLogprob], reason: str | None
                      ) -> list[dict[str, Any]]:
        """The choices of the stream chunks that say what a choice produced since the last: one, or with
        tools none while its text is held (a prefix of the call's tag, a call whose name is not whole) and
        several where a call's first delta and its arguments go out together (a chunk each)."""
        job = self.job
        if not job.chat:
            lp = None
            if job.logprobs is not None and entries:
                lp = completion_logprobs(entries, self.tok, self.offsets[index])
                self.offsets[index] += sum(len(t) for t in lp["tokens"])
            return [{"index": index, "text": text, "logprobs": lp, "finish_reason": reason}]
        reply = self.replies[index]
        if reply is None:
            deltas: list[dict[str, Any]] = [{"content": text} if text or reason is None else {}]
        else:
            deltas, reason = reply.step(text, reason)
            self.held_entries[index] += entries
            if not deltas and reason is None:
                return []  # held: the entries go out with the next chunk
            entries, self.held_entries[index] = self.held_entries[index], []
        lp = {"content": chat_logprobs(entries, self.tok)} if job.logprobs is not None and entries else None
        out = [{"index": index, "delta": delta, "logprobs": lp if k == 0 else None, "finish_reason": None}
               for k, delta in enumerate(deltas or [{}])]
        out[-1]["finish_reason"] = reason
        return out


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def stream_chunks(job: Job, col: Collector, queue: asyncio.Queue[tuple[int, Any]], n: int,
                        cancel: Callable[[], None]) -> AsyncIterator[str]:
    """The server-sent events of a streamed job; `cancel` runs if the client leaves before the end."""
    head = envelope(job, True)
    finished = 0
    try:
        if job.chat:  # the assistant's role comes first, as OpenAI sends it
            yield "".join(_sse({**head, "choices": [col.role_choice(i)]}) for i in range(n))
        elif job.echo and job.logprobs is None:
            yield "".join(_sse({**head, "choices": col.chunk_choices(i, job.prompt_texts[i // job.n], [], None)})
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
            out = [_sse({**head, "choices": [choice]}) for i, (t, e, r) in order.items() if t or e or r[0]
                   for choice in col.chunk_choices(i, "".join(t), e, r[0])]
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
