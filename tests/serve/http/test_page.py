"""The page at `/` in a real headless Chromium (Debian's `chromium`, driven by Playwright): it streams what
the API returns, shows its stats and the server's errors, and sends the API key that is typed in.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.chromium import CHROMIUM_ARGS, chromium_path
from tests.support.serving import Served, serve

WAIT_MS = 30_000  # the longest any step may take
PROMPT = "the ka"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    chromium_path() is None, reason="no Chromium: `apt-get install chromium` (Debian), or set GPTPORT_CHROMIUM")]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium for the module's tests."""
    path = chromium_path()
    assert path is not None  # else the module skips
    from playwright import sync_api  # a dev dependency: its absence is a failure, not a skip

    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Watched:
    """A page, with the URLs it requested and the script errors it raised."""

    def __init__(self, browser: Any, served: Served, width: int = 1100) -> None:
        self.page = browser.new_page(viewport={"width": width, "height": 900})
        self.page.set_default_timeout(WAIT_MS)
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.served = served
        self.page.goto(served.url + "/")

    def text(self, selector: str) -> str:
        return str(self.page.locator(selector).text_content() or "")

    def generate(self, prompt: str, **fields: str) -> None:
        """Fill the prompt and fields, click Generate and wait until the run is over (Generate enabled again)."""
        from playwright.sync_api import expect

        self.page.fill("#prompt", prompt)
        for name, value in fields.items():
            self.page.fill(f"#{name}", value)
        self.page.click("#generate")
        expect(self.page.locator("#generate")).to_be_enabled(timeout=WAIT_MS)

    def check_clean(self) -> None:
        """No script errors, and nothing fetched but the server's own URLs."""
        assert self.errors == []
        assert self.requests and all(u.startswith(self.served.url + "/") for u in self.requests), self.requests


def test_page_streams_greedy_text_and_stats(browser: Any, trained_dir: Path, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with serve(trained_dir, tmp_path / "serve.log") as served:
        status, models = served.get("/v1/models")
        assert status == 200
        name = models["data"][0]["id"]
        status, want = served.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 40, "temperature": 0})
        assert status == 200, want
        status, want_chat = served.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 40, "temperature": 0})
        assert status == 200, want_chat

        w = Watched(browser, served)
        page = w.page
        expect(page.locator("#model")).to_have_text(name)
        expect(page.locator("#health")).to_have_text("ready")

        w.generate(PROMPT, max_tokens="40", temperature="0")
        expect(page.locator("#finish")).to_contain_text(want["choices"][0]["finish_reason"])
        assert w.text("#output") == want["choices"][0]["text"] != ""
        assert w.text("#error") == ""
        assert "ms" in w.text("#ttft") and "tok/s" in w.text("#tps")
        assert w.text("#tokens") == f"tokens {want['usage']['completion_tokens']}"
        page.screenshot(path=str(tmp_path / "page.png"), full_page=True)

        page.locator("label", has=page.locator("#mode-chat")).click()  # the switch: a label over a radio
        expect(page.locator("#mode-chat")).to_be_checked()
        w.generate(PROMPT)
        expect(page.locator("#finish")).to_contain_text(want_chat["choices"][0]["finish_reason"])
        assert w.text("#output") == want_chat["choices"][0]["message"]["content"]

        # an HTTP error: the server's message is shown, and nothing is left running
        w.generate(PROMPT, temperature="-1")
        expect(page.locator("#error")).to_contain_text("'temperature': must be >= 0")
        assert w.text("#output") == "" and w.text("#finish") == ""
        assert page.locator("#stop").is_disabled()

        # Stop right after Generate: the fetch is aborted, the page says so, the server carries on
        page.evaluate("() => { document.getElementById('generate').click(); document.getElementById('stop').click(); }")
        expect(page.locator("#finish")).to_have_text("finish stopped")
        assert w.text("#error") == "" and page.locator("#generate").is_enabled()
        assert served.get("/health")[0] == 200

        page.set_viewport_size({"width": 420, "height": 900})  # a narrow window: one column
        page.screenshot(path=str(tmp_path / "page-narrow.png"), full_page=True)
        w.check_clean()

    for png in ("page.png", "page-narrow.png"):
        data = (tmp_path / png).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000


def test_page_api_key(browser: Any, trained_dir: Path, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with serve(trained_dir, tmp_path / "serve.log", "--api-key", "k") as served:
        status, models = served.get("/v1/models", {"Authorization": "Bearer k"})
        assert status == 200
        w = Watched(browser, served)
        page = w.page
        expect(page.locator("#error")).to_contain_text("Incorrect or missing API key")  # GET /v1/models

        page.fill("#prompt", PROMPT)
        page.click("#generate")
        expect(page.locator("#generate")).to_be_enabled()
        expect(page.locator("#error")).to_contain_text("Incorrect or missing API key")
        assert w.text("#output") == ""

        page.fill("#api_key", "k")
        page.dispatch_event("#api_key", "change")
        expect(page.locator("#model")).to_have_text(models["data"][0]["id"])
        expect(page.locator("#error")).to_have_text("")
        assert page.evaluate("sessionStorage.getItem('gptport.api_key')") == "k"

        w.generate(PROMPT, max_tokens="8", temperature="0")
        expect(page.locator("#finish")).to_contain_text("finish")
        assert w.text("#output") != "" and w.text("#error") == ""

        page.reload()  # the key stays for the session
        expect(page.locator("#api_key")).to_have_value("k")
        expect(page.locator("#model")).to_have_text(models["data"][0]["id"])
        w.check_clean()
