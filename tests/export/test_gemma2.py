"""Gemma 2 (Gemma2ForCausalLM) from import-hf to export: a tiny random transformers model with window and global
layers alternating (window 8), attention and final logit soft-capping tight enough to bend the numbers, a
query_pre_attn_scalar unlike head_dim and an untied head. gptport's torch model gives transformers' logits
(inside and past the window, through its KV cache, layer by layer) and greedy tokens; a model without either
soft-cap fails the comparison; `gptport export` passes its gates and `gptport generate` on each cache gives
transformers' greedy tokens past the window; export-hf writes Gemma2ForCausalLM back; the CUDA graphs refuse the
soft-capping by name."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import onnx
import pytest
import torch

from gptport.export import cuda_graphs
from tests.export.test_hf_llama import _vocab, hf_tokenizer_dir  # noqa: F401
from tests.support import family_checks as fc
from tests.support.cli import assert_one_line_error, gptport

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

WINDOW = 8
GEMMA2 = {"head_dim": 16, "sliding_window": WINDOW, "query_pre_attn_scalar": 24, "rope_theta": 1000.0,
          "attn_logit_softcapping": 4.0, "final_logit_softcapping": 3.0, "tie_word_embeddings": False}


def make_gemma2(out: Path, tokenizer: Path, **change: object) -> Path:
    return fc.make("Gemma2Config", "Gemma2ForCausalLM", out, tokenizer, _vocab(tokenizer), 0.0,
                   **{**GEMMA2, **change})


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, hf_tokenizer_dir: Path) -> tuple[Path, Path]:  # noqa: F811
    """(the transformers directory, gptport's import of it, exported)."""
    root = tmp_path_factory.mktemp("gemma2")
    hf_dir = make_gemma2(root / "hf", hf_tokenizer_dir)
    out = root / "m"
    for args in (("import-hf", str(hf_dir), "--out", str(out)), ("export", str(out))):
        r = gptport(*args)
        assert r.returncode == 0, r.stderr
    return hf_dir, out


def test_the_config_says_what_gemma_2_computes(exported: tuple[Path, Path]) -> None:
    cfg = fc.ours(exported[1]).cfg
    assert (cfg.mlp, cfg.qk_norm, cfg.post_norms, cfg.attn_softcap, cfg.final_softcap) == ("geglu", False, True,
                                                                                            4.0, 3.0)
    assert (cfg.sliding_window, cfg.window_layers, cfg.rope_local_theta) == (WINDOW, (0, 2), 0.0)
    assert cfg.embed_scale == 8.0 and cfg.attn_scale == 24 ** -0.5


def test_logits_layers_and_greedy_tokens_equal_transformers(exported: tuple[Path, Path]) -> None:
    fc.check_logits(*exported)
    fc.check_layers(*exported)
    fc.check_greedy(*exported)


@pytest.mark.parametrize("field", ["attn_softcap", "final_softcap"])
def test_the_comparison_fails_without_a_soft_cap(field: str, exported: tuple[Path, Path]) -> None:
    hf_dir, model_dir = exported
    model = fc.ours(model_dir)
    wrong = fc.GPT(replace(model.cfg, **{field: 0.0}))
    wrong.load_state_dict(model.state_dict())
    ids = torch.randint(0, model.cfg.vocab_size, (1, 40))
    with torch.no_grad():
        assert fc.relative_error(wrong.eval()(ids)[0], fc.hf_model(hf_dir)(ids).logits) > 100 * fc.RTOL


@pytest.mark.parametrize("cache", ["concat", "static"])
def test_generate_past_the_window_gives_transformers_tokens(exported: tuple[Path, Path], cache: str) -> None:
    fc.check_generate(*exported, "ka to ri 12 sa ne mo", cache)


def test_every_graph_caps_its_attention(exported: tuple[Path, Path]) -> None:
    """GroupQueryAttention and Attention take softcap (their CPU kernels cap before the mask, as Gemma 2 does:
    record 0052); the contract graph's stock attention a Tanh per layer, and one on the logits each graph."""
    _, out = exported
    for name, op in (("model.static.onnx", "GroupQueryAttention"), ("model.append.onnx", "Attention")):
        nodes = [n for n in onnx.load(str(out / name)).graph.node if n.op_type == op]
        assert [next(a.f for a in n.attribute if a.name == "softcap") for n in nodes] == [4.0] * 4, name
    nodes = onnx.load(str(out / "model.onnx")).graph.node
    divided = {n.output[0] for n in nodes if n.op_type == "Div"}  # tanh(x / cap), not GELU's Tanh
    assert len([n for n in nodes if n.op_type == "Tanh" and n.input[0] in divided]) == 4 + 1


def test_export_hf_writes_gemma_2_back(exported: tuple[Path, Path], tmp_path: Path) -> None:
    written = fc.check_export_hf(*exported, tmp_path / "back", "Gemma2ForCausalLM")
    assert (written["attn_logit_softcapping"], written["final_logit_softcapping"]) == (4.0, 3.0)
    assert written["layer_types"] == json.loads((exported[0] / "config.json").read_text())["layer_types"]


def test_the_cuda_graphs_refuse_the_soft_capping(exported: tuple[Path, Path]) -> None:
    assert "attention soft-capping at 4" in cuda_graphs.unsupported(fc.ours(exported[1]).cfg)


@pytest.mark.parametrize(("change", "says"), [
    ({"attn_logit_softcapping": -1.0}, "attn_logit_softcapping must be a finite number >= 0"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention is True"),
    ({"hidden_activation": "silu"}, "hidden_activation 'silu' is not a GELU")], ids=["negative-cap", "bidirectional",
                                                                                       "silu"])
def test_what_gemma_2_computes_otherwise_is_refused(change: dict[str, object], says: str, tmp_path: Path,
                                                    hf_tokenizer_dir: Path) -> None:  # noqa: F811
    hf_dir = make_gemma2(tmp_path / "hf", hf_tokenizer_dir, num_hidden_layers=2)
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, **change}))
    out = tmp_path / "out"
    assert_one_line_error(gptport("import-hf", str(hf_dir), "--out", str(out)), 1, "config.json", says)
    assert not out.exists()
