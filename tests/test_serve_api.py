"""Black-box tests of `gptport serve`'s OpenAI-compatible API: a real server process per module (and a few
with other options), driven over HTTP with the `openai` client, httpx and raw sockets."""

from __future__ import annotations

import json
import math
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from gptport import tokenizer as bpe
from tests.serving import Served, serve

N_CTX = 96  # trained_dir's context
LONG = {"max_tokens": 10_000, "ignore_eos": True, "temperature": 0}  # runs to n_ctx: 96 tokens after a 1-token prompt


# ---- helpers ------------------------------------------------------------------------------------------------------


def metrics(server: Served, headers: dict[str, str] | None = None) -> str:
    r = httpx.get(server.url + "/metrics", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    return r.text


def sample(text: str, name: str, **labels: str) -> float | None:
    """The sum of a metric's samples whose labels include `labels`; None when it has none."""
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name) or line[len(name):len(name) + 1] not in (" ", "{"):
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0] if "{" in line else ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total, found = total + float(line.rsplit(" ", 1)[1]), True
    return total if found else None


def value(server: Served, name: str, **labels: str) -> float:
    return sample(metrics(server), name, **labels) or 0.0


def wait_idle(server: Served, within: float = 2.0) -> None:
    """Poll /metrics until no slot is busy and nothing waits; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        text = metrics(server)
        if sample(text, "gptport_slots_busy") == 0 and sample(text, "gptport_queue_depth") == 0:
            return
        assert time.monotonic() < deadline, f"the server is still busy after {within} s:\n{text}"
        time.sleep(0.02)


def events(server: Served, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> list[Any]:
    """A streamed POST's `data:` payloads, parsed; the last is the string "[DONE]"."""
    out: list[Any] = []
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, headers=headers, timeout=60) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                out.append(data if data == "[DONE]" else json.loads(data))
    assert out and out[-1] == "[DONE]" and out.count("[DONE]") == 1, out[-3:]
    return out


def streamed_text(chunks: list[Any], index: int = 0) -> str:
    return "".join(c["choices"][0]["text"] for c in chunks[:-1] if c["choices"] and c["choices"][0]["index"] == index)


def assert_error(status: int, body: Any, expected: int, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: {"error": {"message", "type", "param", "code"}} with the expected status and param."""
    assert status == expected, body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str), err
    assert err["param"] == param, err
    return err


def cli_generate(model_dir: Path, prompt: str, max_new_tokens: int) -> str:
    """`gptport generate MODEL_DIR PROMPT --max-new-tokens N`'s stdout (greedy), without its trailing newline."""
    out = subprocess.run([sys.executable, "-m", "gptport.cli.main", "generate", str(model_dir), prompt,
                          "--max-new-tokens", str(max_new_tokens)], capture_output=True, timeout=120, check=True)
    text = out.stdout.decode("utf-8")
    assert text.endswith("\n"), text
    return text[:-1]


class Raw:
    """One HTTP/1.1 POST over a plain socket, so that a test can leave at any point (close = disconnect)."""

    def __init__(self, server: Served, path: str, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None,
                 length: int | None = None) -> None:
        parts = urlsplit(server.url)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        head = [f"POST {path} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json",
                f"Content-Length: {len(data) if length is None else length}",
                *(f"{k}: {v}" for k, v in (headers or {}).items())]
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        self.buf = b""

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError(f"the server closed the connection; got {self.buf[:300]!r}")
        self.buf += data

    def head(self) -> tuple[int, dict[str, str]]:
        """The response's status and headers (lower-case names); the body stays in the buffer."""
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        fields = dict(line.split(":", 1) for line in lines[1:])
        return int(lines[0].split()[1]), {k.strip().lower(): v.strip() for k, v in fields.items()}

    def json(self, headers: dict[str, str]) -> Any:
        """A body with a Content-Length, parsed."""
        n = int(headers["content-length"])
        while len(self.buf) < n:
            self._more()
        return json.loads(self.buf[:n])

    def until(self, marker: bytes, count: int) -> None:
        """Read until the body holds `count` of `marker`."""
        while self.buf.count(marker) < count:
            self._more()

    def close(self) -> None:
        self.sock.close()


def attempts(n: int, seconds: float) -> Iterator[int]:
    """At most n tries within `seconds` (timing-dependent checks retry; each loop is bounded both ways)."""
    deadline = time.monotonic() + seconds
    for i in range(n):
        if i and time.monotonic() > deadline:
            return
        yield i


# ---- fixtures -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The module's server: 4 slots, the default queue."""
    with serve(trained_dir, tmp_path_factory.mktemp("serve") / "serve.log", "--slots", "4") as s:
        yield s


@pytest.fixture(scope="module")
def tokenizer(trained_dir: Path) -> bpe.BPETokenizer:
    """The served model's tokenizer (to build token-id prompts and count tokens)."""
    return bpe.load(trained_dir)


@pytest.fixture(scope="module")
def model(server: Served) -> str:
    return str(server.get("/v1/models")[1]["data"][0]["id"])


@pytest.fixture(scope="module")
def client(server: Served) -> Any:
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)


# ---- health, models -----------------------------------------------------------------------------------------------


def test_health_and_models(server: Served, client: Any, trained_dir: Path) -> None:
    assert server.get("/health") == (200, {"status": "ok"})
    status, body = server.get("/v1/models")
    assert status == 200 and body["object"] == "list" and len(body["data"]) == 1
    card = body["data"][0]
    assert set(card) >= {"id", "object", "created", "owned_by"} and card["object"] == "model"
    assert card["id"] == trained_dir.name and isinstance(card["created"], int) and isinstance(card["owned_by"], str)
    assert [m.id for m in client.models.list()] == [card["id"]]
    assert server.get(f"/v1/models/{card['id']}") == (200, card)
    assert_error(*server.get("/v1/models/nope"), 404, "model")


# ---- completions --------------------------------------------------------------------------------------------------


def test_greedy_completion_matches_generate(client: Any, model: str, trained_dir: Path, tokenizer: bpe.BPETokenizer
                                            ) -> None:
    prompt, n = "ka to ri", 12
    r = client.completions.create(model=model, prompt=prompt, max_tokens=n, temperature=0)
    assert r.object == "text_completion" and r.id and r.model == model and isinstance(r.created, int)
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0 and c.logprobs is None and c.finish_reason in ("stop", "length")
    assert c.text == cli_generate(trained_dir, prompt, n)
    u = r.usage
    assert u.prompt_tokens == len(tokenizer.encode(prompt)) and 1 <= u.completion_tokens <= n
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert c.finish_reason == "length" or u.completion_tokens < n


def test_concat_cache_serves_the_contract_graph(tmp_path: Path, trained_dir: Path) -> None:
    """--kv-cache concat (model.onnx, what CUDA and TensorRT serve through): greedy text from three
    requests decoded together equals `gptport generate`'s for each prompt alone."""
    prompts, n = ["ka to ri", "men sol", "the and ve qua"], 10
    with serve(trained_dir, tmp_path / "serve.log", "--slots", "3", "--kv-cache", "concat") as s:
        status, body = s.post("/v1/completions", {"prompt": prompts, "max_tokens": n, "temperature": 0})
    assert status == 200, body
    assert "concat cache" in (tmp_path / "serve.log").read_text()
    assert [c["text"] for c in sorted(body["choices"], key=lambda c: c["index"])] == \
        [cli_generate(trained_dir, p, n) for p in prompts]


def test_prompt_forms(server: Served, client: Any, model: str, tokenizer: bpe.BPETokenizer) -> None:
    a, b = "ka to ri", "sol men"

    def greedy(prompt: Any) -> Any:
        return client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0)

    one, two = greedy(a).choices[0].text, greedy(b).choices[0].text
    for prompt in ([a, b], [tokenizer.encode(a), tokenizer.encode(b)]):
        r = greedy(prompt)
        assert [(c.index, c.text) for c in r.choices] == [(0, one), (1, two)]
        assert r.usage.prompt_tokens == len(tokenizer.encode(a)) + len(tokenizer.encode(b))
    r = greedy(tokenizer.encode(a))
    assert [c.text for c in r.choices] == [one] and r.usage.prompt_tokens == len(tokenizer.encode(a))


def test_stream_matches_and_usage_only_when_asked(server: Served, client: Any, model: str) -> None:
    body = {"prompt": "sol men ka", "max_tokens": 20, "temperature": 0}
    status, whole = server.post("/v1/completions", body)
    assert status == 200
    plain = events(server, "/v1/completions", body)
    assert all(c["object"] == "text_completion" and c["id"] == plain[0]["id"] for c in plain[:-1])
    assert all(c.get("usage") is None for c in plain[:-1])
    assert streamed_text(plain) == whole["choices"][0]["text"]
    assert plain[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    asked = events(server, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert asked[-2]["choices"] == [] and asked[-2]["usage"] == whole["usage"]  # the usage chunk, then [DONE]
    assert all(c.get("usage") is None for c in asked[:-2])
    assert streamed_text(asked) == whole["choices"][0]["text"]
    chunks = list(client.completions.create(model=model, stream=True, **body))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole["choices"][0]["text"]


def test_seed_and_n(server: Served, client: Any, model: str) -> None:
    def sampled(seed: int, n: int = 1) -> list[str]:
        r = client.completions.create(model=model, prompt="the", max_tokens=16, temperature=1, seed=seed, n=n)
        assert [c.index for c in r.choices] == list(range(n))
        return [c.text for c in r.choices]

    assert sampled(7) == sampled(7)
    assert sampled(7) != sampled(8)
    three = sampled(11, 3)
    assert len(three) == 3 and len(set(three)) > 1 and sampled(11, 3) == three
    chunks = events(server, "/v1/completions", {"prompt": "the", "max_tokens": 16, "temperature": 1, "seed": 11,
                                                "n": 3})
    assert [streamed_text(chunks, i) for i in range(3)] == three


def test_stop_strings(server: Served, client: Any, model: str) -> None:
    base = {"prompt": "ka sol", "max_tokens": 30, "temperature": 0}

    def text(stop: Any) -> Any:
        return client.completions.create(model=model, stop=stop, extra_body={"ignore_eos": True}, **base)

    full = text(None).choices[0].text
    assert len(full) > 6, full
    stop = full[3:5]  # text the greedy continuation reaches: it stops where that text first appears
    r = text(stop)
    assert r.choices[0].text == full[:full.index(stop)] and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 30
    stops = ["never", full[4:6], full[2:4], "zzz"]
    r = text(stops)
    cut = min(full.index(s) for s in stops if s in full)
    assert r.choices[0].text == full[:cut] and r.choices[0].finish_reason == "stop"
    chunks = events(server, "/v1/completions", {**base, "ignore_eos": True, "stop": stops})
    assert streamed_text(chunks) == full[:cut] and chunks[-2]["choices"][0]["finish_reason"] == "stop"


def test_max_tokens_and_context_length(server: Served, client: Any, model: str, tokenizer: bpe.BPETokenizer) -> None:
    r = client.completions.create(model=model, prompt="ka", max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    prompt = "ka to ri men sol ve"
    p = len(tokenizer.encode(prompt))
    r = client.completions.create(model=model, prompt=prompt, max_tokens=1000, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.prompt_tokens == p
    assert N_CTX - p <= r.usage.completion_tokens <= N_CTX - p + 1
    r = client.completions.create(model=model, prompt=[5] * N_CTX, max_tokens=50, temperature=0)  # a full context
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens <= 1


def test_logprobs(server: Served, client: Any, model: str) -> None:
    for k in range(6):
        r = client.completions.create(model=model, prompt="ka to", max_tokens=8, temperature=0, logprobs=k,
                                      extra_body={"ignore_eos": True})
        c, lp = r.choices[0], r.choices[0].logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens == 8
        assert "".join(lp.tokens) == c.text or any("\ufffd" in t for t in lp.tokens)  # unless a token splits a char
        assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(8)]
        for token, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
            assert chosen <= 0 and math.isfinite(chosen)
            if k == 0:
                assert not top
                continue
            assert len(top) == k or any("\ufffd" in t for t in top), top  # byte tokens may share a text
            assert all(v <= 0 for v in top.values())
            assert token in top and top[token] == pytest.approx(chosen) and chosen == pytest.approx(max(top.values()))
    streamed = events(server, "/v1/completions", {"prompt": "ka to", "max_tokens": 8, "temperature": 0,
                                                  "logprobs": 2, "ignore_eos": True})
    tokens = [t for c in streamed[:-1] for t in c["choices"][0]["logprobs"]["tokens"]]
    offsets = [t for c in streamed[:-1] for t in c["choices"][0]["logprobs"]["text_offset"]]
    assert tokens == lp.tokens[:8] and offsets == lp.text_offset


def test_echo(server: Served, client: Any, model: str) -> None:
    prompt = "ka to ri"
    plain = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0).choices[0].text
    r = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0, echo=True)
    assert r.choices[0].text == prompt + plain
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 1}
    status, whole = server.post("/v1/completions", body)
    assert status == 200 and whole["choices"][0]["text"] == prompt + plain
    lp = whole["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] is None and len(lp["tokens"]) == whole["usage"]["total_tokens"]
    assert lp["text_offset"][0] == 0 and "".join(lp["tokens"]) == prompt + plain
    chunks = events(server, "/v1/completions", body)
    assert streamed_text(chunks) == prompt + plain
    merged = {key: [v for c in chunks[:-1] for v in c["choices"][0]["logprobs"][key]] for key in lp}
    assert merged == lp  # the same tokens, log-probabilities and text offsets as the whole response
    chunks = events(server, "/v1/completions", {**body, "logprobs": None})
    assert streamed_text(chunks) == prompt + plain


def test_sampling_extras(server: Served, client: Any, model: str) -> None:
    def text(**kw: Any) -> str:
        extra = {k: kw.pop(k) for k in ("top_k", "repetition_penalty") if k in kw}
        return client.completions.create(model=model, prompt="ka to", max_tokens=16, extra_body=extra or None,
                                         **kw).choices[0].text

    greedy = text(temperature=0)
    assert text(temperature=1, seed=3, top_k=1) == greedy  # one candidate: the argmax
    assert text(temperature=1, seed=3, top_p=1e-6) == greedy  # the smallest set reaching p: the argmax
    assert text(temperature=1, seed=3) != greedy
    assert text(temperature=0, repetition_penalty=1.0) == greedy
    assert text(temperature=0, repetition_penalty=3.0) != greedy  # the greedy text repeats itself


def test_tiny_temperature_is_greedy(server: Served) -> None:
    """A temperature that overflows the logits when divided by must not break sampling (or other requests)."""
    body = {"prompt": "ka to", "max_tokens": 8, "temperature": 0}
    greedy = server.post("/v1/completions", body)[1]["choices"][0]["text"]
    for t in (1e-6, 1e-300, 5e-324):
        status, r = server.post("/v1/completions", {**body, "temperature": t})
        assert status == 200, r
        assert r["choices"][0]["text"] == greedy


# ---- chat ---------------------------------------------------------------------------------------------------------


def test_chat(server: Served, client: Any, model: str) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ka to ri"}]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
    assert r.object == "chat.completion" and r.model == model and len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant" and isinstance(c.message.content, str)
    assert c.finish_reason in ("stop", "length") and r.usage.total_tokens == r.usage.prompt_tokens + \
        r.usage.completion_tokens
    stream = list(client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert all(s.object == "chat.completion.chunk" for s in stream)
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(s.choices[0].delta.content or "" for s in stream if s.choices) == c.message.content
    assert [s.choices[0].finish_reason for s in stream if s.choices and s.choices[0].finish_reason] == \
        [c.finish_reason]
    assert stream[-1].choices == [] and stream[-1].usage.completion_tokens == r.usage.completion_tokens
    assert_error(*server.post("/v1/chat/completions", {"messages": "ka"}), 400, "messages")
    assert_error(*server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}), 400,
                 "messages")


# ---- UTF-8 --------------------------------------------------------------------------------------------------------


def test_multibyte_text_is_streamed_whole(server: Served, tokenizer: bpe.BPETokenizer) -> None:
    """2-, 3- and 4-byte characters, generated and echoed from token ids that split characters: no chunk
    carries U+FFFD where the tokens make whole characters, and the chunks add up to the whole response."""
    split = tokenizer.encode("kaü kañ quaü")
    assert any("\ufffd" in tokenizer.decode([t]) for t in split)  # these ids split ü and ñ across tokens
    generated = ""
    for prompt, temperature, seed in [("日本 語 🙂", 0, 0), ("straß наш", 0, 0), ("straß наш café", 1, 1),
                                      ("日本 ü", 1, 2), (split, 0, 0), (split, 1, 3)]:
        body = {"prompt": prompt, "max_tokens": 24, "temperature": temperature, "seed": seed, "echo": True}
        texts = [c["choices"][0]["text"] for c in events(server, "/v1/completions", body)[:-1]]
        status, r = server.post("/v1/completions", {**body, "logprobs": 0})
        assert status == 200
        whole, lp = r["choices"][0]["text"], r["choices"][0]["logprobs"]
        assert "".join(texts) == whole
        echoed = prompt if isinstance(prompt, str) else "kaü kañ quaü"
        assert texts[0].startswith(echoed) and whole.startswith(echoed)  # the prompt, whole, comes first
        new = lp["tokens"][r["usage"]["prompt_tokens"]:]
        if not any("\ufffd" in t for t in new):  # whole characters only: U+FFFD would be a broken one
            assert not any("\ufffd" in t for t in texts), texts
            generated += whole[len(echoed):]
    assert any(len(ch.encode()) >= 3 for ch in generated), generated  # the model writes 日本, наш, 🙂


# ---- bad input ----------------------------------------------------------------------------------------------------


def test_invalid_requests(server: Served, model: str, tokenizer: bpe.BPETokenizer) -> None:
    def bad(body: Any, param: str | None, status: int = 400, path: str = "/v1/completions") -> dict[str, Any]:
        return assert_error(*server.post(path, body), status, param)

    assert bad(b"{bad", None)["type"] == "invalid_request_error"
    bad(b"\xff\xfe{", None)
    bad(b"[1, 2]", None)
    for field, wrong in [("max_tokens", "ten"), ("temperature", "hot"), ("stream", "yes"), ("prompt", 5),
                         ("n", 1.5), ("seed", "x"), ("stop", 5), ("logprobs", True), ("echo", 1), ("top_k", "1")]:
        bad({"prompt": "ka", field: wrong}, field)
    bad({"prompt": ["ka", "to"], "n": 3}, "n")  # 6 choices, 4 slots
    bad({"prompt": "ka", "n": 5}, "n")
    bad({"prompt": "ka", "temperature": -0.5}, "temperature")
    bad({"prompt": "ka", "top_p": 0}, "top_p")
    bad({"prompt": "ka", "top_p": 1.5}, "top_p")
    bad({"prompt": "ka", "logprobs": 6}, "logprobs")
    bad({"prompt": "ka", "max_tokens": 0}, "max_tokens")
    bad({"prompt": "ka", "stop": ["a", "b", "c", "d", "e"]}, "stop")
    bad({"prompt": [1, tokenizer.vocab_size]}, "prompt")
    bad({"prompt": [[1, 2], [-1]]}, "prompt")
    for field in ("temperature", "top_p", "repetition_penalty"):  # Python's json reads NaN and Infinity
        bad(f'{{"prompt": "ka", "{field}": NaN}}'.encode(), field)
        bad(f'{{"prompt": "ka", "{field}": Infinity}}'.encode(), field)
        bad(f'{{"prompt": "ka", "{field}": 1{"0" * 400}}}'.encode(), field)  # past float's range
    long = [7] * (N_CTX + 5)
    msg = bad({"prompt": long}, "prompt")["message"]
    assert str(N_CTX + 5) in msg and str(N_CTX) in msg
    msg = bad({"prompt": ["ka", long]}, "prompt")["message"]
    assert str(N_CTX + 5) in msg and str(N_CTX) in msg
    err = bad({"prompt": "ka", "model": "nope"}, "model", 404)
    assert err["code"] == "model_not_found" and "nope" in err["message"]
    bad({"messages": [{"role": "user", "content": "ka"}], "model": "nope"}, "model", 404, "/v1/chat/completions")
    r = httpx.get(server.url + "/v1/completions", timeout=10)
    assert assert_error(r.status_code, r.json(), 405)["type"] == "invalid_request_error"
    status, ok = server.post("/v1/completions", {"prompt": "ka", "model": model, "max_tokens": 2})
    assert status == 200 and ok["model"] == model


def test_openai_client_raises_on_errors(client: Any, model: str) -> None:
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="ka", max_tokens=4, temperature=-1)
    assert e.value.status_code == 400 and e.value.body["param"] == "temperature"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="ka", max_tokens=4)


def test_oversized_body(server: Served) -> None:
    big = json.dumps({"prompt": "ka", "pad": "x" * (1 << 20)}).encode()
    r = httpx.post(server.url + "/v1/completions", content=big, headers={"Content-Type": "application/json"},
                   timeout=30)
    assert_error(r.status_code, r.json(), 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is counted as the body arrives
        yield big[: 1 << 19]
        yield big[1 << 19:]

    r = httpx.post(server.url + "/v1/completions", content=chunks(), headers={"Content-Type": "application/json"},
                   timeout=30)
    assert_error(r.status_code, r.json(), 413)
    assert server.post("/v1/completions", {"prompt": "ka", "max_tokens": 2})[0] == 200


def test_burst_of_malformed_requests(server: Served) -> None:
    """50 malformed requests from 8 threads while long good ones run: each gets its 4xx, every good one
    finishes, the next good one is served, nothing was a 500, no slot stays busy and the process lives."""
    c, chat = "/v1/completions", "/v1/chat/completions"
    kinds: list[tuple[Any, int, str | None, str]] = [  # body, status, param, route
        (b"{bad", 400, None, c), (b"null", 400, None, c), (b"\xff", 400, None, c), ({"prompt": 5}, 400, "prompt", c),
        ({"prompt": "ka", "max_tokens": "ten"}, 400, "max_tokens", c),
        (b'{"prompt": "ka", "temperature": NaN}', 400, "temperature", c),
        (b'{"prompt": "ka", "repetition_penalty": NaN, "temperature": 1}', 400, "repetition_penalty", c),
        ({"prompt": [1, 10**9]}, 400, "prompt", c), ({"prompt": "ka", "n": 99}, 400, "n", c),
        ({"prompt": "ka " * 200}, 400, "prompt", c), ({"messages": [{"role": 3}]}, 400, "messages", chat),
        ({"prompt": "ka", "model": "nope"}, 404, "model", c), ({"prompt": "ka", "stream": 1}, 400, "stream", c),
        ({"prompt": "ka", "repetition_penalty": 1e-300, "temperature": 1}, 400, "repetition_penalty", c),
    ]
    goods: list[Any] = []
    burst_over = threading.Event()

    def good() -> None:  # long good requests, one after another, as long as the burst lasts
        for _ in range(100):
            try:
                goods.append(events(server, "/v1/completions", {"prompt": "ka", **LONG}))
            except Exception as e:  # noqa: BLE001 - reported below
                goods.append(e)
            if burst_over.is_set():
                return

    runner = threading.Thread(target=good)
    runner.start()

    def one(i: int) -> None:
        body, expected, param, path = kinds[i % len(kinds)]
        assert_error(*server.post(path, body), expected, param)

    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(50), timeout=60))  # raises the first failed check
    finally:
        burst_over.set()
        runner.join(60)
    assert goods and not runner.is_alive()
    for chunks in goods:  # none of them failed because of a malformed neighbour
        assert isinstance(chunks, list) and chunks[-2]["choices"][0]["finish_reason"] == "length", chunks
    for _ in range(3):  # bodies cut short by a client that leaves
        raw = Raw(server, "/v1/completions", b'{"prompt": "ka", "max_to', length=500)
        raw.close()
    status, reply = server.post("/v1/completions", {"prompt": "ka to", "max_tokens": 8})
    assert status == 200 and reply["usage"]["completion_tokens"] >= 1
    wait_idle(server)
    assert not sample(metrics(server), "gptport_requests_total", status="500")  # no request was a server error
    assert server.proc.poll() is None


# ---- metrics ------------------------------------------------------------------------------------------------------


def test_metrics(server: Served) -> None:
    before = metrics(server)
    for name in ("gptport_requests_total", "gptport_prompt_tokens_total", "gptport_generation_tokens_total",
                 "gptport_time_to_first_token_seconds_bucket", "gptport_time_per_output_token_seconds_bucket",
                 "gptport_queue_depth", "gptport_slots_busy", "gptport_kv_cache_positions_used"):
        assert sample(before, name) is not None, name
    assert sample(before, "gptport_slots_busy") == 0 and sample(before, "gptport_kv_cache_positions_used") == 0
    ok = sample(before, "gptport_requests_total", route="/v1/completions", status="200") or 0
    refused = sample(before, "gptport_requests_total", route="/v1/completions", status="400") or 0
    status, r = server.post("/v1/completions", {"prompt": "ka to ri men", "max_tokens": 10, "ignore_eos": True})
    assert status == 200
    assert server.post("/v1/completions", {"prompt": 5})[0] == 400
    after = metrics(server)
    u = r["usage"]

    def grew(name: str) -> float:
        return (sample(after, name) or 0) - (sample(before, name) or 0)

    assert grew("gptport_prompt_tokens_total") == u["prompt_tokens"] == 4
    assert grew("gptport_generation_tokens_total") == u["completion_tokens"] == 10
    assert grew("gptport_time_to_first_token_seconds_count") == 1
    assert grew("gptport_time_per_output_token_seconds_count") == u["completion_tokens"] - 1
    assert sample(after, "gptport_requests_total", route="/v1/completions", status="200") == ok + 1
    assert sample(after, "gptport_requests_total", route="/v1/completions", status="400") == refused + 1
    assert sample(after, "gptport_slots_busy") == 0 and sample(after, "gptport_queue_depth") == 0


# ---- API key ------------------------------------------------------------------------------------------------------


def test_api_key(trained_dir: Path, tmp_path: Path) -> None:
    with serve(trained_dir, tmp_path / "serve.log", "--slots", "1", env={"GPTPORT_API_KEY": "k"}) as s:
        assert s.get("/health") == (200, {"status": "ok"})
        for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": "k"}):
            assert assert_error(*s.get("/v1/models", headers), 401)["code"] == "invalid_api_key"
            assert_error(*s.post("/v1/completions", {"prompt": "ka"}, headers), 401)
            assert s.get("/metrics", headers)[0] == 401
        key = {"Authorization": "Bearer k"}
        assert s.get("/v1/models", key)[0] == 200
        assert s.post("/v1/completions", {"prompt": "ka", "max_tokens": 2}, key)[0] == 200
        assert sample(metrics(s, key), "gptport_requests_total", route="/v1/completions", status="401") == 3
        openai = pytest.importorskip("openai")
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0).models.list()
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
        assert good.completions.create(model=trained_dir.name, prompt="ka", max_tokens=2).usage.completion_tokens


# ---- load: queue, disconnects, shutdown -----------------------------------------------------------------------------


def test_queue_full_is_429(trained_dir: Path, tmp_path: Path) -> None:
    """One slot and a queue of one: a long stream holds the slot, a second waits, the third is refused."""
    with serve(trained_dir, tmp_path / "serve.log", "--slots", "1", "--max-queue", "1") as s:
        stream = {"prompt": "ka", "stream": True, **LONG}
        for _ in attempts(10, 30):
            opened: list[Raw] = []
            try:
                for _ in range(2):  # one by one, so that they arrive in this order
                    opened.append(Raw(s, "/v1/completions", stream))
                    assert opened[-1].head()[0] == 200
                third = Raw(s, "/v1/completions", {"prompt": "ka", "max_tokens": 2})
                opened.append(third)
                status, headers = third.head()
                body = third.json(headers) if status == 429 else None
            finally:
                for r in opened:
                    r.close()
            wait_idle(s)
            if status == 429:
                break
        else:
            pytest.fail("no request was refused with 429 while the slot and the queue were full")
        assert int(headers["retry-after"]) >= 1
        err = assert_error(429, body, 429)
        assert err["type"] == "rate_limit_error" and err["code"] == "queue_full"
        assert s.post("/v1/completions", {"prompt": "ka", "max_tokens": 2})[0] == 200  # accepted again


@pytest.fixture(scope="module")
def one_slot(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server with one slot and room to queue: a test leaves it idle (wait_idle) for the next."""
    with serve(trained_dir, tmp_path_factory.mktemp("one_slot") / "serve.log", "--slots", "1", "--max-queue", "64"
               ) as s:
        yield s


def _tokens_decoded(server: Served) -> float:
    """Tokens decoded after a choice's first, cancelled choices' too: the per-token latency histogram's count."""
    return value(server, "gptport_time_per_output_token_seconds_count")


def _left_early(server: Served, leave: Callable[[], None], full: float) -> bool:
    """Run `leave` (a client that goes away mid-request), then check the slot is free within 2 s, a new request
    is served at once, and fewer than `full` tokens were decoded meanwhile (the request was cut short)."""
    before = _tokens_decoded(server)
    leave()
    wait_idle(server, 2.0)
    spent = _tokens_decoded(server) - before
    t0 = time.monotonic()
    status, r = server.post("/v1/completions", {"prompt": "ka", "max_tokens": 4})
    assert status == 200 and r["usage"]["completion_tokens"] >= 1 and time.monotonic() - t0 < 2.0
    return spent < full


def test_stream_disconnect_frees_the_slot(one_slot: Served) -> None:
    def leave() -> None:
        raw = Raw(one_slot, "/v1/completions", {"prompt": "ka", "stream": True, **LONG})
        assert raw.head()[0] == 200
        raw.until(b"data: ", 2)  # a couple of chunks
        raw.close()

    assert any(_left_early(one_slot, leave, N_CTX - 1) for _ in attempts(5, 30)), \
        "a stream whose client left ran to n_ctx every time"


def test_non_streamed_client_timeout_frees_the_slot(one_slot: Served) -> None:
    def leave() -> None:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(one_slot.url + "/v1/completions", json={"prompt": "ka", **LONG},
                       timeout=httpx.Timeout(10, read=0.01))

    assert any(_left_early(one_slot, leave, N_CTX - 1) for _ in attempts(5, 30)), \
        "a request whose client timed out ran to n_ctx every time"


def test_queued_requests_of_departed_clients_are_dropped(one_slot: Served) -> None:
    """30 long requests (streamed and not) queue behind one slot; their clients leave: the queue empties at once."""
    k = 30
    before = _tokens_decoded(one_slot)
    raws = []
    for i in range(k):
        raws.append(Raw(one_slot, "/v1/completions", {"prompt": "ka", "stream": i % 2 == 0, **LONG}))
        if i % 2 == 0:
            assert raws[-1].head()[0] == 200  # a stream's head comes once its choices are queued
    deadline = time.monotonic() + 5
    while value(one_slot, "gptport_queue_depth") < k // 3:  # the non-streamed ones are queued too
        assert time.monotonic() < deadline, "the requests were not queued"
        time.sleep(0.01)
    for r in raws:
        r.close()
    wait_idle(one_slot, 2.0)
    assert _tokens_decoded(one_slot) - before < k * (N_CTX - 1) / 2


def test_sigterm_finishes_running_requests(trained_dir: Path, tmp_path: Path) -> None:
    """SIGTERM with streams running and queued: they all end normally with [DONE], new connections are
    refused meanwhile, and the process exits 0."""
    with serve(trained_dir, tmp_path / "serve.log", "--slots", "1") as s:
        k = 6
        results: list[Any] = [None] * k
        submitted = threading.Semaphore(0)
        first = threading.Event()

        def consume(i: int) -> None:
            out: list[Any] = []
            try:
                with httpx.stream("POST", s.url + "/v1/completions", json={"prompt": "ka", "stream": True, **LONG},
                                  timeout=30) as r:
                    submitted.release()
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            first.set()
                            out.append(line[6:])
                results[i] = out
            except Exception as e:  # noqa: BLE001 - reported below
                results[i] = e
            finally:
                submitted.release()
                first.set()

        threads = [threading.Thread(target=consume, args=(i,)) for i in range(k)]
        for t in threads:
            t.start()
        for _ in range(k):
            assert submitted.acquire(timeout=30)
        assert first.wait(30)
        s.proc.send_signal(signal.SIGTERM)
        port = urlsplit(s.url).port
        deadline, refused, alive = time.monotonic() + 5, False, False
        while not refused and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                time.sleep(0.01)
            except ConnectionRefusedError:
                refused, alive = True, s.proc.poll() is None
        assert refused, "the server still accepted connections 5 s after SIGTERM"
        assert alive, "the server had exited (not drained) when it refused connections"
        for t in threads:
            t.join(30)
        for out in results:
            assert isinstance(out, list) and out[-1] == "[DONE]", out
            assert json.loads(out[-2])["choices"][0]["finish_reason"] == "length"
            assert sum(len(json.loads(o)["choices"][0]["text"]) for o in out[:-1]) > 0
        assert s.proc.wait(timeout=30) == 0, f"exit status {s.proc.returncode}: {s.log.read_text()}"
