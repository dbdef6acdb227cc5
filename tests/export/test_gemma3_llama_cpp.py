"""llama.cpp's own run of gptport's Gemma 3 GGUF, where GPTPORT_LLAMA_CPP_BIN names a folder with its
llama-server: a tiny random Gemma 3 (window 8, sliding and full layers mixed, local RoPE base, an untied head so
greedy text does not repeat one token) imported and written by `gptport export-gguf` (f32); llama-server's
greedy tokens from a prompt past the window, continued past it again, equal transformers' and `gptport
generate`'s. Mistral's and Qwen2's windows are refused by export-gguf (tests/export/test_windows_hf.py)."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gptport import tokenizer as bpe
from gptport.training.checkpoint import load_model
from tests.export.test_gemma3_export import PROMPT, _greedy
from tests.export.test_gemma3_hf import WINDOW, hf_model, make_gemma3
from tests.export.test_hf_llama import _vocab, hf_tokenizer_dir  # noqa: F401
from tests.support import server_proc
from tests.support.cli import gptport

pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

LLAMA_ENV = "GPTPORT_LLAMA_CPP_BIN"
NEW = 24


def llama_server() -> Path:
    folder = os.environ.get(LLAMA_ENV)
    if not folder:
        pytest.skip(f"set {LLAMA_ENV} to a folder with llama.cpp's llama-server to run this")
    binary = Path(folder) / "llama-server"
    assert binary.is_file(), f"{LLAMA_ENV}={folder}: no llama-server there"
    return binary


def _post(port: int, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory, hf_tokenizer_dir: Path) -> tuple[Path, Path]:  # noqa: F811
    """(the transformers directory, gptport's import of it with model.f32.gguf written)."""
    llama_server()  # skip before building when llama.cpp is not there
    root = tmp_path_factory.mktemp("gemma3_llama_cpp")
    hf_dir = make_gemma3(root / "hf", hf_tokenizer_dir, _vocab(hf_tokenizer_dir), tie_word_embeddings=False,
                         query_pre_attn_scalar=16)  # head_dim: the softmax scale llama.cpp derives
    for args in (("import-hf", str(hf_dir), "--out", str(root / "m")), ("export-gguf", str(root / "m"))):
        r = gptport(*args)
        assert r.returncode == 0, r.stderr
    return hf_dir, root / "m"


def test_llama_cpp_greedy_past_the_window_equals_transformers_and_gptport(written: tuple[Path, Path]) -> None:
    hf_dir, model_dir = written
    tok = bpe.load(model_dir)
    cfg = load_model(model_dir, tok)[1].model
    prompt = [cfg.bos_id, *tok.encode(PROMPT)]
    assert len(prompt) > WINDOW
    want = _greedy(hf_model(hf_dir), prompt, NEW)
    assert len(set(want)) > NEW // 2  # greedy text that does not repeat one token
    r = gptport("generate", str(model_dir), PROMPT, "--engine", "torch", "--max-new-tokens", str(NEW), "--json")
    assert r.returncode == 0, r.stderr
    ours = json.loads(r.stdout)["token_ids"]
    assert ours == want[:len(ours)] and (len(ours) == NEW or want[len(ours)] in cfg.eos_ids)
    path = model_dir / "model.f32.gguf"
    port, log = server_proc.free_port(), model_dir / "llama-server.log"
    cmd = [str(llama_server()), "-m", str(path), "--host", "127.0.0.1", "--port", str(port), "-np", "1", "-t", "2"]
    with server_proc.running(cmd, server_proc.url_of(port), log, limit=60, stop_timeout=10):
        got = _post(port, "/completion", {"prompt": prompt, "n_predict": NEW, "temperature": 0, "top_k": 1,
                                          "ignore_eos": True, "return_tokens": True, "cache_prompt": False})
    assert got["tokens"] == want, log.read_text()[-2000:]
