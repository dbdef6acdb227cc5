"""OpenAI's error object: a refusal with its HTTP status, naming the field at fault. No torch here."""

from __future__ import annotations

from typing import Any

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
               413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}


class ApiError(Exception):
    """A refusal: HTTP status and OpenAI's {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        message, param = _text(message), None if param is None else _text(param)
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = ERROR_TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def _text(s: str) -> str:
    """`s` as it can be sent in UTF-8: a lone surrogate a request brought in (in a field name or value the
    message quotes) written as its escape."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")
    return s


def bad(param: str, message: str, code: str | None = None) -> ApiError:
    return ApiError(400, f"'{param}': {message}", param, code)
