"""A typed job answered: its choices submitted to the scheduler and their events awaited on an asyncio
queue (the scheduler's thread fills it once per iteration), then rendered as the job's API answers: a chat
or completions response or stream (api/collector.py), or the Responses API's translation of the chat one
(api/responses/from_chat.py). No torch here."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gptport.serve.api.api_error import ApiError
from gptport.serve.api.collector import Collector, stream_chunks
from gptport.serve.api.protocol import Job
from gptport.serve.engine.scheduler import Choice, Finish
from gptport.serve.http.request_path import RequestPath


async def answer(path: RequestPath, request: Request, job: Job, reply: Any = None) -> Response:
    """The job's choices scheduled and answered: a chat or completions response, or `reply`'s translation
    of the chat one (from_chat.Reply: POST /v1/responses)."""
    state = path.state
    scheduler = state.ready()
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    count = len(job.prompts) * job.n
    matchers = await asyncio.to_thread(_matchers, state.grammars, job, count) if job.spec else [None] * count
    choices = [Choice(ids, job.max_tokens, _seeded(job, j), job.stops, job.logprobs,
                      job.echo and job.logprobs is not None, job.ignore_eos, matchers[i * job.n + j],
                      job.logit_bias, out=(queue, i * job.n + j))
               for i, ids in enumerate(job.prompts) for j in range(job.n)]
    if not scheduler.submit(choices):
        raise path.queue_full()

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


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body has been read, so only a disconnect is left)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


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
