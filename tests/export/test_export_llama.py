"""A model trained with `--preset llama-tiny` (RMSNorm, SwiGLU, RoPE, 2 key/value heads for 4) goes through
`gptport export` with its variants (each through the accuracy gate) and its static-cache graphs; `gptport
generate` on its graphs gives the torch model's greedy tokens, and `gptport eval` scores text on them. The
runtime's cache is made with n_kv_head heads (its shapes are checked against the graph's), and the static-cache
graphs are built for each of the Llama family's choices."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from gptport.config import ModelConfig
from gptport.errors import UsageError
from gptport.export import gqa_graph, scatter_graph
from gptport.runtime.choice import GraphChoice
from gptport.runtime.loader import open_model
from tests.support.cli import gptport

PROMPT = "ka to ri"


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("llama") / "m"
    shutil.copytree(tokenizer_dir, out)
    r = gptport("train", str(corpus_file), "--model-dir", str(out), "--preset", "llama-tiny", "--steps", "60",
                "--set", "n_ctx=64", "--set", "d_model=64", "--set", "n_layer=2", "--set", "warmup_steps=5",
                "--set", "eval_every=60", "--set", "eval_batches=2", "--batch-size", "16", "--lr", "3e-3",
                "--device", "cpu")
    assert r.returncode == 0, r.stderr
    r = gptport("export", str(out), "--precision", "fp32,int8,fp16")
    assert r.returncode == 0, r.stderr
    return out, r.stderr


def test_export_writes_the_variants_and_the_static_graphs_through_the_gate(llama_dir: tuple[Path, str]) -> None:
    out, said = llama_dir
    for name in ("model.onnx", "model.int8.onnx", "model.fp16.onnx", "model.static.onnx", "model.int8.static.onnx",
                 "model.append.onnx"):
        assert (out / name).is_file(), said
    flat = " ".join(said.split())
    assert "no static-cache graph" not in flat
    assert "top-1" in flat  # the variants' gate table
    decoder = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    assert (decoder["num_attention_heads"], decoder["num_key_value_heads"], decoder["head_size"]) == (4, 2, 16)


@pytest.mark.parametrize("precision", ["fp32", "int8", "fp16"])
def test_generate_on_each_graph_gives_the_torch_tokens(llama_dir: tuple[Path, str], precision: str) -> None:
    out, _ = llama_dir
    runs = {}
    for engine in ("onnx", "torch"):
        r = gptport("generate", str(out), PROMPT, "--max-new-tokens", "24", "--json", "--engine", engine,
                    "--precision", precision if engine == "onnx" else "fp32")
        assert r.returncode == 0, r.stderr
        runs[engine] = json.loads(r.stdout)
    assert runs["onnx"]["kv_cache"] == ("concat" if precision == "fp16" else "static")  # no fp16 static graph
    assert runs["onnx"]["precision"] == precision
    if precision == "fp32":
        assert runs["onnx"]["token_ids"] == runs["torch"]["token_ids"] and runs["onnx"]["token_ids"]
    else:  # a gated variant: it agrees with fp32 torch on most greedy tokens
        same = sum(a == b for a, b in zip(runs["onnx"]["token_ids"], runs["torch"]["token_ids"], strict=False))
        assert same >= 4, runs


def test_eval_scores_text_on_the_graph_as_torch_does(llama_dir: tuple[Path, str], corpus_file: Path,
                                                     tmp_path: Path) -> None:
    out, _ = llama_dir
    text = tmp_path / "t.txt"
    text.write_text(corpus_file.read_text(encoding="utf-8")[:2000], encoding="utf-8")
    got = {}
    for engine in ("onnx", "torch"):
        r = gptport("eval", str(out), str(text), "--json", "--engine", engine)
        assert r.returncode == 0, r.stderr
        got[engine] = json.loads(r.stdout)
    assert got["onnx"]["windows"] > 1 and got["onnx"]["tokens"] == got["torch"]["tokens"]
    assert abs(got["onnx"]["perplexity"] / got["torch"]["perplexity"] - 1) < 1e-4


def test_the_runtime_cache_has_the_kv_heads(llama_dir: tuple[Path, str]) -> None:
    out, _ = llama_dir
    # the contract graph's cache (the static one is preallocated)
    engine = open_model(out, GraphChoice.parse(cache="concat")).engine
    past = engine.empty_past(3)
    assert engine.config.n_kv_head == 2 and engine.config.n_head == 4
    assert [p.shape for p in past] == [(3, 2, 0, engine.config.head_dim)] * (2 * engine.config.n_layer)
    ids = np.array([[5, 6, 7]], dtype=np.int64)
    logits, present = engine.step()(ids, np.ones_like(ids), np.arange(3)[None], engine.empty_past(1))
    assert present[0].shape == (1, 2, 3, engine.config.head_dim) and logits.shape[:2] == (1, 3)


@pytest.mark.parametrize("change", [
    {"pos_encoding": "rope"}, {"norm": "rmsnorm", "bias": False}, {"mlp": "swiglu"}, {"n_kv_head": 2},
    {"head_dim": 32}, {"qk_norm": True}, {"pos_encoding": "rope", "rope_scaling": "llama3", "rope_factor": 8.0},
    {"bias": False, "qkv_bias": True, "out_bias": True, "mlp_bias": True, "mlp": "swiglu"}])
def test_the_static_graphs_are_built_for_each_llama_choice(change: dict[str, object]) -> None:
    """Each choice alone, on a GPT otherwise: both builders write a graph onnx's checker takes."""
    import onnx
    import torch

    from gptport.training.model import GPT

    cfg = ModelConfig(vocab_size=100, n_ctx=32, d_model=64, n_layer=1, n_head=4, **change)  # type: ignore[arg-type]
    assert gqa_graph.unsupported(cfg) == ""
    torch.manual_seed(0)
    weights = {k: v.detach().numpy() for k, v in GPT(cfg).state_dict().items()}
    for build in (gqa_graph.build, scatter_graph.build):
        onnx.checker.check_model(build(cfg, weights), full_check=True)


def test_the_static_graphs_refuse_a_head_size_groupqueryattention_cannot_take() -> None:
    cfg = ModelConfig(vocab_size=100, n_ctx=32, d_model=48, n_layer=1, n_head=4, pos_encoding="rope")  # hd 12
    for build in (gqa_graph.build, scatter_graph.build):
        with pytest.raises(UsageError, match="no static-cache graph: .*multiple of 8 .*12"):
            build(cfg, {})
