"""The OpenAI-compatible ASGI app (Starlette): routes, API key, body limit, streaming, metrics.

The event loop never calls the model: a route checks the request into a Job, submits its choices to
the scheduler and awaits their events on an asyncio queue, which the scheduler's thread fills once
per iteration (`loop.call_soon_threadsafe`). A stream sends whatever has arrived since its last
chunk in one chunk per choice, so a stream that falls behind catches up in fewer, larger chunks.
No torch here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gptport.errors import GptportError
from gptport.page_style import styled
from gptport.serve import body_check, companions, cors, guard, openapi, protocol, startup
from gptport.serve.access_log import AccessLog
from gptport.serve.engine.scheduler import Choice, Finish, Scheduler
from gptport.serve.metrics import Metrics
from gptport.serve.protocol import ApiError, Job
from gptport.serve.responses import Collector, stream_chunks

log = logging.getLogger("gptport.serve")
PUBLIC = {"/health", "/", "/openapi.json"}  # no API key: the page's own calls carry the key the user types


@dataclass
class Settings:
    """What `gptport serve` was asked for."""

    model_dir: Path
    precision: str = "fp32"
    provider: str = "cpu"
    kv_cache: str = "auto"
    slots: int = 16
    max_queue: int = 64
    threads: int = 0
    api_key: str | None = None
    model_name: str = ""  # the primary name (serve/names.py)
    prefill_chunk: int = 512
    max_body: int = 1 << 20
    body_timeout: float = 30.0  # seconds a request's body may take to arrive (then 408): a slow sender holds no task
    draft: Path | None = None  # speculative decoding of a lone row: the draft model's directory
    draft_tokens: int | None = None  # drafts per step (None: adaptive)
    draft_precision: str | None = None  # the draft's exported variant (None: the model's precision)
    draft_threads: int | None = None  # the draft session's threads (None: speculative.DRAFT_THREADS)
    prompt_lookup: int | None = None  # speculative decoding by prompt lookup: the n-gram length
    prefix_cache: bool = True  # freed slots keep their cache for prompts that start the same way
    multi_row_append: bool = True  # prompt chunks of several rows appended in one step (model.append.onnx)
    kv_dtype: str = "float32"  # int8: the static graph with an int8 KV cache (export --kv-dtype int8)
    spin: str = "step"  # onnxruntime's workers spin during a step and sleep between: the HTTP side needs the cores
    aliases: tuple[str, ...] = ()  # other names the server answers to, each listed by /v1/models
    url: str = ""
    replica: str = ""  # this server's name in x-gptport-replica and /metrics (default: hostname:pid)
    allowed_origins: tuple[str, ...] = ()  # pages on these origins may call the API (CORS; "*": any); serve/cors.py
    access_log: bool = False  # one line per request, when its response ends (serve/access_log.py)
    n_ctx: int | None = None  # positions per slot (None: the model's n_ctx)
    on_ready: Callable[[str], None] = field(default=lambda line: None)
    on_failure: Callable[[str], None] = field(default=lambda message: None)


class State:
    """The loaded model and its scheduler, once the loading thread is done."""

    def __init__(self, settings: Settings) -> None:
        self.settings, self.metrics = settings, Metrics()
        self.scheduler: Scheduler | None = None
        self.tok: Any = None
        self.n_ctx = 0
        self.render: Any = None
        self.start: list[int] = []  # what a text prompt starts with: the model's begin token where it adds one
        self.grammars: Any = None  # runtime.constraint.Grammars: compiles the requests' constraints
        self.error: str | None = None
        self.created = int(time.time())

    def load(self, loop: asyncio.AbstractEventLoop) -> None:
        """Open the model and start the scheduler (in a thread: /health answers 503 meanwhile)."""
        from gptport.runtime.choice import GraphChoice, RunOptions
        from gptport.runtime.constraint import Grammars, Masks
        from gptport.runtime.loader import open_model
        from gptport.runtime.slots import open_slots
        from gptport.serve.chat import renderer
        from gptport.specials import end_ids, start_ids

        s = self.settings
        try:
            opened = open_model(s.model_dir, GraphChoice.parse(s.precision, s.kv_cache, s.kv_dtype),
                                RunOptions.parse(s.provider, s.threads, s.spin))
            appender = companions.appender(s, opened.engine)
            slots = open_slots(opened.engine, s.slots, appender.session if appender is not None else None, s.n_ctx)
            self.render, template = renderer(s.model_dir)
            vocab = opened.engine.config.vocab_size
            self.grammars = Grammars(opened.tok.json, vocab, opened.tok.eot_id)
            drafting, drafts_from = companions.drafting(s, opened)
            scheduler = Scheduler(slots, opened.tok, lambda events: loop.call_soon_threadsafe(_dispatch, events),
                                  s.max_queue, s.prefill_chunk, self.metrics, Masks(vocab), drafting,
                                  s.prefix_cache, end_ids(opened.engine.config, opened.tok))
        except Exception as e:  # noqa: BLE001 - whatever stops the load stops the server, with its message
            self.error = str(e) if isinstance(e, GptportError) else f"loading the model failed: {type(e).__name__}: {e}"
            log.debug("load failed", exc_info=True)
            s.on_failure(self.error)
            return
        self.tok, self.n_ctx = opened.tok, slots.n_ctx
        self.start = start_ids(opened.engine.config)
        self.metrics.slots.set(s.slots)
        self.metrics.capacity.set(s.slots * self.n_ctx)
        engine: Any = opened.engine  # an OnnxModel: serve opens onnx engines only
        kv_type = "int8" if engine.kv_dtype.itemsize == 1 else str(engine.kv_dtype)
        graph = f"{opened.precision} {opened.cache} cache" + (" (int8)" if kv_type == "int8" else "")
        threads = engine.session.get_session_options().intra_op_num_threads
        self.metrics.info.labels(s.model_name, graph, opened.provider, str(threads or "auto")).set(1)
        scheduler.start()
        per_slot = 2 * engine.config.n_layer * engine.config.kv_width * self.n_ctx * engine.kv_dtype.itemsize
        kv = per_slot * s.slots
        self.metrics.kv_bytes.labels(kv_type).set(per_slot)
        s.on_ready(f"{s.url} · model {s.model_name!r} · {graph} on {opened.provider} · {s.slots} slots × "
                   f"n_ctx {self.n_ctx} (KV cache {kv / 2**20:,.0f} MiB{startup.residency(slots)}) · "
                   f"queue {s.max_queue} · "
                   f"prefix cache {startup.prefix_cache(s, scheduler)} · "
                   f"{'multi-row append' if slots.supports_append_many else 'one-row appends'} · "
                   f"chat template: {template}{drafts_from}"
                   f"{startup.int8_hint(s, opened)}")
        self.scheduler = scheduler  # published last: /health answers 200 only once the startup line is out

    def ready(self) -> Scheduler:
        if self.scheduler is None:
            raise ApiError(503, self.error or "the model is still loading", None, "not_ready")
        return self.scheduler


def _dispatch(events: list[tuple[Any, Any]]) -> None:
    """On the event loop: each (queue, index) handle gets its (index, event)."""
    for (queue, index), event in events:
        queue.put_nowait((index, event))


async def _body(request: Request, limit: int) -> Any:
    """The request's JSON, refused past `limit` bytes (413), when it has not all arrived within the
    settings' body_timeout seconds (408, and the connection closes), or when it does not parse (400)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, f"the request body is {length} bytes; the limit is {limit}", None, "body_too_large")
    data = bytearray()

    async def read() -> None:
        async for part in request.stream():
            data.extend(part)
            if len(data) > limit:
                raise ApiError(413, f"the request body is over the limit of {limit} bytes", None, "body_too_large")

    timeout = request.app.state.gptport.settings.body_timeout
    try:
        await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError as e:  # a slow (or stalled) sender: uvicorn has no bound of its own on a body
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s", None, "body_timeout") from e
    except ClientDisconnect as e:  # the client left mid-body: nobody reads the answer, and it is no server error
        raise ApiError(499, "the client closed the connection before the whole body arrived", None,
                       "client_closed") from e
    return protocol.parse_body(data)


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body has been read, so only a disconnect is left)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(settings: Settings) -> Starlette:
    """The app; it starts loading the model when the server starts."""
    state = State(settings)
    checks = body_check.for_server(settings.model_name, settings.slots, settings.max_body)

    names = (settings.model_name, *settings.aliases)

    def check_model(body: Any) -> str:
        """The name the request gave (a 404 for one the server does not answer to), or the primary name.
        Responses echo it, as vLLM's do."""
        name = body.get("model") if isinstance(body, dict) else None
        if name is None:
            return settings.model_name
        if name not in names:
            also = f" (also {', '.join(map(repr, settings.aliases))})" if settings.aliases else ""
            raise ApiError(404, f"The model '{name}' does not exist; this server runs '{settings.model_name}'{also}",
                           "model", "model_not_found")
        return str(name)

    def queue_full() -> ApiError:
        return ApiError(429, f"the queue is full ({settings.max_queue} choices wait for a slot); retry shortly",
                        None, "queue_full")

    def admit() -> None:
        """429 at once when not even one more choice fits, before the body is read, parsed and tokenized:
        under a flood, refusals must cost the event loop little."""
        if state.scheduler is not None and state.scheduler.full:
            raise queue_full()

    async def run(request: Request, job: Job, reply: Any = None) -> Response:
        """The job's choices scheduled and answered: a chat or completions response, or `reply`'s translation
        of the chat one (responses_output.Reply: POST /v1/responses)."""
        scheduler = state.ready()
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        count = len(job.prompts) * job.n
        matchers = await asyncio.to_thread(_matchers, state.grammars, job, count) if job.spec else [None] * count
        choices = [Choice(ids, job.max_tokens, _seeded(job, j), job.stops, job.logprobs,
                          job.echo and job.logprobs is not None, job.ignore_eos, matchers[i * job.n + j],
                          job.logit_bias, out=(queue, i * job.n + j))
                   for i, ids in enumerate(job.prompts) for j in range(job.n)]
        if not scheduler.submit(choices):
            raise queue_full()

        def cancel() -> None:
            for c in choices:
                c.cancelled = True
            scheduler.wake()

        collector = Collector(job, state.tok)
        if job.stream:
            chunks = stream_chunks(job, collector, queue, len(choices), cancel)
            return StreamingResponse(chunks if reply is None else reply.stream(chunks),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        waiter = asyncio.ensure_future(_collect(collector, queue, len(choices)))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({waiter, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not waiter.done():  # the client left (or the server stops): free the slots
                waiter.cancel()
                cancel()
        if waiter.cancelled():
            return Response(status_code=499)  # nobody reads it: the client closed the connection
        return JSONResponse(collector.response() if reply is None else reply.response(collector.response()))

    async def completions(request: Request) -> Response:
        admit()
        body = await _body(request, settings.max_body)
        name = check_model(body)
        state.ready()
        found = checks.before("completions", body)
        job = protocol.completion_job(body, state.tok, state.n_ctx, settings.slots, state.start)
        checks.leftover("completions", body, found)
        job.model = name
        return await run(request, job)

    async def chat(request: Request) -> Response:
        admit()
        body = await _body(request, settings.max_body)
        name = check_model(body)
        state.ready()
        found = checks.before("chat", body)
        job = protocol.chat_job(body, state.tok, state.n_ctx, settings.slots, state.render)  # template: chat.py
        checks.leftover("chat", body, found)
        job.model = name
        return await run(request, job)

    async def responses(request: Request) -> Response:
        from gptport.serve.responses_input import responses_job
        from gptport.serve.responses_output import Reply

        admit()
        body = await _body(request, settings.max_body)
        name = check_model(body)
        state.ready()
        found = checks.before("responses", body)
        job, echo = responses_job(body, state.tok, state.n_ctx, settings.slots, state.render)  # onto the chat path
        checks.leftover("responses", body, found)
        job.model = name
        return await run(request, job, Reply(job, echo))

    async def tokenize(request: Request) -> Response:
        from gptport.serve.tokenize import tokenize as run_tokenize

        body = await _body(request, settings.max_body)
        check_model(body)
        state.ready()
        found = checks.before("tokenize", body)
        answer = run_tokenize(body, state.tok, state.n_ctx, state.render, state.start)
        checks.leftover("tokenize", body, found)
        return JSONResponse(answer)

    async def detokenize(request: Request) -> Response:
        from gptport.serve.tokenize import detokenize as run_detokenize

        body = await _body(request, settings.max_body)
        check_model(body)
        state.ready()
        found = checks.before("detokenize", body)
        answer = run_detokenize(body, state.tok)
        checks.leftover("detokenize", body, found)
        return JSONResponse(answer)

    async def tokenizer_info(request: Request) -> Response:
        from gptport.serve.tokenizer_info import tokenizer_info as info

        state.ready()
        return JSONResponse(info(settings.model_dir, state.n_ctx))

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [_model_card(name, state.created) for name in names]})

    async def model(request: Request) -> Response:
        return JSONResponse(_model_card(check_model({"model": request.path_params["name"]}), state.created))

    async def health(request: Request) -> Response:
        try:
            state.ready()
        except ApiError as e:
            return JSONResponse({"status": "loading" if e.code == "not_ready" and state.error is None else "error",
                                 "message": e.message}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(state.scheduler), media_type="text/plain; version=0.0.4")

    async def page(request: Request) -> Response:
        return HTMLResponse(styled(resources.files("gptport.serve").joinpath("page.html").read_text(encoding="utf-8")))

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        headers = ({"Retry-After": str(guard.RETRY_AFTER)} if exc.status == 429 else {"Connection": "close"}
                   if exc.status == 408 else None)
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return JSONResponse(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                     None, None).body(), status_code=exc.status_code,
                            headers=exc.headers)  # a 405's Allow (RFC 9110)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if state.scheduler is None and state.error is None:  # not loaded beforehand (Ray's replicas do)
            threading.Thread(target=state.load, args=(asyncio.get_running_loop(),), name="gptport-load",
                             daemon=True).start()
        yield
        if state.scheduler is not None:
            state.scheduler.stop()

    routes = [Route("/", page), Route("/health", health), Route("/metrics", metrics),
              Route("/v1/models", models), Route("/v1/models/{name:path}", model),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/v1/responses", responses, methods=["POST"]),
              Route("/tokenize", tokenize, methods=["POST"]), Route("/detokenize", detokenize, methods=["POST"]),
              Route("/tokenizer_info", tokenizer_info), openapi.route(state, PUBLIC)]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={ApiError: api_error, HTTPException: http_error})
    app.state.gptport = state
    replica = settings.replica or f"{socket.gethostname()}:{os.getpid()}"
    guarded = guard.Guard(app, settings.api_key, state.metrics, replica, queue_full(), PUBLIC)
    served = cors.with_cors(guarded, settings.allowed_origins)  # outside the key: preflights carry none
    outer = AccessLog(served) if settings.access_log else served
    outer.state = app.state  # what callers read (the loaded model's State), whichever layer is outermost
    return outer  # type: ignore[no-any-return]


def _matchers(grammars: Any, job: Job, count: int) -> list[Any]:
    """One matcher per choice of the job's constraint (compiling can take a while: not on the event loop)."""
    from gptport.runtime.constraint import ConstraintError

    assert job.spec is not None
    try:
        grammar = grammars.compile(job.spec)
        return [grammars.matcher(grammar, job.spec.json_like) for _ in range(count)]
    except ConstraintError as e:
        raise ApiError(400, str(e), job.spec.origin.strip("'"), "invalid_constraint") from e


def _seeded(job: Job, j: int) -> Any:
    """Choice j of a prompt samples with seed + j, so n choices differ and choice 0 is `generate --seed`'s."""
    return job.sampling if j == 0 else replace(job.sampling, seed=(job.sampling.seed + j) % 2**63)


async def _collect(collector: Collector, queue: asyncio.Queue[tuple[int, Any]], n: int) -> None:
    finished = 0
    while finished < n:
        index, event = await queue.get()
        collector.add(index, event)
        finished += isinstance(event, Finish) or collector.failed(event)


def _model_card(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "gptport"}
