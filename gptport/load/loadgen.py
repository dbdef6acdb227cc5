"""A load generator for any OpenAI-compatible completions server (`gptport bench-serve`).

Each request streams `POST URL/v1/completions` with `stream: true`,
`stream_options: {"include_usage": true}`, `max_tokens`, `temperature` and `ignore_eos: true` (an
extra field that llama.cpp's server and vLLM honour, so that every request generates `max_tokens`;
servers that do not know it ignore it). For each concurrency level the same prompts are sent by at
most that many requests in flight: a closed loop when the request rate is infinite, Poisson arrivals
(seeded exponential gaps) capped by the concurrency otherwise, as in vLLM's benchmark_serving.

Prompts: the client does not know the server's tokenizer, so a prompt is words drawn (seeded) from a
fixed list of common English words. Before the load, one request of `prompt_len` words with
`max_tokens` 1 asks the server how many tokens that is (its `usage.prompt_tokens`), and the word
count is scaled so that prompts come to about `prompt_len` tokens in the server's tokenizer. The
tokens the server actually saw are reported as `mean_prompt_tokens`.

With a JSON schema (`--json-schema`), each request sends it as the top-level `json_schema` field
(gptport's and llama-server's name for a constrained completion) instead of `ignore_eos`: a request
ends where its JSON is complete, or at `max_tokens`.

Metrics use vLLM's names. TTFT: send to the first streamed chunk that carries text. ITL: the gaps
between consecutive text chunks. TPOT: (E2EL - TTFT) / (output tokens - 1), for requests with more
than one output token. E2EL: send to the end of the stream. Token counts come from the server's
`usage` chunk; a request whose stream has none counts its text chunks as output tokens and the
requested prompt length as prompt tokens (`requests_without_usage` says how many did). Chunks that
carry several tokens make ITL larger than TPOT. Metrics are pure functions of `RequestRecord`s.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gptport.errors import InputError, UsageError
from gptport.load.loadstats import RequestRecord, level_metrics
from gptport.machine import describe

WORDS = """the of and to in is was for on that with as by at from his her they this have had not are but
be one all which their were when more time about out there so up who would been she will if them can
no into has only some two other then its over than like did could may first these after new any most
made also people year way day man world life hand part child eye woman place work week case point
city home water room mother area money story fact month lot right study book word night number
people group game line end member law car house side power hour head friend body name family school
state country problem question light river field music art market system program table door boat
open long great little old big high small large next early young good same able last late hard
real best free sure clear whole full warm cold green blue red black white happy quick slow short
write read run walk talk think know see look find give tell ask work call try need feel leave keep
begin seem help show hear play move live bring hold stand learn change lead watch follow stop speak
""".split()

DEFAULT_TIMEOUT_S = 300.0


@dataclass
class Settings:
    """One bench-serve run."""

    url: str
    model: str | None = None
    concurrency: tuple[int, ...] = (1, 4, 16)
    request_rate: float = math.inf
    num_prompts: int = 64
    prompt_len: int = 64
    max_tokens: int = 128
    temperature: float = 0.8
    api_key: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    seed: int = 0
    json_schema: dict[str, Any] | None = None  # constrain every request's output to it
    shared_prefix: int = 0  # tokens of one text every prompt starts with (a system prompt); 0: none

    def as_json(self) -> dict[str, Any]:
        return {"concurrency": list(self.concurrency),
                "request_rate": "inf" if math.isinf(self.request_rate) else self.request_rate,
                "num_prompts": self.num_prompts, "prompt_len": self.prompt_len, "max_tokens": self.max_tokens,
                "temperature": self.temperature, "timeout_s": self.timeout_s, "seed": self.seed,
                "ignore_eos": self.json_schema is None, "json_schema": self.json_schema,
                "shared_prefix": self.shared_prefix}


# ---- parsing options --------------------------------------------------------------------------------


def parse_concurrency(text: str) -> tuple[int, ...]:
    """'1,4,16' -> (1, 4, 16); anything else is a UsageError naming --concurrency."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--concurrency {text!r}: expected comma-separated positive integers") from None
    if not values or min(values) < 1:
        raise UsageError(f"--concurrency {text!r}: expected comma-separated positive integers")
    return values


def parse_rate(text: str) -> float:
    """'inf' or a positive number of requests per second."""
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if math.isnan(rate) or rate <= 0:
        raise UsageError(f"--request-rate {text!r}: expected 'inf' or a positive number of requests per second")
    return rate


def check(settings: Settings) -> None:
    """Refuse values out of range, naming the option."""
    for option, value, low in (("--num-prompts", settings.num_prompts, 1), ("--prompt-len", settings.prompt_len, 1),
                               ("--max-tokens", settings.max_tokens, 1),
                               ("--shared-prefix", settings.shared_prefix, 0)):
        if value < low:
            raise UsageError(f"{option} {value}: must be >= {low}")
    if not settings.timeout_s > 0:
        raise UsageError(f"--timeout {settings.timeout_s}: must be > 0 seconds")
    if not settings.temperature >= 0:
        raise UsageError(f"--temperature {settings.temperature}: must be >= 0")


def read_schema(path: Any) -> dict[str, Any]:
    """A JSON schema file for --json-schema: an object, or a one-line error naming the file."""
    try:
        schema = json.loads(open(path, encoding="utf-8").read())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"--json-schema {path}: {e}") from e
    if not isinstance(schema, dict):
        raise UsageError(f"--json-schema {path}: a JSON schema is an object, not {type(schema).__name__}")
    return schema


def base_url(url: str) -> str:
    """'host:8000/v1/' -> 'http://host:8000': the server's root, to which /v1/... is appended."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"URL {url!r}: expected http:// or https://")
    return url.removesuffix("/v1")


def make_prompts(n: int, words: int, seed: int) -> list[str]:
    """`n` prompts of `words` words each, drawn from WORDS with a seeded generator."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(n)]


def arrival_gaps(n: int, rate: float, seed: int) -> list[float]:
    """Seconds to wait before each of `n` requests: 0 at an infinite rate, else exponential (Poisson)."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    return [rng.expovariate(rate) for _ in range(n)]


# ---- metrics: pure functions of the records ---------------------------------------------------------


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _error_text(body: bytes | str, limit: int = 300) -> str:
    """An error response's message: the JSON error's `message` where there is one, else the text."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        obj = json.loads(text)
        e = obj.get("error", obj) if isinstance(obj, dict) else obj
        text = str(e.get("message") or e) if isinstance(e, dict) else str(e)
    except ValueError:
        pass
    text = " ".join(text.split())
    return text[:limit] + ("…" if len(text) > limit else "")


async def _get_json(method: str, url: str, settings: Settings, body: dict[str, Any] | None = None
                    ) -> tuple[int, bytes]:
    """One plain request: (status, body bytes)."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=min(settings.timeout_s, 30.0))
    async with aiohttp.ClientSession(timeout=timeout, headers=_headers(settings.api_key)) as session, \
            session.request(method, url, json=body) as r:
        return r.status, await r.read()


def resolve_model(settings: Settings) -> str:
    """Check that the server answers (GET /v1/models) and return --model or the first model id it lists."""
    import aiohttp

    url = f"{base_url(settings.url)}/v1/models"
    try:
        status, raw = asyncio.run(_get_json("GET", url, settings))
    except aiohttp.InvalidURL as e:
        raise UsageError(f"URL {settings.url!r}: invalid ({e})") from None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise InputError(f"{settings.url}: the server does not answer ({type(e).__name__}: {e})") from None
    if settings.model:
        return settings.model
    if status != 200:
        raise InputError(f"GET {url}: HTTP {status} {_error_text(raw, 120)!r}; name the model with --model")
    try:
        return str(json.loads(raw)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise InputError(f"GET {url}: no model id in the answer; name the model with --model") from None


def prompt_tokens(settings: Settings, model: str, prompt: str) -> tuple[int, int | None, str]:
    """What the server makes of one prompt (max_tokens 1): (status, its usage.prompt_tokens or None, the
    error's message)."""
    import aiohttp

    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
    try:
        status, raw = asyncio.run(_get_json("POST", f"{base_url(settings.url)}/v1/completions", settings, body))
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return 0, None, ""
    try:
        tokens = json.loads(raw)["usage"]["prompt_tokens"]
    except (ValueError, KeyError, TypeError):
        return status, None, _error_text(raw, 200)
    return status, tokens if isinstance(tokens, int) and tokens > 0 else None, ""


def calibrate_words(settings: Settings, model: str, length: int = 0, seed: int | None = None) -> int:
    """Words per prompt for about `length` (default prompt_len) tokens in the server's tokenizer (from one
    request's usage); `length` itself when the server reports no usage."""
    length = length or settings.prompt_len
    probe = make_prompts(1, length, settings.seed + 1 if seed is None else seed)[0]
    tokens = prompt_tokens(settings, model, probe)[1]
    return length if tokens is None else max(1, round(length * length / tokens))


def shared_prefix(settings: Settings, model: str, own_words: int) -> tuple[str, int | None]:
    """--shared-prefix: one text of about that many tokens (its own seeded stream, so that it is no
    prompt's beginning by chance), and its token count as the server reports it; a prompt of the prefix
    and an own part that the server refuses is a UsageError naming both options."""
    seed = settings.seed * 7919 + 104729
    prefix = make_prompts(1, calibrate_words(settings, model, settings.shared_prefix, seed), seed)[0] + "\n\n"
    status, _, message = prompt_tokens(settings, model, prefix + make_prompts(1, own_words, seed + 1)[0])
    if status not in (0, 200):
        raise UsageError(f"--shared-prefix {settings.shared_prefix} with --prompt-len {settings.prompt_len}: the "
                         f"server refuses such a prompt (HTTP {status}: {message})")
    return prefix, prompt_tokens(settings, model, prefix)[1]


async def _send(session: Any, url: str, body: dict[str, Any], rec: RequestRecord) -> None:
    """Stream one request into `rec`; a failure becomes rec.error."""
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            rec.error = f"HTTP {resp.status}: {_error_text(await resp.read())}"
            return
        perf = time.perf_counter
        times = rec.text_times
        loads = json.loads
        async for raw in resp.content:  # one line at a time
            if not raw.startswith(b"data:"):
                continue
            now = perf()
            payload = raw[5:].strip()
            if payload == b"[DONE]":
                break
            try:
                obj = loads(payload)
            except ValueError:
                rec.error = f"malformed stream chunk: {payload[:120]!r}"
                return
            if not isinstance(obj, dict) or obj.get("error"):
                rec.error = f"error in stream: {_error_text(payload)}"
                return
            choices = obj.get("choices")
            if choices and isinstance(choices[0], dict) and choices[0].get("text"):
                times.append(now)
            usage = obj.get("usage")
            if usage and isinstance(usage, dict):
                rec.prompt_tokens = usage.get("prompt_tokens")
                rec.completion_tokens = usage.get("completion_tokens")
                details = usage.get("prompt_tokens_details")
                if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                    rec.cached_tokens = details["cached_tokens"]


async def _request(session: Any, url: str, body: dict[str, Any], timeout_s: float) -> RequestRecord:
    import aiohttp

    rec = RequestRecord(start=time.perf_counter())
    try:
        await asyncio.wait_for(_send(session, url, body, rec), timeout_s)
    except (TimeoutError, asyncio.TimeoutError):
        rec.error = f"timed out after {timeout_s:g} s"
    except (aiohttp.ClientError, OSError) as e:
        rec.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    rec.end = time.perf_counter()
    return rec


async def _level(settings: Settings, model: str, prompts: list[str], concurrency: int,
                 progress: Callable[[int], None]) -> tuple[list[RequestRecord], float]:
    """All prompts at one concurrency level; returns the records (in prompt order) and the wall time.
    aiohttp (C-accelerated parsing) rather than httpx: the client shares the machine with the server
    under test, and its CPU per streamed chunk is CPU the server does not get."""
    import aiohttp

    url = f"{base_url(settings.url)}/v1/completions"
    sem = asyncio.Semaphore(concurrency)
    done = 0

    async def one(prompt: str) -> RequestRecord:
        nonlocal done
        body = {"model": model, "prompt": prompt, "max_tokens": settings.max_tokens,
                "temperature": settings.temperature, "stream": True,
                "stream_options": {"include_usage": True},
                **({"ignore_eos": True} if settings.json_schema is None else {"json_schema": settings.json_schema})}
        async with sem:
            rec = await _request(session, url, body, settings.timeout_s)
        done += 1
        progress(done)
        return rec

    # A new connection per request (as vLLM's benchmark does): servers close idle keep-alive connections
    # on their own schedule (llama-server does), and a request sent on one that just closed fails.
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=True)
    async with aiohttp.ClientSession(connector=connector, headers=_headers(settings.api_key),
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        start = time.perf_counter()
        tasks = []
        for prompt, gap in zip(prompts, arrival_gaps(len(prompts), settings.request_rate, settings.seed),
                               strict=True):
            if gap:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(one(prompt)))
        records = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    return list(records), duration


def run(settings: Settings, say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Run every concurrency level; returns {url, model, settings, machine, results}."""
    check(settings)
    model = resolve_model(settings)
    words = calibrate_words(settings, model)
    say(f"prompts of {words} words, for about {settings.prompt_len} tokens in the server's tokenizer")
    prefix, prefix_tokens = shared_prefix(settings, model, words) if settings.shared_prefix else ("", None)
    if prefix:
        say(f"every prompt starts with the same {prefix_tokens or '?'} tokens (--shared-prefix)")
    results = []
    for c in settings.concurrency:
        def progress(n: int, c: int = c) -> None:
            say(f"concurrency {c}: {n}/{settings.num_prompts} requests done")

        progress(0)
        # Fresh prompts for every level: a server that caches prompt prefixes (llama-server does) must
        # not be handed the previous level's prompts again.
        prompts = [prefix + p for p in make_prompts(settings.num_prompts, words, settings.seed * 7919 + c)]
        records, duration = asyncio.run(_level(settings, model, prompts, c, progress))
        results.append({"concurrency": c, "num_prompts": settings.num_prompts,
                        **level_metrics(records, duration, settings.prompt_len)})
    return {"url": base_url(settings.url), "model": model,
            "settings": {**settings.as_json(), "prompt_words": words, "shared_prefix_tokens": prefix_tokens},
            "machine": describe(), "results": results}
