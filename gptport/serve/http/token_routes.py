"""POST /tokenize and /detokenize (over the request path, request_path.py, not queued: they never reach the
scheduler), and GET /tokenizer_info. No torch here."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gptport.serve.api.tokenize import detokenize as run_detokenize
from gptport.serve.api.tokenize import tokenize as run_tokenize
from gptport.serve.api.tokenizer_info import tokenizer_info as info
from gptport.serve.http.request_path import RequestPath


def routes(path: RequestPath) -> list[Route]:
    state = path.state

    async def tokenize(request: Request) -> Response:
        answer, _ = await path.take(request, "tokenize", queued=False,
                                    parse=lambda body: run_tokenize(body, state.tok, state.n_ctx, state.render,
                                                                    state.start))
        return JSONResponse(answer)

    async def detokenize(request: Request) -> Response:
        answer, _ = await path.take(request, "detokenize", lambda body: run_detokenize(body, state.tok),
                                    queued=False)
        return JSONResponse(answer)

    async def tokenizer_info(request: Request) -> Response:
        state.ready()
        return JSONResponse(info(state.settings.model_dir, state.n_ctx))

    return [Route("/tokenize", tokenize, methods=["POST"]), Route("/detokenize", detokenize, methods=["POST"]),
            Route("/tokenizer_info", tokenizer_info)]
