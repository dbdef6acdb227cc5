"""Raw request bodies against the JSON parser path of POST /v1/completions and /v1/chat/completions: deep
nesting, numbers past float's and int's range, NaN and Infinity, invalid UTF-8, escaped lone surrogates,
bodies just under and over the size limit, duplicate keys, wrong top-level types, and hypothesis-built
bodies of the same. Every answer is a 200 or a documented 4xx in OpenAI's error shape (checked against
GET /openapi.json), never a 500 or a hang; the server stays up and serves a normal request afterwards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptport.serve.api import fields
from gptport.serve.settings import Settings
from tests.support.openapi_check import Conformance
from tests.support.serving import Served, serve, wait_idle

LIMIT = Settings(Path(".")).max_body  # `gptport serve` has no option for it: the default
CHAT = "/v1/chat/completions"
ROUTES = ("/v1/completions", CHAT)
BASE = {"/v1/completions": b'"prompt": "ka"', CHAT: b'"messages": [{"role": "user", "content": "ka"}]'}
SURROGATE_TEXT = {"/v1/completions": b'{"prompt": "ka \\ud800"}',
                  CHAT: b'{"messages": [{"role": "user", "content": "\\udc00 ka"}]}'}
TIMEOUT = 30.0  # a hang fails the test


@pytest.fixture(scope="module")
def server(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(trained_dir, tmp_path_factory.mktemp("fuzz_body") / "serve.log", "--slots", "2") as s:
        yield s


@pytest.fixture(scope="module")
def check(server: Served) -> Conformance:
    return Conformance(httpx.get(server.url + "/openapi.json", timeout=10).json())


def post(server: Served, check: Conformance, path: str, data: bytes | Iterator[bytes]) -> int:
    """POST raw bytes (an iterator: chunked, no Content-Length); the answer conforms and is no 5xx."""
    r = httpx.post(server.url + path, content=data, headers={"Content-Type": "application/json"}, timeout=TIMEOUT)
    assert r.status_code in (200, 400, 404, 413), (r.status_code, r.text[:500])
    check.check(path, "POST", r.status_code, r.headers, r.content)
    return r.status_code


def obj(path: str, *extra: bytes) -> bytes:
    """{BASE, extra...} as raw bytes (the extras are written as they are)."""
    return b"{" + b", ".join([BASE[path], *extra]) + b"}"


def nasty(path: str) -> list[tuple[bytes, int]]:
    """(body, the status it must get)."""
    deep = b"[" * 100_000 + b"]" * 100_000
    big = b"1" + b"0" * 5000  # past int's 4300-digit limit on conversion
    return [
        (deep, 400), (obj(path, b'"stop": ' + deep), 400), (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, 400),
        (obj(path, b'"max_tokens": 1e400'), 400), (obj(path, b'"max_tokens": ' + big), 400),
        (obj(path, b'"seed": ' + big), 400), (obj(path, b'"seed": ' + b"9" * 4000, b'"max_tokens": 2'), 200),
        (obj(path, b'"temperature": ' + b"9" * 400), 400), (obj(path, b'"temperature": 1e-400', b'"max_tokens": 2'),
                                                             200),
        (obj(path, b'"temperature": NaN'), 400), (obj(path, b'"top_p": Infinity'), 400),
        (obj(path, b'"repetition_penalty": -Infinity'), 400), (obj(path, b'"logit_bias": {"5": NaN}'), 400),
        (obj(path, b'"n": ' + b"9" * 4000), 400), (obj(path, b'"max_tokens": -' + b"9" * 4000), 400),
        (b"\xff\xfe", 400), (obj(path, b'"user": "\xff"'), 400), (obj(path, b'"user": "\xc0\xaf"'), 400),
        (obj(path, b'"user": "\xe6\x97"'), 400), (obj(path, b'"user": "\xed\xa0\x80"'), 400),
        (obj(path, b'"user": "\\ud800"'), 400), (obj(path, b'"stop": ["\\udfff\\ud800"]'), 400),
        (obj(path, b'"model": "\\ud800"'), 400), (obj(path, b'"\\ud800": 1'), 400),
        (obj(path, b'"regex": "\\ud800"'), 400), (SURROGATE_TEXT[path], 400),
        (obj(path, b'"max_tokens": 2', b'"max_tokens": "x"'), 400),
        (obj(path, b'"max_tokens": "x"', b'"max_tokens": 2'), 200),  # the last of duplicate keys counts
        (b"[]", 400), (b"1", 400), (b'"x"', 400), (b"null", 400), (b"true", 400), (b"", 400), (b" ", 400),
        (b"{}", 400), (b"\xef\xbb\xbf" + obj(path, b'"max_tokens": 2'), 200), (b'{"a": 1', 400), (b"{\x00}", 400),
    ]


@pytest.mark.parametrize("path", ROUTES)
def test_nasty_bodies(server: Served, check: Conformance, path: str) -> None:
    for body, status in nasty(path):
        got = post(server, check, path, body)
        assert got == status, (body[:120], got)
    assert post(server, check, path, obj(path, b'"max_tokens": 2')) == 200


def sized(path: str, size: int) -> bytes:
    """A valid body of exactly `size` bytes (a long `user`)."""
    head, tail = obj(path, b'"max_tokens": 2', b'"user": "')[:-1], b'"}'
    return head + b"u" * (size - len(head) - len(tail)) + tail


def chunks(data: bytes, size: int = 1 << 16) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


@pytest.mark.parametrize("path", ROUTES)
def test_size_limit(server: Served, check: Conformance, path: str) -> None:
    """At the limit: served; one byte over, or 10 MB: 413; with a Content-Length and without (chunked)."""
    for size, status in ((LIMIT - 1, 200), (LIMIT, 200), (LIMIT + 1, 413), (10 * 2**20, 413)):
        body = sized(path, size)
        assert len(body) == size
        assert post(server, check, path, body) == status, size
        assert post(server, check, path, chunks(body)) == status, size
    prompt = b'"prompt": "' + b"ka " * ((LIMIT - 100) // 3) + b'"'  # a long prompt under the limit: too long
    assert post(server, check, "/v1/completions", b"{" + prompt + b"}") == 400


# ---- hypothesis ----------------------------------------------------------------------------------------------------

ATOMS = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", b"1" + b"0" * 5000, b"9" * 4000, b"-0", b"1E-400",
         b'"\\ud800"', b'"\\udfff\\ud800"', b'"\\u0000"', b'"\xff"', b'"\xed\xa0\x80"', b"true", b"null", b"[]", b"{}",
         b'"' + b"x" * 100_000 + b'"', b"[" * 5000 + b"]" * 5000]
leaves = st.one_of(st.sampled_from(ATOMS), st.integers().map(lambda i: str(i).encode()),
                   st.floats(allow_nan=False).map(lambda f: json.dumps(f).encode()),
                   st.text(max_size=20).map(lambda t: json.dumps(t).encode()))
keys = st.sampled_from(sorted(fields.COMPLETION | fields.CHAT | fields.EXTRAS_BOTH) + ["x", "\\ud800"]).map(
    lambda k: b'"' + k.encode() + b'"')
values = st.recursive(leaves, lambda kids: st.one_of(
    st.lists(kids, max_size=4).map(lambda xs: b"[" + b",".join(xs) + b"]"),
    st.lists(st.tuples(keys, kids), max_size=4).map(lambda kv: b"{" + b",".join(k + b":" + v for k, v in kv) + b"}")),
    max_leaves=12)


@st.composite
def bodies(draw: st.DrawFn, path: str) -> bytes:
    """An object of the route's base and random fields (duplicates too), a random value, or random bytes; then
    maybe a few bytes changed."""
    kind = draw(st.sampled_from(["object", "value", "bytes"]))
    if kind == "object":
        data = obj(path, *[k + b": " + v for k, v in draw(st.lists(st.tuples(keys, values), max_size=6))])
    elif kind == "value":
        data = draw(values)
    else:
        data = draw(st.binary(max_size=64))
    for at, byte in draw(st.lists(st.tuples(st.integers(0, max(len(data) - 1, 0)), st.integers(0, 255)),
                                  max_size=2)):
        data = data[:at] + bytes([byte]) + data[at + 1:]
    return data


@pytest.mark.parametrize("path", ROUTES)
def test_hypothesis_bodies(server: Served, check: Conformance, path: str) -> None:
    @settings(max_examples=50, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(body=bodies(path))
    def one(body: bytes) -> None:
        post(server, check, path, body)

    one()
    assert post(server, check, path, obj(path, b'"max_tokens": 2')) == 200
    wait_idle(server, 10)
    assert server.proc.poll() is None
