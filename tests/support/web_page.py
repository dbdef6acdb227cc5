"""A bundle of `gptport export-web` opened in headless Chromium: served on 127.0.0.1 by export-web's own
server, with the URLs the page requested and the console errors it logged, for the browser tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gptport.export.web_server import make_server
from tests.support.chromium import CHROMIUM_ARGS, chromium_path

WAIT_MS = 120_000  # a page step on a loaded 2-core machine
WEBGPU = ["--enable-unsafe-webgpu"]  # headless Chromium then offers SwiftShader's adapter, a CPU-emulated GPU


class Page:
    """The bundle's page in a browser, with the URLs it requested and the console errors it logged."""

    def __init__(self, browser: Any, bundle: Path, device: str = "wasm", threads: int = 1) -> None:
        self.server = make_server(bundle)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.page = browser.new_page()
        self.page.set_default_timeout(WAIT_MS)
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.goto(f"{self.origin}/?device={device}&threads={threads}")
        self.info = self.page.evaluate("window.gptport.ready")

    def generate(self, prompt: str, **opts: Any) -> dict[str, Any]:
        return self.page.evaluate("([p, o]) => window.gptport.generate(p, o)", [prompt, opts])

    def close(self) -> None:
        self.page.close()
        self.server.shutdown()
        self.server.server_close()

    def check_clean(self) -> None:
        assert self.errors == []
        assert self.requests and all(u.startswith(self.origin + "/") for u in self.requests), self.requests


def has_webgpu(browser: Any, bundle: Path) -> bool:
    """Whether this browser offers a WebGPU adapter (it needs a secure context: the bundle's origin)."""
    server = make_server(bundle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        probe = browser.new_page()
        probe.goto(f"http://127.0.0.1:{server.server_address[1]}/manifest.json")
        found = bool(probe.evaluate("async () => !!(navigator.gpu && await navigator.gpu.requestAdapter())"))
        probe.close()
        return found
    finally:
        server.shutdown()
        server.server_close()


def opened(playwright: Any, bundle: Path) -> Iterator[Page]:
    """The bundle's page (WebAssembly) in a headless Chromium launched for it, closed with its browser after: what a
    module's `page` fixture yields."""
    browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
    page = Page(browser, bundle)
    yield page
    page.close()
    browser.close()
