"""OpenAI's request and response shapes: a request body checked field by field into a `Job` (each field
read by its definition in fields.py), and the JSON objects the routes send back. Every refusal is an
`ApiError` in OpenAI's error shape, naming the field at fault. No torch here.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gptport.runtime.constraint import Spec
from gptport.runtime.sampling import Sampling
from gptport.serve.api import fields as request_fields
from gptport.serve.api.api_error import ApiError, bad
from gptport.serve.api.field_spec import Reader
from gptport.serve.api.fields import MIN_TEMPERATURE
from gptport.serve.api.shapes import MAX_STOP_BYTES, MAX_STOPS
from gptport.serve.api.structured import output_spec
from gptport.serve.api.tools import Tools, call_text, parse_tools, reply_spec
from gptport.serve.engine.events import TokenLogprob
from gptport.tokenizer import BPETokenizer


@dataclass(frozen=True)
class Job:
    """A checked request: its prompts as token ids and how to continue each, `n` times; built whole by its
    parser (a change is a `dataclasses.replace`), then only read."""

    chat: bool
    prompts: list[list[int]]
    prompt_texts: list[str]
    max_tokens: int
    sampling: Sampling
    n: int = 1
    stops: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None
    echo: bool = False
    ignore_eos: bool = False
    logit_bias: dict[int, float] | None = None
    spec: Spec | None = None  # the output's constraint (a grammar the reply must match)
    tools: Tools | None = None
    model: str = ""
    id: str = ""
    created: int = 0


def parse_body(data: bytes | bytearray) -> Any:
    """A request body's JSON; 400 invalid_json for what json.loads refuses (syntax, encoding), for nesting
    past Python's recursion limit, for an integer literal past int's 4300 digits, and for a string holding
    a lone surrogate (an escaped \\ud800, or its bytes): it is not text, and a tokenizer or the response
    encoder would fail on it later."""
    try:
        body = json.loads(data)
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except RecursionError as e:
        raise ApiError(400, "the request body is not valid JSON (nested too deeply)", None, "invalid_json") from e
    except UnicodeEncodeError as e:
        raise ApiError(400, "the request body is not valid JSON (a string holds a lone surrogate, "
                       f"{e.object[e.start:e.end]!r})", None, "invalid_json") from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, and ints past sys.get_int_max_str_digits()
        raise ApiError(400, f"the request body is not valid JSON ({e})", None, "invalid_json") from e
    return body


def _sampling(f: Reader, vocab: int) -> tuple[Sampling, int]:
    temperature, top_p = f.typed("temperature"), f.typed("top_p")  # both typed before either is bounded
    temperature, top_p = f.bounded("temperature", temperature), f.bounded("top_p", top_p)
    if temperature < MIN_TEMPERATURE:
        temperature = 0.0
    top_k = f.read("top_k")
    penalty = f.read("repetition_penalty")
    presence, frequency, min_p = f.read("presence_penalty"), f.read("frequency_penalty"), f.read("min_p")
    seed = f.read("seed")
    base = secrets.randbits(63) if seed is None else seed % 2**63
    return Sampling(temperature, min(top_k, vocab), top_p, penalty, base, presence, frequency, min_p), f.read("n")


def _stops(f: Reader) -> list[str]:
    stop = f.body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop", "expected a string or a list of strings", "invalid_type")
    if len(stops) > MAX_STOPS:
        raise bad("stop", f"at most {MAX_STOPS} stop sequences, not {len(stops)}", "invalid_value")
    size = sum(len(s.encode("utf-8")) for s in stops)
    if size > MAX_STOP_BYTES:
        raise bad("stop", f"at most {MAX_STOP_BYTES} bytes of stop sequences together, not {size}", "invalid_value")
    return [s for s in stops if s]


def _prompts(value: Any, tok: BPETokenizer, start: Sequence[int] = ()) -> tuple[list[list[int]], list[str]]:
    """A string, a list of strings, a list of token ids, or a list of lists of them; a string's ids
    follow `start` (the model's begin token where its tokenizer adds one), token ids are taken as given."""
    if value is None:
        raise bad("prompt", "is required", "missing")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad("prompt", "expected a string, a list of strings, or token ids", "invalid_type")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        value = [value]
    prompts, texts = [], []
    for i, p in enumerate(value):
        if isinstance(p, str):
            ids = [*start, *tok.encode(p)] or [tok.eot_id]
            prompts.append(ids)
            texts.append(p)
        elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            outside = [t for t in p if not 0 <= t < tok.vocab_size]
            if outside:
                raise bad("prompt", f"token id {outside[0]} is outside the vocabulary (0..{tok.vocab_size - 1})",
                          "invalid_token")
            prompts.append(list(p))
            texts.append(tok.decode(p))
        else:
            raise bad("prompt", f"item {i} is neither a string nor a non-empty list of token ids", "invalid_type")
    return prompts, texts


def _common(f: Reader, tok: BPETokenizer, chat: bool, prompts: list[list[int]], texts: list[str], n_ctx: int,
            slots: int) -> Job:
    sampling, n = _sampling(f, tok.vocab_size)
    for i, ids in enumerate(prompts):
        if len(ids) > n_ctx:
            which = "the messages" if chat else ("the prompt" if len(prompts) == 1 else f"prompt {i}")
            raise ApiError(400, f"{which} is {len(ids)} tokens, longer than the model's context of {n_ctx} tokens",
                           "messages" if chat else "prompt", "context_length_exceeded")
    if n * len(prompts) > slots:
        raise bad("n", f"{len(prompts)} prompt(s) x n={n} = {n * len(prompts)} choices is more than the server's "
                  f"{slots} slots", "too_many_choices")
    stream = f.read("stream")
    include_usage = bool((f.read("stream_options") or {}).get("include_usage")) and stream
    max_name = "max_completion_tokens" if chat and f.body.get("max_completion_tokens") is not None else "max_tokens"
    most, stops, ignore_eos = f.read(max_name), _stops(f), f.read("ignore_eos")
    logit_bias = request_fields.logit_bias(f.body.get("logit_bias"), tok.vocab_size)
    return Job(chat, prompts, texts, most, sampling, n, stops, stream, include_usage, ignore_eos=ignore_eos,
               logit_bias=logit_bias, spec=output_spec(f.body),
               id=("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12), created=int(time.time()))


def _constrained(job: Job) -> Job:
    """A constraint ends where its grammar ends: refuse ignore_eos beside it."""
    if job.spec is not None and job.ignore_eos:
        raise bad("ignore_eos", f"cannot be combined with an output constraint ({job.spec.origin.strip(chr(39))})",
                  "invalid_value")
    return job


def completion_job(body: Any, tok: BPETokenizer, n_ctx: int, slots: int, start: Sequence[int] = ()) -> Job:
    """POST /v1/completions; a text prompt's ids follow `start` (specials.start_ids: the begin token)."""
    f = request_fields.reader(body, "completions")
    request_fields.check_fields(f.body, chat=False)
    prompts, texts = _prompts(f.body.get("prompt"), tok, start)
    job = _common(f, tok, False, prompts, texts, n_ctx, slots)
    job = replace(job, logprobs=f.read("logprobs"), echo=f.read("echo"))
    f.read("suffix")
    return _constrained(job)


def chat_job(body: Any, tok: BPETokenizer, n_ctx: int, slots: int, render: Any) -> Job:
    """POST /v1/chat/completions; `render(messages, tools) -> (prompt text, extra stop strings)`."""
    f = request_fields.reader(body, "chat")
    request_fields.check_fields(f.body, chat=True)
    messages = f.body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "expected a non-empty list of {role, content} objects", "invalid_type")
    tools = parse_tools(f.body)
    plain = [message_dict(i, m) for i, m in enumerate(messages)]
    text, stops = render(plain, tools if tools is not None and tools.active else None)
    ids = tok.encode(text) or [tok.eot_id]
    job = _common(f, tok, True, [ids], [text], n_ctx, slots)
    job = replace(job, stops=[*job.stops, *(s for s in stops if s not in job.stops)])
    top = f.read("top_logprobs")
    if f.read("logprobs"):
        job = replace(job, logprobs=top)
    if tools is not None and tools.active:
        job = replace(job, tools=tools, spec=reply_spec(tools, job.spec))
    return _constrained(job)


def message_dict(i: int, m: Any) -> dict[str, Any]:
    """A message as the chat template receives it: role and text content, and an assistant's
    tool_calls or a tool message's tool_call_id where given."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise bad("messages", f"item {i} needs a string 'role'", "invalid_type")
    content = m.get("content")
    if isinstance(content, list):  # content parts: only text is understood
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise bad("messages", f"item {i}: only text content parts are supported", "invalid_type")
        content = "".join(p["text"] for p in content)
    if content is not None and not isinstance(content, str):
        raise bad("messages", f"item {i}: 'content' must be a string or a list of text parts", "invalid_type")
    out: dict[str, Any] = {"role": m["role"], "content": content or ""}
    calls = m.get("tool_calls")
    if calls is not None:
        if m["role"] != "assistant" or not isinstance(calls, list):
            raise bad("messages", f"item {i}: tool_calls belong to an assistant message, as a list", "invalid_type")
        try:
            out["tool_calls_text"] = "".join(call_text(c) for c in calls)
        except ValueError as e:
            raise bad("messages", f"item {i}: {e}", "invalid_value") from e
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        if m.get(key) is not None and not isinstance(m[key], str):
            raise bad("messages", f"item {i}: '{key}' must be a string", "invalid_type")
        if m.get(key) is not None:
            out[key] = m[key]
    return out


def completion_logprobs(entries: Sequence[TokenLogprob], tok: BPETokenizer, offset: int = 0) -> dict[str, Any]:
    """The completions API's logprobs object over these tokens; text offsets start at `offset`."""
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    at = offset
    for token, lp, top in entries:  # lp None: an echo's first prompt token, which nothing predicts
        text = tok.decode([token])
        out["tokens"].append(text)
        out["token_logprobs"].append(lp)
        out["top_logprobs"].append({tok.decode([t]): v for t, v in top} if top else None)
        out["text_offset"].append(at)
        at += len(text)
    return out


def chat_logprobs(entries: Sequence[TokenLogprob], tok: BPETokenizer) -> list[dict[str, Any]]:
    """The chat API's logprobs.content list."""
    def item(t: int, v: float) -> dict[str, Any]:
        text = tok.decode([t])
        return {"token": text, "logprob": v, "bytes": list(text.encode("utf-8", errors="replace"))}

    return [{**item(t, v or 0.0), "top_logprobs": [item(a, b) for a, b in top]} for t, v, top in entries]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object, with prompt_tokens_details.cached_tokens (prefix caching's reuse)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def envelope(job: Job, chunk: bool) -> dict[str, Any]:
    """The fields every response object of this job starts with."""
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if job.chat else "text_completion"
    return {"id": job.id, "object": kind, "created": job.created, "model": job.model}
