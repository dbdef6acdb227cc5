"""The soak's request mix (`benchmarks.harness.soak`): kinds of request, each with the statuses it may get, and
one request sent and checked. No torch; aiohttp.

A good request expects 200 and a well-formed answer (a stream ends in one [DONE] with every choice
finished and no error event; a plain answer carries its n choices, usage, and logprobs when asked). A
malformed body, a wrong type or an over-long prompt expects 400, the last naming the model's context
length. A client that leaves mid-stream expects the stream's 200 head; one that leaves a plain request,
or cuts its body short, expects no status at all (`LEFT`). Anything else is unexpected.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gptport.load.loadgen import WORDS

LEFT = 0  # the client left on purpose before any status came
FAILED = -1  # no status: the connection failed or timed out (never expected)
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"

Body = dict[str, Any] | bytes | None  # None: a GET


@dataclass(frozen=True)
class Server:
    """What the mix needs to know of the server under test."""

    url: str
    model: str
    n_ctx: int
    slots: int
    words: int  # words per good prompt: about n_ctx / 4 tokens, chat template included


@dataclass(frozen=True)
class Kind:
    """One kind of request: how to build it, what it may get back, and how its client behaves."""

    name: str
    path: str
    weight: float
    expect: frozenset[int]
    body: Callable[[random.Random], Body]
    stream: bool = False
    choices: int = 1  # the choices a 200 carries
    logprobs: bool = False  # a 200 carries logprobs
    leave_after: int = 0  # a stream's client leaves after this many `data:` lines
    leave_s: float = 0.0  # a plain request's client leaves after this many seconds
    cut_body: bool = False  # the client sends half its body (Content-Length says all of it) and leaves
    error_text: str = ""  # an error's message contains this


@dataclass
class Outcome:
    """What one request of a kind got: its status (LEFT, FAILED or HTTP) and what was wrong, if anything."""

    kind: str
    status: int
    problem: str | None = None


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, max(1, words))))


def default_mix(s: Server) -> list[Kind]:
    """Every kind the soak sends, weighted; n > 1 asks for min(3, slots) choices."""
    ok, bad = frozenset({200}), frozenset({400})
    n, top = min(3, s.slots), max(1, min(32, s.n_ctx // 4))
    long = {"max_tokens": s.n_ctx, "ignore_eos": True, "temperature": 0.8}
    over = " ".join(["the"] * (2 * s.n_ctx + 8))  # each word is at least one token

    def plain(rng: random.Random, **extra: Any) -> dict[str, Any]:
        return {"model": s.model, "prompt": _text(rng, s.words), "max_tokens": rng.randint(1, top),
                "temperature": rng.choice([0.0, 0.8, 1.0]), **extra}

    def chat(rng: random.Random, **extra: Any) -> dict[str, Any]:
        messages = [{"role": "user", "content": _text(rng, s.words)}]
        if rng.random() < 0.3:
            messages.insert(0, {"role": "system", "content": rng.choice(WORDS)})
        return {"model": s.model, "messages": messages, "max_tokens": rng.randint(1, top),
                "temperature": rng.choice([0.0, 0.8]), **extra}

    def stop(rng: random.Random) -> list[str]:
        return rng.sample([" the", "e", ".", "\n", " a"], rng.randint(1, 3))

    usage = {"stream_options": {"include_usage": True}}
    malformed = [b"{bad", b"null", b"\xff\xfe", b'{"prompt": "the", "max_to', b"[1, 2", b'"just a string"']
    wrong: list[dict[str, Any]] = [{"prompt": 5}, {"prompt": "the", "max_tokens": "ten"},
                                   {"prompt": "the", "stream": 1}, {"prompt": "the", "temperature": "hot"},
                                   {"prompt": "the", "stop": 7}, {"prompt": "the", "n": "two"},
                                   {"prompt": "the", "logprobs": "yes"}]
    return [
        Kind("completion", COMPLETIONS, 14, ok, lambda r: plain(r)),
        Kind("completion_stream", COMPLETIONS, 14, ok, lambda r: plain(r, stream=True, **usage), stream=True),
        Kind("chat", CHAT, 10, ok, lambda r: chat(r)),
        Kind("chat_stream", CHAT, 10, ok, lambda r: chat(r, stream=True), stream=True),
        Kind("completion_n", COMPLETIONS, 5, ok, lambda r: plain(r, n=n, temperature=1.0), choices=n),
        Kind("chat_n_stream", CHAT, 4, ok, lambda r: chat(r, n=n, stream=True, temperature=1.0), stream=True,
             choices=n),
        Kind("completion_stop", COMPLETIONS, 5, ok, lambda r: plain(r, stop=stop(r))),
        Kind("chat_stop_stream", CHAT, 4, ok, lambda r: chat(r, stop=stop(r), stream=True), stream=True),
        Kind("completion_logprobs", COMPLETIONS, 5, ok, lambda r: plain(r, logprobs=r.randint(0, 5)),
             logprobs=True),
        Kind("chat_logprobs_stream", CHAT, 4, ok,
             lambda r: chat(r, logprobs=True, top_logprobs=r.randint(0, 5), stream=True), stream=True),
        Kind("leave_stream", COMPLETIONS, 5, ok, lambda r: plain(r, stream=True, **long), stream=True, leave_after=2),
        Kind("leave_chat_stream", CHAT, 2, ok, lambda r: chat(r, stream=True, **long), stream=True, leave_after=3),
        Kind("leave_plain", COMPLETIONS, 2, frozenset({LEFT, 200}), lambda r: plain(r, **long), leave_s=0.05),
        Kind("cut_body", COMPLETIONS, 2, frozenset({LEFT}), lambda r: json.dumps(plain(r)).encode(), cut_body=True),
        Kind("bad_json", COMPLETIONS, 3, bad, lambda r: r.choice(malformed)),
        Kind("wrong_type", COMPLETIONS, 3, bad, lambda r: {"model": s.model, **r.choice(wrong)}),
        Kind("chat_wrong_type", CHAT, 2, bad,
             lambda r: r.choice([{"messages": "hi"}, {"messages": [{"role": 3}]}, {"messages": [], "n": 1.5}])),
        Kind("too_long", COMPLETIONS, 3, bad, lambda r: {"model": s.model, "prompt": over, "max_tokens": 4,
                                                         "stream": r.random() < 0.5},
             error_text=f"context of {s.n_ctx} tokens"),
        Kind("chat_too_long", CHAT, 2, bad, lambda r: {"model": s.model, "max_tokens": 4,
                                                       "messages": [{"role": "user", "content": over}]},
             error_text=f"context of {s.n_ctx} tokens"),
        Kind("models", "/v1/models", 1, ok, lambda r: None),
    ]


async def send(session: Any, url: str, kind: Kind, body: Body, timeout_s: float) -> Outcome:
    """Send one request of `kind` and check what came back."""
    import aiohttp

    try:
        if kind.cut_body:
            return await asyncio.wait_for(_cut(url + kind.path, body), timeout_s)
        call = _exchange(session, url + kind.path, kind, body)
        if kind.leave_s:
            try:
                return await asyncio.wait_for(call, kind.leave_s)
            except (TimeoutError, asyncio.TimeoutError):
                return Outcome(kind.name, LEFT)
        return await asyncio.wait_for(call, timeout_s)
    except (TimeoutError, asyncio.TimeoutError):
        return Outcome(kind.name, FAILED, f"no answer within {timeout_s:g} s")
    except (aiohttp.ClientError, OSError) as e:
        return Outcome(kind.name, FAILED, f"{type(e).__name__}: {e}")


async def _exchange(session: Any, url: str, kind: Kind, body: Body) -> Outcome:
    method = "GET" if body is None else "POST"
    data = body if isinstance(body, bytes) else (None if body is None else json.dumps(body).encode())
    async with session.request(method, url, data=data, headers={"Content-Type": "application/json"}) as r:
        if r.status != 200 or not kind.stream:
            raw = await r.read()
            return Outcome(kind.name, r.status, _check_plain(kind, r.status, raw))
        if kind.leave_after:
            seen = 0
            async for line in r.content:
                seen += line.startswith(b"data:")
                if seen >= kind.leave_after:
                    break
            r.close()  # drop the connection mid-stream
            return Outcome(kind.name, r.status, None if seen >= kind.leave_after else f"only {seen} events")
        lines = [line async for line in r.content]
        return Outcome(kind.name, r.status, _check_stream(kind, lines))


async def _cut(url: str, body: Body) -> Outcome:
    """Send the head and half the body over a plain socket, then close it."""
    assert isinstance(body, bytes)
    parts = urlsplit(url)
    _, writer = await asyncio.open_connection(parts.hostname, parts.port)
    head = (f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    writer.write(head.encode() + body[: len(body) // 2])
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    return Outcome("cut_body", LEFT)


def _check_plain(kind: Kind, status: int, raw: bytes) -> str | None:
    """What is wrong with a whole answer, or None."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return f"not JSON: {raw[:120]!r}"
    if not isinstance(obj, dict):
        return f"not an object: {raw[:120]!r}"
    if status != 200:
        err = obj.get("error")
        message = err.get("message") if isinstance(err, dict) else None
        if not isinstance(message, str) or not message:
            return f"no error message: {raw[:200]!r}"
        return None if kind.error_text in message else f"the message does not say {kind.error_text!r}: {message}"
    if kind.path == "/v1/models":
        return None if isinstance(obj.get("data"), list) else "no model list"
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != kind.choices:
        return f"expected {kind.choices} choices: {raw[:200]!r}"
    usage = obj.get("usage")
    if not isinstance(usage, dict) or not isinstance(usage.get("completion_tokens"), int):
        return "no usage"
    for c in choices:
        text = c.get("message", {}).get("content") if kind.path == CHAT else c.get("text")
        if not isinstance(text, str) or c.get("finish_reason") not in ("stop", "length"):
            return f"a malformed choice: {json.dumps(c)[:200]}"
        if kind.logprobs and c.get("logprobs") is None:
            return "no logprobs"
    return None


def _check_stream(kind: Kind, lines: list[bytes]) -> str | None:
    """What is wrong with a whole stream, or None."""
    events = [line[5:].strip() for line in lines if line.startswith(b"data:")]
    if not events or events[-1] != b"[DONE]" or events.count(b"[DONE]") != 1:
        return f"the stream does not end in one [DONE]: {events[-2:]!r}"
    finished: set[int] = set()
    for payload in events[:-1]:
        try:
            obj = json.loads(payload)
        except ValueError:
            return f"a malformed event: {payload[:120]!r}"
        if not isinstance(obj, dict) or "error" in obj:
            return f"an error event: {payload[:200]!r}"
        for c in obj.get("choices") or []:
            if c.get("finish_reason") is not None:
                finished.add(c.get("index"))
    if finished != set(range(kind.choices)):
        return f"finished choices {sorted(finished)}, expected {kind.choices}"
    return None
