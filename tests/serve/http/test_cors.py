"""`serve --allowed-origins`: CORS through a real `gptport serve`. Raw preflights and requests (the key still
required, errors and streams readable by an allowed origin, nothing for another), the option's one-line
refusals, and a page on another origin in a real headless Chromium: its fetch gets the reply when its origin
is allowed and fails when it is not."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from gptport.errors import UsageError
from gptport.serve.http.cors import parse_origins
from tests.support.chromium import CHROMIUM_ARGS, chromium_path
from tests.support.cli import assert_one_line_error, gptport
from tests.support.serving import Served, assert_error, serve

KEY = "k3y"
ORIGIN = "http://app.example:8080"  # allowed, besides the page's origin and OTHER
OTHER = "https://other.example"  # allowed as given: https://Other.Example:443
FOREIGN = "http://foreign.example:8080"  # never allowed
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"messages": [{"role": "user", "content": "the ka"}], "max_tokens": 8, "temperature": 0, "ignore_eos": True}
WAIT_MS = 30_000  # the longest a page may take to finish

# The page on another origin: its script calls the server's chat route with the key and writes the reply (or the
# error the server answered, or the fetch's failure) into the DOM, then marks the body done.
PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>cross-origin</title></head><body>
<pre id="reply"></pre><pre id="error"></pre><script>
const q = new URLSearchParams(location.search);
async function run() {
  const body = {messages: [{role: "user", content: "the ka"}], max_tokens: 8, temperature: 0, ignore_eos: true,
                stream: q.get("stream") === "1"};
  const r = await fetch(q.get("api") + "/v1/chat/completions", {method: "POST", body: JSON.stringify(body),
    headers: {"Authorization": "Bearer " + q.get("key"), "Content-Type": "application/json"}});
  if (!r.ok) { const e = await r.json(); return ["", r.status + " " + e.error.message]; }
  if (!body.stream) { return [(await r.json()).choices[0].message.content, ""]; }
  const reader = r.body.getReader(), decoder = new TextDecoder();
  let buffer = "", text = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf("\\n\\n")) >= 0) {
      const event = buffer.slice(0, end); buffer = buffer.slice(end + 2);
      if (event.startsWith("data: {")) text += JSON.parse(event.slice(6)).choices[0]?.delta?.content || "";
    }
  }
  return [text, ""];
}
run().catch(e => ["", "fetch failed: " + e]).then(([reply, error]) => {
  document.getElementById("reply").textContent = reply;
  document.getElementById("error").textContent = error;
  document.body.dataset.done = "1";
});
</script></body></html>
"""


class Quiet(http.server.SimpleHTTPRequestHandler):
    """A static file server that keeps out of the test's output."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """Two origins serving the page (http.server on two free ports of 127.0.0.1): (allowed, not allowed)."""
    root = tmp_path_factory.mktemp("pages")
    (root / "page.html").write_text(PAGE, encoding="utf-8")
    handler = functools.partial(Quiet, directory=str(root))
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) for _ in range(2)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        allowed, foreign = (f"http://127.0.0.1:{s.server_address[1]}" for s in servers)
        yield allowed, foreign
    finally:
        for s, t in zip(servers, threads, strict=True):
            s.shutdown()
            s.server_close()
            t.join(timeout=10)


@pytest.fixture(scope="module")
def server(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory, pages: tuple[str, str]) -> Iterator[Served]:
    """The module's server: an API key; the first page's origin, ORIGIN and OTHER allowed (comma-separated and
    repeated)."""
    with serve(trained_dir, tmp_path_factory.mktemp("cors") / "serve.log", "--api-key", KEY,
               "--allowed-origins", f"{ORIGIN},https://Other.Example:443", "--allowed-origins", pages[0]) as s:
        yield s


def preflight(server: Served, origin: str, method: str = "POST", path: str = "/v1/chat/completions") -> httpx.Response:
    """A browser's preflight: OPTIONS with the origin, the method and the headers the page will send; no key."""
    return httpx.options(server.url + path, timeout=30, headers={
        "Origin": origin, "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "authorization,content-type"})


def cors_headers(r: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in r.headers.items() if k.lower().startswith("access-control-")}


def test_origins_are_read_as_a_browser_sends_them() -> None:
    assert parse_origins(None) == ()
    assert parse_origins(["http://a.example:8080,HTTPS://B.Example:443", " http://a.example:8080 ",
                          "http://[::1]:80"]) == ("http://a.example:8080", "https://b.example", "http://[::1]")
    assert parse_origins(["http://a.example", "*"]) == ("*",)
    for bad in ("http://a.example/", "a.example", "http://a.example/x", "http://a.example:0", "http://a.example:65536",
                "", "http://*.example", "http://a.example:8080?x"):
        with pytest.raises(UsageError, match=r"^--allowed-origins '.*': expected scheme://host\[:port\]"):
            parse_origins([f"http://ok.example,{bad}"])


@pytest.mark.parametrize("value", ["http://localhost:5173/", "localhost:5173"])
def test_a_bad_origin_is_one_line_before_anything_loads(trained_dir: Path, value: str) -> None:
    r = gptport("serve", str(trained_dir), "--allowed-origins", value)
    assert_one_line_error(r, 2, "--allowed-origins", repr(value))


def test_preflight_of_an_allowed_origin_is_answered_without_the_key(server: Served) -> None:
    for origin in (ORIGIN, OTHER):
        r = preflight(server, origin)
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == origin
        assert {"GET", "POST"} <= {m.strip() for m in r.headers["access-control-allow-methods"].split(",")}
        allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
        assert {"authorization", "content-type"} <= allowed
        assert int(r.headers["access-control-max-age"]) > 0
        assert "origin" in r.headers["vary"].lower()
        assert "access-control-allow-credentials" not in r.headers  # the key travels in a header, not a cookie
    # a public page calling a server on this machine: Chromium's private-network preflight is granted
    r = httpx.options(server.url + "/v1/models", timeout=30, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "GET", "Access-Control-Request-Private-Network": "true"})
    assert r.status_code == 200 and r.headers["access-control-allow-private-network"] == "true", r.headers


def test_answers_to_an_allowed_origin_carry_it_errors_too(server: Served) -> None:
    url, origin = server.url + "/v1/chat/completions", {"Origin": ORIGIN}
    r = httpx.post(url, json=CHAT, headers={**origin, **AUTH}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
    assert r.headers["access-control-allow-origin"] == ORIGIN and "origin" in r.headers["vary"].lower()

    r = httpx.post(url, json=CHAT, headers=origin, timeout=60)  # the key is still required
    assert_error(r.status_code, r.json(), 401)
    assert r.headers["access-control-allow-origin"] == ORIGIN  # so that the page can show why

    r = httpx.post(url, json={**CHAT, "temperature": -1}, headers={**origin, **AUTH}, timeout=60)
    assert_error(r.status_code, r.json(), 400, "temperature")
    assert r.headers["access-control-allow-origin"] == ORIGIN

    r = httpx.get(server.url + "/v1/models", headers={**origin, **AUTH}, timeout=30)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN


def test_a_stream_to_an_allowed_origin_carries_it(server: Served) -> None:
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**CHAT, "stream": True},
                      headers={"Origin": OTHER, **AUTH}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["access-control-allow-origin"] == OTHER
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert len(lines) > 1 and lines[-1] == "data: [DONE]"


def test_another_origin_gets_no_cors_headers(server: Served) -> None:
    r = preflight(server, FOREIGN)
    assert r.status_code in (400, 403), r.text
    assert "access-control-allow-origin" not in r.headers
    for origin in (FOREIGN, "http://app.example:8081", "https://app.example:8080"):  # same host, other port/scheme
        r = httpx.post(server.url + "/v1/chat/completions", json=CHAT, headers={"Origin": origin, **AUTH}, timeout=60)
        assert r.status_code == 200, r.text  # the server answers; the browser withholds it from the page
        assert "access-control-allow-origin" not in r.headers, r.headers
    r = httpx.post(server.url + "/v1/chat/completions", json=CHAT, headers={"Origin": FOREIGN}, timeout=60)
    assert_error(r.status_code, r.json(), 401)
    assert cors_headers(r) == {}


def test_no_origin_is_allowed_by_default_and_star_allows_any(trained_dir: Path, tmp_path: Path) -> None:
    with serve(trained_dir, tmp_path / "default.log") as s:
        r = preflight(s, ORIGIN)
        assert r.status_code >= 400 and cors_headers(r) == {}, (r.status_code, r.headers)
        r = httpx.post(s.url + "/v1/chat/completions", json=CHAT, headers={"Origin": ORIGIN}, timeout=60)
        assert r.status_code == 200 and cors_headers(r) == {}, r.headers
    with serve(trained_dir, tmp_path / "any.log", "--allowed-origins", "*", "--api-key", KEY) as s:
        r = preflight(s, FOREIGN)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*", r.headers
        r = httpx.post(s.url + "/v1/chat/completions", json=CHAT, headers={"Origin": FOREIGN, **AUTH}, timeout=60)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
        r = httpx.post(s.url + "/v1/chat/completions", json=CHAT, headers={"Origin": FOREIGN}, timeout=60)
        assert_error(r.status_code, r.json(), 401)
        assert r.headers["access-control-allow-origin"] == "*"


@pytest.mark.slow
@pytest.mark.skipif(chromium_path() is None,
                    reason="no Chromium: `apt-get install chromium` (Debian), or set GPTPORT_CHROMIUM")
def test_a_page_on_another_origin_in_chromium(server: Served, pages: tuple[str, str]) -> None:
    from playwright import sync_api  # a dev dependency: its absence is a failure, not a skip

    status, want = server.post("/v1/chat/completions", CHAT, AUTH)
    assert status == 200 and want["choices"][0]["message"]["content"], want
    reply = want["choices"][0]["message"]["content"]
    allowed, foreign = pages

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        try:
            def load(origin: str, key: str = KEY, stream: bool = False) -> tuple[str, str, list[str]]:
                """The page from `origin` run to its end: (reply, error, the console's messages)."""
                page = browser.new_page()
                page.set_default_timeout(WAIT_MS)
                console: list[str] = []
                page.on("console", lambda m: console.append(m.text))
                page.goto(f"{origin}/page.html?" + urlencode({"api": server.url, "key": key, "stream": int(stream)}))
                page.wait_for_selector("body[data-done='1']")
                out = (page.text_content("#reply") or "", page.text_content("#error") or "", console)
                page.close()
                return out

            assert load(allowed)[:2] == (reply, "")
            assert load(allowed, stream=True)[:2] == (reply, "")  # the stream's deltas, read by the page
            text, error, _ = load(allowed, key="wrong")
            assert text == "" and error == "401 Incorrect or missing API key: send 'Authorization: Bearer KEY'"
            text, error, console = load(foreign)
            assert text == "" and error.startswith("fetch failed: TypeError"), error
            assert any("CORS policy" in line for line in console), console
        finally:
            browser.close()
