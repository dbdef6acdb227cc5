"""Everything downstream of the export runs an imported Llama-family model, through a real `gptport serve`:
structured outputs and tool calls rendered through its own chat template, prefix caching (the second request
reuses the first one's prompt and answers the same), speculative decoding with a draft of the same tokenizer
(greedy tokens unchanged), `gptport bench` on its graphs and `gptport bench-serve` against the server. The
greedy reference is transformers' own `generate` on the same weights."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import gptport
from tests.support.hf_models import HfModel, build, greedy
from tests.support.serving import Served, serve, value

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

COLOR = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
         "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "paint", "description": "Paint a wall.", "parameters": COLOR}}
MAX_TOKENS = 24


def imported(root: Path, seed_prompt: str = "ka to ri men") -> tuple[HfModel, Path]:
    """A tiny random Llama (grouped-query, byte-level tokenizer with a begin token), imported and exported."""
    hf = build("llama", "byte-level", root / "hf", root.parent / "tok", root.parent / "corpus.txt", prompt=seed_prompt)
    out = root / "m"
    for args in (("import-hf", str(hf.path), "--out", str(out)), ("export", str(out))):
        r = gptport(*args)
        assert r.returncode == 0, r.stderr
    return hf, out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path,
           corpus_file: Path) -> tuple[HfModel, Path, Path]:
    """The served model and a draft of other weights with the same tokenizer."""
    root = tmp_path_factory.mktemp("llama_paths")
    (root / "tok").symlink_to(tokenizer_dir)
    (root / "corpus.txt").symlink_to(corpus_file)
    (root / "target").mkdir()
    (root / "draft").mkdir()
    hf, target = imported(root / "target")
    _, draft = imported(root / "draft", seed_prompt="sol men ri")
    return hf, target, draft


@pytest.fixture(scope="module")
def server(models: tuple[HfModel, Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    _, target, _ = models
    with serve(target, tmp_path_factory.mktemp("serve") / "serve.log", "--slots", "2") as s:
        yield s


def _chat(server: Served, **extra: Any) -> dict[str, Any]:
    body = {"model": "m", "messages": [{"role": "user", "content": "Which color?"}], "max_tokens": 64,
            "temperature": 0, **extra}
    status, reply = server.post("/v1/chat/completions", body)
    assert status == 200, reply
    return reply


def test_structured_output_and_a_tool_call_on_the_imported_template(server: Served) -> None:
    reply = _chat(server, response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": COLOR}})
    assert json.loads(reply["choices"][0]["message"]["content"])["color"] in {"red", "green", "blue"}
    reply = _chat(server, tools=[TOOL], tool_choice="required")
    call = reply["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "paint" and json.loads(call["arguments"])["color"] in {"red", "green", "blue"}
    # a random model may pad the call's closing markup with blanks until max_tokens or the context's end (the
    # model's n_ctx is 64): the call is whole either way
    finish, usage = reply["choices"][0]["finish_reason"], reply["usage"]
    assert finish == "tool_calls" or (finish == "length" and (usage["completion_tokens"] == 64
                                                              or usage["total_tokens"] >= 64)), reply


def test_prefix_caching_reuses_a_prompt_and_answers_the_same(models: tuple[HfModel, Path, Path],
                                                             server: Served) -> None:
    hf = models[0]
    text = " ".join(["ka to ri men sol"] * 6)
    prompt = hf.tokenizer(text)["input_ids"]
    want = hf.tokenizer.decode(greedy(hf.model, prompt, 8))
    before = value(server, "gptport_prompt_tokens_cached_total")
    body = {"model": "m", "prompt": text, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    answers = [server.post("/v1/completions", body) for _ in range(2)]
    assert [a[0] for a in answers] == [200, 200]
    assert [a[1]["choices"][0]["text"] for a in answers] == [want, want]
    assert value(server, "gptport_prompt_tokens_cached_total") - before >= len(prompt) // 2


def test_speculative_decoding_with_a_draft_of_the_same_tokenizer_keeps_greedy_tokens(
        models: tuple[HfModel, Path, Path], tmp_path: Path) -> None:
    hf, target, draft = models
    prompt = hf.tokenizer(hf.prompt)["input_ids"]
    want = greedy(hf.model, prompt, MAX_TOKENS)
    with serve(target, tmp_path / "serve.log", "--slots", "1", "--draft", str(draft)) as s:
        status, reply = s.post("/v1/completions", {"model": "m", "prompt": hf.prompt, "max_tokens": MAX_TOKENS,
                                                   "temperature": 0})
        assert status == 200, reply
        assert reply["choices"][0]["text"] == hf.tokenizer.decode(want[:-1] if want[-1] == hf.stop_id else want)
        assert value(s, "gptport_draft_tokens_total") > 0


def test_bench_and_bench_serve_run_the_model(models: tuple[HfModel, Path, Path], server: Served,
                                             tmp_path: Path) -> None:
    _, target, _ = models
    r = gptport("bench", str(target), "--prompt-len", "8", "--gen-len", "8", "--repeat", "1", "--warmup", "0",
                "--no-torch-baseline", "--json", str(tmp_path / "bench.json"))
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert rows and all(row["decode_tok_s"] > 0 for row in rows)
    r = gptport("bench-serve", server.url, "--concurrency", "2", "--num-prompts", "4", "--prompt-len", "8",
                "--max-tokens", "8", "--json", str(tmp_path / "serve.json"))
    assert r.returncode == 0, r.stderr
    results = json.loads((tmp_path / "serve.json").read_text())["results"]
    assert results[0]["completed"] == 4 and results[0]["failed"] == 0
