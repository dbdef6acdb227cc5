"""`gptport export-web --serve`: the bundle over HTTP on 127.0.0.1 with the MIME types browsers insist on
(.mjs as JavaScript, .wasm as application/wasm for streaming compilation) and the cross-origin isolation
headers (COOP/COEP) that multi-threaded WebAssembly needs. The standard library's server: the bundle is
static files, and this is for trying it out, not for production hosting."""

from __future__ import annotations

import functools
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gptport.errors import InputError, UsageError

TYPES = {".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm",
         ".json": "application/json", ".onnx": "application/octet-stream",
         ".onnx_data": "application/octet-stream", ".html": "text/html; charset=utf-8"}
ISOLATION = {"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp",
             "Cross-Origin-Resource-Policy": "same-origin"}


class BundleHandler(SimpleHTTPRequestHandler):
    """Static files of one folder, with the bundle's MIME types and isolation headers; quiet."""

    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, **TYPES}

    def end_headers(self) -> None:
        for name, value in ISOLATION.items():
            self.send_header(name, value)
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return


def make_server(folder: Path, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """A server for `folder` bound to host:port (0: a free port), not yet serving."""
    if not (folder / "index.html").is_file() or not (folder / "manifest.json").is_file():
        raise InputError(f"{folder}: not a bundle of `gptport export-web` (no index.html and manifest.json)")
    try:
        return ThreadingHTTPServer((host, port), functools.partial(BundleHandler, directory=str(folder)))
    except OSError as e:
        raise UsageError(f"--port {port}: cannot listen on {host}:{port}: {e.strerror}") from None
