"""Gemma 3 through `gptport export`: a tiny random transformers Gemma3ForCausalLM (window 8, sliding and full
layers mixed, its own local RoPE base and softmax scale; an untied head, so greedy text does not repeat one
token) imported, exported through every gate (the contract graph masks the window, GroupQueryAttention takes
local_window_size, the append graph's Attention a window mask), and `gptport generate` on each cache gives
transformers' greedy tokens with prompt and continuation past the window; a static graph whose window is one
short fails its gate; export-hf writes a Gemma3ForCausalLM transformers loads to the same logits; what the CUDA
graphs and the int8 cache do not compute is refused naming the window."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from gptport import tokenizer as bpe
from gptport.errors import UsageError
from gptport.export import cuda_graphs, validate
from gptport.export.exporter import export
from gptport.export.tolerance import Tolerance
from gptport.runtime.onnx_engine import load_cpu
from gptport.training.checkpoint import load_model
from tests.export.test_gemma3_hf import WINDOW, hf_model, make_gemma3
from tests.export.test_hf_llama import _vocab, hf_tokenizer_dir, relative_error  # noqa: F401
from tests.support.cli import gptport

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

PROMPT = "ka to ri 12 sa ne mo"  # 15 tokens with the begin token: past the window of 8 already
NEW = 16


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, hf_tokenizer_dir: Path) -> tuple[Path, Path]:  # noqa: F811
    root = tmp_path_factory.mktemp("gemma3_export")
    hf_dir = make_gemma3(root / "hf", hf_tokenizer_dir, _vocab(hf_tokenizer_dir), tie_word_embeddings=False)
    out = root / "m"
    r = gptport("import-hf", str(hf_dir), "--out", str(out))
    assert r.returncode == 0, r.stderr
    r = gptport("export", str(out))
    assert r.returncode == 0, r.stderr
    return hf_dir, out


def _greedy(hf: Any, ids: list[int], n: int) -> list[int]:
    t = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            t = torch.cat([t, hf(t).logits[:, -1:].argmax(-1)], dim=1)
    return t[0, len(ids):].tolist()


@pytest.mark.parametrize("cache", ["concat", "static"])
def test_generate_past_the_window_gives_transformers_tokens(exported: tuple[Path, Path], cache: str) -> None:
    hf_dir, out = exported
    tok = bpe.load(out)
    cfg = load_model(out, tok)[1].model
    prompt = [cfg.bos_id, *tok.encode(PROMPT)]
    assert len(prompt) > WINDOW
    want = _greedy(hf_model(hf_dir), prompt, NEW)
    assert len(set(want)) > NEW // 2  # greedy text that does not repeat one token
    r = gptport("generate", str(out), PROMPT, "--max-new-tokens", str(NEW), "--json", "--kv-cache", cache)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["kv_cache"] == cache and got["prompt_tokens"] == len(prompt)
    ids = got["token_ids"]
    assert ids == want[:len(ids)] and (len(ids) == NEW or want[len(ids)] in cfg.eos_ids)


def test_each_graph_takes_the_window_on_its_window_layers_only(exported: tuple[Path, Path]) -> None:
    _, out = exported
    cfg = load_model(out, bpe.load(out))[1].model
    gqa = [n for n in onnx.load(str(out / "model.static.onnx")).graph.node if n.op_type == "GroupQueryAttention"]
    windows = [next((a.i for a in n.attribute if a.name == "local_window_size"), -1) for n in gqa]
    assert windows == [WINDOW if cfg.windowed(i) else -1 for i in range(cfg.n_layer)]
    attention = [n for n in onnx.load(str(out / "model.append.onnx")).graph.node if n.op_type == "Attention"]
    assert [bool(n.input[3]) for n in attention] == [cfg.windowed(i) for i in range(cfg.n_layer)]


@pytest.mark.parametrize("off", [-1, 1])
def test_a_static_graph_with_its_window_off_by_one_fails_its_gate(exported: tuple[Path, Path], tmp_path: Path,
                                                                  off: int) -> None:
    _, out = exported
    model, _ = load_model(out, bpe.load(out))
    proto = onnx.load(str(out / "model.static.onnx"))
    for node in proto.graph.node:
        for a in node.attribute:
            if a.name == "local_window_size":
                a.i += off
    onnx.save(proto, str(tmp_path / "off.onnx"))
    rows = validate.static_parity(model, load_cpu(tmp_path / "off.onnx"), Tolerance())
    assert not all(r.ok for r in rows), rows


def test_export_hf_writes_a_gemma3_transformers_computes_alike(exported: tuple[Path, Path], tmp_path: Path) -> None:
    hf_dir, out = exported
    r = gptport("export-hf", str(out), "--out", str(tmp_path / "back"))
    assert r.returncode == 0, r.stderr
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    source = json.loads((hf_dir / "config.json").read_text())
    assert written["architectures"] == ["Gemma3ForCausalLM"] and written["layer_types"] == source["layer_types"]
    back, theirs = hf_model(tmp_path / "back"), hf_model(hf_dir)
    ids = torch.from_numpy(np.random.default_rng(3).integers(0, written["vocab_size"], (2, 40)))
    with torch.no_grad():
        assert relative_error(back(ids).logits, theirs(ids).logits) <= 1e-6
        norm = back.model.layers[2].post_feedforward_layernorm.weight  # w' = (1 + w) - 1, exact (Sterbenz):
        assert torch.equal(1.0 + norm, 1.0 + theirs.model.layers[2].post_feedforward_layernorm.weight)  # 1 + w' = 1 + w


def test_the_cuda_graphs_and_the_int8_cache_refuse_the_window(exported: tuple[Path, Path]) -> None:
    _, out = exported
    cfg = load_model(out, bpe.load(out))[1].model
    assert "a sliding window of 8, a local RoPE base" in cuda_graphs.unsupported(cfg)
    with pytest.raises(UsageError, match="--kv-dtype int8: this model has a sliding window of 8"):
        export(out, kv_dtype="int8", force=True, gate=False)
