"""Black-box tests of `gptport serve`'s OpenAI-compatible API: a real server process per module, driven
over HTTP with the `openai` client, httpx and raw sockets; the shapes and what the fields do."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai  # a dev dependency: its absence is a failure, not a skip
import pytest

from gptport import tokenizer as bpe
from tests.support.serving import (
    N_CTX,
    Served,
    assert_error,
    cli_generate,
    events,
    sample,
    serve,
    streamed_text,
)


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


def test_every_response_names_the_replica(server: Served) -> None:
    """x-gptport-replica (hostname:pid of the serving process) on answers, streams, errors and /metrics; /metrics
    counts requests under that name."""
    import socket

    name = f"{socket.gethostname()}:{server.proc.pid}"
    url = server.url
    for r in (httpx.get(url + "/health"), httpx.get(url + "/v1/models"), httpx.get(url + "/nowhere"),
              httpx.post(url + "/v1/completions", json={"prompt": "ka", "max_tokens": 2}),
              httpx.post(url + "/v1/completions", json={"prompt": "ka", "max_tokens": -1}),
              httpx.get(url + "/metrics")):
        assert r.headers.get("x-gptport-replica") == name, (r.request.url, r.status_code, dict(r.headers))
    with httpx.stream("POST", url + "/v1/completions", json={"prompt": "ka", "max_tokens": 2, "stream": True}) as r:
        assert r.status_code == 200 and r.headers.get("x-gptport-replica") == name
        r.read()
    text = httpx.get(url + "/metrics").text
    assert sample(text, "gptport_requests_total", route="/v1/completions", status="400", replica=name)
    assert not sample(text, "gptport_requests_total", replica="someone else")


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
    assert "prefix cache off (static-cache graphs only)" in (tmp_path / "serve.log").read_text()
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
        extra = {k: kw.pop(k) for k in ("top_k", "repetition_penalty", "min_p") if k in kw}
        return client.completions.create(model=model, prompt="ka to", max_tokens=16, extra_body=extra or None,
                                         **kw).choices[0].text

    greedy = text(temperature=0)
    assert text(temperature=1, seed=3, top_k=1) == greedy  # one candidate: the argmax
    assert text(temperature=1, seed=3, top_p=1e-6) == greedy  # the smallest set reaching p: the argmax
    assert text(temperature=1, seed=3) != greedy
    assert text(temperature=0, repetition_penalty=1.0) == greedy
    assert text(temperature=0, repetition_penalty=3.0) != greedy  # the greedy text repeats itself
    # OpenAI's penalties, over the generated tokens: the greedy text's repeats are penalized
    assert text(temperature=0, presence_penalty=0, frequency_penalty=0) == greedy
    assert text(temperature=0, presence_penalty=2) != greedy
    assert text(temperature=0, frequency_penalty=2) != greedy
    assert text(temperature=1, seed=3, min_p=1) == greedy  # only the likeliest token is as likely as itself
    assert text(temperature=1, seed=3, min_p=0.2, presence_penalty=1) == text(temperature=1, seed=3, min_p=0.2,
                                                                            presence_penalty=1)  # seeded


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
                 "messages[0].content")


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
    bad({"prompt": "ka", "logprobs": 21}, "logprobs")
    bad({"prompt": "ka", "max_tokens": 0}, "max_tokens")
    bad({"prompt": "ka", "stop": [f"s{i}" for i in range(257)]}, "stop")
    bad({"prompt": "ka", "stop": ["x" * 8192, "é" * 4097]}, "stop")  # 16,386 bytes together
    bad({"prompt": [1, tokenizer.vocab_size]}, "prompt")
    bad({"prompt": [[1, 2], [-1]]}, "prompt")
    for field, wrong in [("presence_penalty", 2.5), ("presence_penalty", -2.01), ("frequency_penalty", 3),
                         ("frequency_penalty", -100), ("min_p", 1.5), ("min_p", -0.1)]:  # OpenAI's [-2, 2]; [0, 1]
        assert field in bad({"prompt": "ka", field: wrong}, field)["message"]
        bad({"messages": [{"role": "user", "content": "ka"}], field: wrong}, field, path="/v1/chat/completions")
    for field in ("temperature", "top_p", "repetition_penalty", "presence_penalty", "min_p"):  # NaN, Infinity
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
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="ka", max_tokens=4, temperature=-1)
    assert e.value.status_code == 400 and e.value.body["param"] == "temperature"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="ka", max_tokens=4)
