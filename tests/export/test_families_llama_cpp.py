"""llama.cpp's own run of gptport's GGUF files of the families after Gemma 3, where GPTPORT_LLAMA_CPP_BIN names a
folder with its llama-server: each family's tiny random model (tests/export/test_gguf_families.py's makers;
Gemma 2 with its soft-caps and window of 8, Granite with its four multipliers and biases, OLMo 2 with its
post-norms and wide q/k norms; Phi-3 with partial rotary and LongRoPE and SmolLM3 with layers without rope where
the file says so) imported and written by `gptport export-gguf` (f32); llama-server's greedy tokens from a prompt
past the window equal transformers' and `gptport generate`'s (torch engine). llama-server runs with a float32 KV
cache and flash attention off: with its defaults (f16 cache) Gemma 2's tokens part at the 7th step, a near tie
(transformers' top two logits 47.52 and 47.41; llama.cpp's f32 run gives a gap of 0.103, its default run -0.013)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptport import tokenizer as bpe
from gptport.training.checkpoint import load_model
from tests.export.test_gemma3_export import PROMPT
from tests.export.test_gemma3_llama_cpp import _post, llama_server
from tests.export.test_gguf_families import MAKERS
from tests.export.test_hf_llama import hf_tokenizer_dir  # noqa: F401
from tests.support import family_checks as fc
from tests.support import server_proc
from tests.support.cli import gptport

pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

NEW = 24


@pytest.mark.parametrize("family", sorted(MAKERS))
def test_llama_cpp_greedy_tokens_equal_transformers_and_gptport(family: str, tmp_path: Path,
                                                                hf_tokenizer_dir: Path) -> None:  # noqa: F811
    server = llama_server()  # skip before building when llama.cpp is not there
    hf_dir = MAKERS[family](tmp_path / "hf", hf_tokenizer_dir)
    model_dir = tmp_path / "m"
    for args in (("import-hf", str(hf_dir), "--out", str(model_dir)), ("export-gguf", str(model_dir))):
        r = gptport(*args)
        assert r.returncode == 0, r.stderr
    tok = bpe.load(model_dir)
    cfg = load_model(model_dir, tok)[1].model
    prompt = ([cfg.bos_id] if cfg.add_bos and cfg.bos_id is not None else []) + tok.encode(PROMPT)
    want = fc.hf_greedy(fc.hf_model(hf_dir), prompt, NEW)
    assert len(set(want)) > 3  # greedy text that does not repeat one token
    r = gptport("generate", str(model_dir), PROMPT, "--engine", "torch", "--max-new-tokens", str(NEW), "--json")
    assert r.returncode == 0, r.stderr
    ours = json.loads(r.stdout)["token_ids"]
    assert ours == want[:len(ours)] and (len(ours) == NEW or want[len(ours)] in cfg.eos_ids)
    port, log = server_proc.free_port(), model_dir / "llama-server.log"
    cmd = [str(server), "-m", str(model_dir / "model.f32.gguf"), "--host", "127.0.0.1", "--port", str(port),
           "-np", "1", "-t", "2", "-ctk", "f32", "-ctv", "f32", "-fa", "off"]
    with server_proc.running(cmd, server_proc.url_of(port), log, limit=60, stop_timeout=10):
        got = _post(port, "/completion", {"prompt": prompt, "n_predict": NEW, "temperature": 0, "top_k": 1,
                                          "ignore_eos": True, "return_tokens": True, "cache_prompt": False})
    assert got["tokens"] == want, log.read_text()[-2000:]
