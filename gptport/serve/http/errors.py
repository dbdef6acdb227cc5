"""The app's exception handlers: an `ApiError` as OpenAI's error object (a 429's Retry-After, a 408's
Connection: close), and Starlette's own HTTP errors (404, 405) in the same shape. No torch here."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gptport.serve.api.api_error import ApiError
from gptport.serve.http import guard


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


HANDLERS = {ApiError: api_error, HTTPException: http_error}
