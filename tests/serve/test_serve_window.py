"""`gptport serve` past a sliding window, through a real server: a tiny random Gemma 3 (window 8, sliding and
full layers mixed, an untied head; tests/export/test_gemma3_export.py builds and exports it) served on each KV
cache with two slots and prefills cut into chunks of 4. Two prompts in one request (decoded together, rows of
different lengths), whose prompt and completion run past the window, get transformers' greedy tokens, each of
them; a second request sharing a prompt (its prefix cached) gets them again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gptport import tokenizer as bpe
from tests.export.test_gemma3_export import exported  # noqa: F401
from tests.export.test_gemma3_hf import WINDOW, hf_model
from tests.export.test_hf_llama import hf_tokenizer_dir  # noqa: F401
from tests.support.serving import Served, serve

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

PROMPTS = [[5, 17, 200, 3, 9, 11, 40, 41, 42, 43, 44], [9, 30, 31]]  # past the window already; one short
NEW = 20  # both past the window by the end


def _greedy(hf: Any, ids: list[int], n: int) -> list[int]:
    """transformers' greedy tokens, end tokens included (the server is told to ignore them)."""
    t = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            t = torch.cat([t, hf(t).logits[:, -1:].argmax(-1)], dim=1)
    return t[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def wanted(exported: tuple[Path, Path]) -> list[list[int]]:  # noqa: F811
    hf = hf_model(exported[0])
    return [_greedy(hf, p, NEW) for p in PROMPTS]


@pytest.fixture(scope="module", params=["static", "concat"])
def server(request: pytest.FixtureRequest, exported: tuple[Path, Path],  # noqa: F811
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    log = tmp_path_factory.mktemp(f"serve_window_{request.param}") / "serve.log"
    with serve(exported[1], log, "--kv-cache", request.param, "--slots", "2", "--prefill-chunk", "4") as s:
        yield s


def _tokens(server: Served, prompt: list[Any]) -> list[list[str]]:
    """Each choice's tokens, as the completions API's logprobs name them, in the order of the prompts."""
    body = {"model": "m", "prompt": prompt, "max_tokens": NEW, "temperature": 0, "ignore_eos": True, "logprobs": 0}
    status, reply = server.post("/v1/completions", body)
    assert status == 200, reply
    choices = sorted(reply["choices"], key=lambda c: c["index"])
    assert [c["finish_reason"] for c in choices] == ["length"] * len(choices)
    return [c["logprobs"]["tokens"] for c in choices]


def test_two_rows_decoded_together_past_the_window_get_transformers_tokens(
        server: Served, exported: tuple[Path, Path], wanted: list[list[int]]) -> None:  # noqa: F811
    tok = bpe.load(exported[1])
    assert all(len(p) + NEW > 2 * WINDOW for p in PROMPTS) and len(set(wanted[0])) > NEW // 2
    want = [[tok.decode([t]) for t in row] for row in wanted]
    assert _tokens(server, PROMPTS) == want  # one request, two prompts: the rows of one batch
    assert _tokens(server, PROMPTS[0]) == want[:1]  # its prompt's cache kept (a prefix hit on static): the same
