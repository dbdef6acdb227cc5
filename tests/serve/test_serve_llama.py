"""`gptport serve` of imported Llama-family models, through a real server: a chat is rendered with the model's
own template (chat_template.jinja, as transformers >= 4.43 saves it, or tokenizer_config.json's chat_template,
as older ones did) and answered with transformers' greedy tokens for that prompt, ending on an end token of
generation_config.json that is not the tokenizer's eos (finish_reason stop, streamed or not); a completion's
text prompt starts with the begin token where the tokenizer adds one, as transformers encodes it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import gptport
from tests.support.hf_models import HfModel, build, greedy, to_tokenizer_config
from tests.support.serving import Served, events, serve

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "ka to ri men sol?"}]
MAX_TOKENS = 24


def chat_ids(fast: Any) -> list[int]:
    """The chat's prompt ids as transformers makes them: the template rendered, encoded without special tokens."""
    text = fast.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    return list(fast(text, add_special_tokens=False)["input_ids"])


def imported(root: Path, arch: str, kind: str, tokenizer_dir: Path, corpus: Path, **kw: Any) -> tuple[HfModel, Path]:
    hf = build(arch, kind, root / "hf", tokenizer_dir, corpus, **kw)
    out = root / "m"
    for args in (("import-hf", str(hf.path), "--out", str(out)), ("export", str(out))):
        r = gptport(*args)
        assert r.returncode == 0, r.stderr
    return hf, out


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> tuple[HfModel, Path]:
    """A ChatML model (Qwen2) whose greedy reply to MESSAGES reaches generation_config.json's extra end token."""
    return imported(tmp_path_factory.mktemp("qwen2"), "qwen2", "chatml", tokenizer_dir, corpus_file,
                    prompt_ids=chat_ids)


@pytest.fixture(scope="module", params=["chat_template.jinja", "tokenizer_config.json"])
def chat_server(request: pytest.FixtureRequest, qwen2: tuple[HfModel, Path],
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HfModel, Served]]:
    hf, out = qwen2
    model_dir = out
    if request.param == "tokenizer_config.json":
        model_dir = tmp_path_factory.mktemp("old_layout") / "m"
        shutil.copytree(out, model_dir)
        to_tokenizer_config(model_dir)
    assert (model_dir / "chat_template.jinja").is_file() == (request.param == "chat_template.jinja")
    with serve(model_dir, tmp_path_factory.mktemp("serve") / "serve.log", "--slots", "2") as s:
        yield hf, s


def test_a_chat_uses_the_imported_template_and_stops_on_any_end_token(chat_server: tuple[HfModel, Served]) -> None:
    hf, server = chat_server
    prompt = chat_ids(hf.tokenizer)
    want = greedy(hf.model, prompt, MAX_TOKENS)
    assert want[-1] == hf.stop_id != hf.tokenizer.eos_token_id  # ends on generation_config.json's own end token
    body = {"model": "m", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0}
    status, reply = server.post("/v1/chat/completions", body)
    assert status == 200, reply
    choice = reply["choices"][0]
    assert choice["message"]["content"] == hf.tokenizer.decode(want[:-1])
    assert choice["finish_reason"] == "stop"
    assert reply["usage"]["prompt_tokens"] == len(prompt) and reply["usage"]["completion_tokens"] == len(want)
    chunks = [c for c in events(server, "/v1/chat/completions", {**body, "stream": True}) if c != "[DONE]"]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    assert streamed == choice["message"]["content"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    status, tokens = server.post("/tokenize", {"model": "m", "messages": MESSAGES})
    assert status == 200 and tokens["tokens"] == prompt  # the template rendered as transformers renders it
    status, info = server.get("/tokenizer_info")  # vLLM's: the template clients render with
    assert status == 200 and info["chat_template"] == hf.tokenizer.chat_template and info["eos_token"] == "<|im_end|>"


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path,
          corpus_file: Path) -> Iterator[tuple[HfModel, Served]]:
    """A Llama model whose byte-level tokenizer puts <|begin_of_text|> first."""
    root = tmp_path_factory.mktemp("llama")
    hf, out = imported(root, "llama", "byte-level", tokenizer_dir, corpus_file)
    with serve(out, root / "serve.log", "--slots", "2") as s:
        yield hf, s


def test_a_completion_prompt_starts_with_the_begin_token(llama: tuple[HfModel, Served]) -> None:
    hf, server = llama
    prompt = hf.tokenizer(hf.prompt)["input_ids"]
    assert prompt[0] == hf.tokenizer.bos_token_id
    want = greedy(hf.model, prompt, MAX_TOKENS)
    assert want[-1] == hf.stop_id
    status, reply = server.post("/v1/completions", {"model": "m", "prompt": hf.prompt, "max_tokens": MAX_TOKENS,
                                                    "temperature": 0})
    assert status == 200, reply
    assert reply["usage"]["prompt_tokens"] == len(prompt)
    assert reply["choices"][0]["text"] == hf.tokenizer.decode(want[:-1])
    assert reply["choices"][0]["finish_reason"] == "stop"
    # token ids are taken as given: no begin token added to them
    status, reply = server.post("/v1/completions", {"model": "m", "prompt": prompt[1:], "max_tokens": 1})
    assert status == 200 and reply["usage"]["prompt_tokens"] == len(prompt) - 1
    # /tokenize: a text as a completion encodes it, unless special tokens are turned off (vLLM's and llama-server's)
    assert server.post("/tokenize", {"model": "m", "prompt": hf.prompt}) == (200, {**_tokens(prompt)})
    for off in ({"add_special_tokens": False}, {"add_special": False}):
        assert server.post("/tokenize", {"model": "m", "content": hf.prompt, **off}) == (200, _tokens(prompt[1:]))


def _tokens(ids: list[int]) -> dict[str, Any]:
    return {"tokens": ids, "count": len(ids), "max_model_len": 64}
