"""llama.cpp's own run of gptport's GGUF files of the families after Gemma 3, where GPTPORT_LLAMA_CPP_BIN names a
folder with its llama-server: each family's tiny random model (tests/export/test_gguf_families.py's makers;
Gemma 2 with its soft-caps and window of 8, Granite with its four multipliers and biases, OLMo 2 with its
post-norms and wide q/k norms; Phi-3 with partial rotary and LongRoPE, SmolLM3 with every 4th layer without
rope: test_gguf_phi3_smollm3.py's) imported and written by `gptport export-gguf` (f32); llama-server's greedy
tokens from a prompt past the window equal transformers' and `gptport generate`'s (torch engine), Phi-3's with a
context of at most its original one; above it llama.cpp takes LongRoPE's long factors at every position.
llama-server runs with a float32 KV cache and flash attention off: with its defaults (f16 cache) Gemma 2's
tokens part at the 7th step, a near tie (transformers' top two logits 47.52 and 47.41; llama.cpp's f32 run gives
a gap of 0.103, its default run -0.013)."""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path

import pytest

from gptport import tokenizer as bpe
from gptport.training.checkpoint import load_model
from tests.export.test_gemma3_export import PROMPT
from tests.export.test_gemma3_llama_cpp import _post, llama_server
from tests.export.test_gguf_families import MAKERS
from tests.export.test_gguf_phi3_smollm3 import ORIGINAL, make_model
from tests.export.test_hf_llama import hf_tokenizer_dir  # noqa: F401
from tests.support import family_checks as fc
from tests.support import server_proc
from tests.support.cli import gptport

pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

NEW = 24


def _built(family: str, root: Path, tokenizer: Path) -> tuple[Path, Path, list[int]]:
    """(the transformers directory, gptport's import of it with model.f32.gguf written, the prompt's ids)."""
    hf_dir = (MAKERS[family] if family in MAKERS else partial(make_model, family))(root / "hf", tokenizer)
    model_dir = root / "m"
    for args in (("import-hf", str(hf_dir), "--out", str(model_dir)), ("export-gguf", str(model_dir))):
        r = gptport(*args)
        assert r.returncode == 0, r.stderr
    tok = bpe.load(model_dir)
    cfg = load_model(model_dir, tok)[1].model
    return hf_dir, model_dir, ([cfg.bos_id] if cfg.add_bos and cfg.bos_id is not None else []) + tok.encode(PROMPT)


def _llama_cpp(server: Path, model_dir: Path, prompt: list[int], *extra: str) -> list[int]:
    """llama-server's greedy tokens (float32 KV cache, flash attention off)."""
    port, log = server_proc.free_port(), model_dir / "llama-server.log"
    cmd = [str(server), "-m", str(model_dir / "model.f32.gguf"), "--host", "127.0.0.1", "--port", str(port),
           "-np", "1", "-t", "2", "-ctk", "f32", "-ctv", "f32", "-fa", "off", *extra]
    with server_proc.running(cmd, server_proc.url_of(port), log, limit=60, stop_timeout=10):
        got = _post(port, "/completion", {"prompt": prompt, "n_predict": NEW, "temperature": 0, "top_k": 1,
                                          "ignore_eos": True, "return_tokens": True, "cache_prompt": False})
    return list(got["tokens"])


@pytest.mark.parametrize("family", [*sorted(MAKERS), "phi3", "smollm3"])
def test_llama_cpp_greedy_tokens_equal_transformers_and_gptport(family: str, tmp_path: Path,
                                                                hf_tokenizer_dir: Path) -> None:  # noqa: F811
    server = llama_server()  # skip before building when llama.cpp is not there
    hf_dir, model_dir, prompt = _built(family, tmp_path, hf_tokenizer_dir)
    cfg = load_model(model_dir, bpe.load(model_dir))[1].model
    want = fc.hf_greedy(fc.hf_model(hf_dir), prompt, NEW)
    assert len(set(want)) > 3  # greedy text that does not repeat one token
    r = gptport("generate", str(model_dir), PROMPT, "--engine", "torch", "--max-new-tokens", str(NEW), "--json")
    assert r.returncode == 0, r.stderr
    ours = json.loads(r.stdout)["token_ids"]
    assert ours == want[:len(ours)] and (len(ours) == NEW or want[len(ours)] in cfg.eos_ids)
    context = ("-c", str(ORIGINAL)) if family == "phi3" else ()  # LongRoPE's short factors, as gptport's here
    assert _llama_cpp(server, model_dir, prompt, *context) == want, (model_dir / "llama-server.log").read_text()[-2000:]


def test_llama_cpps_longrope_past_the_original_context_takes_the_long_factors_everywhere(
        tmp_path: Path, hf_tokenizer_dir: Path) -> None:  # noqa: F811
    """With -c above the original context llama.cpp's phi3 rotates every position by the long factors: its
    tokens are those of the same model with the short factors replaced by the long ones, not gptport's (whose
    sequence here stays within the original context: export-gguf's note)."""
    server = llama_server()
    hf_dir, model_dir, prompt = _built("phi3", tmp_path, hf_tokenizer_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    rope = config.get("rope_parameters") or config["rope_scaling"]
    rope["short_factor"] = rope["long_factor"]
    long_dir = tmp_path / "long"
    shutil.copytree(hf_dir, long_dir)
    (long_dir / "config.json").write_text(json.dumps(config))
    got = _llama_cpp(server, model_dir, prompt, "-c", str(2 * ORIGINAL))
    assert got == fc.hf_greedy(fc.hf_model(long_dir), prompt, NEW)
    assert got != fc.hf_greedy(fc.hf_model(hf_dir), prompt, NEW)
