"""Granite (GraniteForCausalLM) from import-hf to export: a tiny random transformers model with each multiplier
away from 1 (embeddings times 12, scores times 0.2 in place of 1/sqrt(16), each sublayer's output times 0.22,
logits divided by 3) and attention biases, so a bias scaled or not shows. gptport's torch model gives
transformers' logits (at several lengths, through its KV cache, layer by layer) and greedy tokens; a model with
any multiplier dropped fails the comparison; `gptport export` passes its gates and `gptport generate` on each
cache gives transformers' greedy tokens; export-hf writes GraniteForCausalLM back; a multiplier of 0 is refused
naming it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gptport.config import ModelConfig
from tests.export.test_hf_llama import _vocab, hf_tokenizer_dir  # noqa: F401
from tests.support import family_checks as fc
from tests.support.cli import assert_one_line_error, gptport

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

GRANITE = {"embedding_multiplier": 12.0, "attention_multiplier": 0.2, "residual_multiplier": 0.22,
           "logits_scaling": 3.0, "attention_bias": True, "rope_theta": 1000.0, "tie_word_embeddings": False}


def make_granite(out: Path, tokenizer: Path, **change: object) -> Path:
    return fc.make("GraniteConfig", "GraniteForCausalLM", out, tokenizer, _vocab(tokenizer), 1.0,
                   **{**GRANITE, **change})


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, hf_tokenizer_dir: Path) -> tuple[Path, Path]:  # noqa: F811
    """(the transformers directory, gptport's import of it, exported)."""
    root = tmp_path_factory.mktemp("granite")
    hf_dir = make_granite(root / "hf", hf_tokenizer_dir)
    out = root / "m"
    for args in (("import-hf", str(hf_dir), "--out", str(out)), ("export", str(out))):
        r = gptport(*args)
        assert r.returncode == 0, r.stderr
    return hf_dir, out


def test_the_config_holds_the_four_multipliers(exported: tuple[Path, Path]) -> None:
    cfg = fc.ours(exported[1]).cfg
    assert (cfg.embed_scale, cfg.attn_scale, cfg.residual_scale, cfg.logits_divisor) == (12.0, 0.2, 0.22, 3.0)
    assert cfg.has_qkv_bias and cfg.has_out_bias and cfg.inert().keys() >= {"window_layers"}


def test_logits_layers_and_greedy_tokens_equal_transformers(exported: tuple[Path, Path]) -> None:
    fc.check_logits(*exported)
    fc.check_layers(*exported)
    fc.check_greedy(*exported)


@pytest.mark.parametrize("field", ["embed_scale", "residual_scale", "logits_divisor"])
def test_the_comparison_fails_without_a_multiplier(field: str, exported: tuple[Path, Path]) -> None:
    hf_dir, model_dir = exported
    model = fc.ours(model_dir)
    wrong = fc.GPT(replace(model.cfg, **{field: ModelConfig.__dataclass_fields__[field].default}))
    wrong.load_state_dict(model.state_dict())
    ids = torch.randint(0, model.cfg.vocab_size, (1, 30))
    with torch.no_grad():
        assert fc.relative_error(wrong.eval()(ids)[0], fc.hf_model(hf_dir)(ids).logits) > 100 * fc.RTOL


@pytest.mark.parametrize("cache", ["concat", "static"])
def test_generate_gives_transformers_tokens(exported: tuple[Path, Path], cache: str) -> None:
    fc.check_generate(*exported, "ka to ri 12 sa ne mo", cache)


def test_export_hf_writes_granite_back(exported: tuple[Path, Path], tmp_path: Path) -> None:
    written = fc.check_export_hf(*exported, tmp_path / "back", "GraniteForCausalLM")
    assert {k: written[k] for k in GRANITE if k.endswith(("multiplier", "scaling"))} == {
        k: v for k, v in GRANITE.items() if k.endswith(("multiplier", "scaling"))}


@pytest.mark.parametrize("key", ["residual_multiplier", "logits_scaling"])
def test_a_multiplier_of_zero_is_refused(key: str, tmp_path: Path, hf_tokenizer_dir: Path) -> None:  # noqa: F811
    hf_dir = make_granite(tmp_path / "hf", hf_tokenizer_dir, num_hidden_layers=1)
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, key: 0}))
    out = tmp_path / "out"
    assert_one_line_error(gptport("import-hf", str(hf_dir), "--out", str(out)), 1, "config.json",
                          f"{key} must be a finite positive number, not 0")
    assert not out.exists()
