"""Cross-origin requests (CORS) for pages served from other origins: `serve --allowed-origins`, checked here
into the origins a browser sends, and Starlette's CORSMiddleware around the app. No torch here.

The middleware sits outside the API key's guard: a browser's preflight (OPTIONS) carries no credentials, so
it is answered before the key is asked for, and every answer to an allowed origin, the guard's 401 and 429
and the routes' errors and streams included, carries Access-Control-Allow-Origin, so the page can read it.
The key is still required for the request itself."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from gptport.errors import UsageError

OPTION = "--allowed-origins"
METHODS = ("GET", "POST")
MAX_AGE = 600  # s a browser may cache a preflight's answer
DEFAULT_PORTS = {"http": "80", "https": "443"}  # a browser's Origin leaves these out
_ORIGIN = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<host>\[[0-9a-f:.]+\]|[a-z0-9]([a-z0-9.-]*[a-z0-9])?)"
                     r"(:(?P<port>[0-9]{1,5}))?", re.IGNORECASE)


def parse_origins(values: Iterable[str] | None, option: str = OPTION) -> tuple[str, ...]:
    """The origins of `values` (each repeated or comma-separated), as a browser's Origin header spells them:
    scheme and host in lower case, a default port (http 80, https 443) left out; `*` for any origin. A value
    that is not `scheme://host[:port]` or `*` is a one-line UsageError naming `option`."""
    out: list[str] = []
    for value in values or ():
        for item in value.split(","):
            origin = _origin(item.strip(), option)
            if origin not in out:
                out.append(origin)
    return ("*",) if "*" in out else tuple(out)


def _origin(text: str, option: str) -> str:
    if text == "*":
        return text
    m = _ORIGIN.fullmatch(text)
    port = m.group("port") if m else None
    if m is None or (port is not None and not 0 < int(port) < 65536):
        raise UsageError(f"{option} {text!r}: expected scheme://host[:port] (no path, no trailing slash), "
                         "e.g. http://localhost:5173, or * for any origin")
    scheme, host = m.group("scheme").lower(), m.group("host").lower()
    keep = port is not None and DEFAULT_PORTS.get(scheme) != port
    return f"{scheme}://{host}" + (f":{port}" if keep else "")


def with_cors(app: Any, origins: tuple[str, ...]) -> Any:
    """`app` answering cross-origin requests from `origins` (from parse_origins); `app` itself when none.
    Preflights get GET and POST, whatever request headers they ask for (Authorization and Content-Type, and
    the headers OpenAI's JavaScript client adds), and Max-Age; a disallowed origin's preflight is a 400 and
    its other answers carry no Access-Control-Allow-Origin. No cookies are involved: the API key travels in
    Authorization, so credentials stay off."""
    if not origins:
        return app
    from starlette.middleware.cors import CORSMiddleware

    return CORSMiddleware(app, allow_origins=origins, allow_methods=METHODS, allow_headers=("*",),
                          allow_private_network=True, max_age=MAX_AGE)
