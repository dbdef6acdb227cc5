"""OLMo 2 (Olmo2ForCausalLM) from import-hf to export: a tiny random transformers model (grouped kv heads,
attention biases, norms N(1, 0.3)). gptport's model has no norm before its sublayers, one after each, and a q/k
norm over every head together; it gives transformers' logits (at several lengths, through its KV cache, layer by
layer) and greedy tokens, and fails the comparison with its q/k norm per head; `gptport export` passes its gates
and `gptport generate` on each cache gives transformers' greedy tokens; export-hf writes Olmo2ForCausalLM back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gptport.weights import open_weights
from tests.export.test_hf_llama import _vocab, hf_tokenizer_dir  # noqa: F401
from tests.support import family_checks as fc
from tests.support.cli import gptport

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

OLMO2 = {"attention_bias": True, "rope_theta": 1000.0, "tie_word_embeddings": False, "rms_norm_eps": 1e-6}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, hf_tokenizer_dir: Path) -> tuple[Path, Path]:  # noqa: F811
    """(the transformers directory, gptport's import of it, exported)."""
    root = tmp_path_factory.mktemp("olmo2")
    hf_dir = fc.make("Olmo2Config", "Olmo2ForCausalLM", root / "hf", hf_tokenizer_dir, _vocab(hf_tokenizer_dir), 1.0,
                     **OLMO2)
    out = root / "m"
    for args in (("import-hf", str(hf_dir), "--out", str(out)), ("export", str(out))):
        r = gptport(*args)
        assert r.returncode == 0, r.stderr
    return hf_dir, out


def test_the_model_has_post_norms_only_and_one_qk_norm_over_all_heads(exported: tuple[Path, Path]) -> None:
    cfg = fc.ours(exported[1]).cfg
    assert (cfg.pre_norms, cfg.post_norms, cfg.qk_norm, cfg.qk_norm_span) == (False, True, True, "all")
    weights = open_weights(exported[1])
    assert "h.0.ln_1.weight" not in weights and "h.0.ln_2_post.weight" in weights
    assert (weights["h.0.attn.q_norm.weight"].shape, weights["h.0.attn.k_norm.weight"].shape) == ((64,), (32,))


def test_logits_layers_and_greedy_tokens_equal_transformers(exported: tuple[Path, Path]) -> None:
    fc.check_logits(*exported)
    fc.check_layers(*exported)
    fc.check_greedy(*exported)


def test_the_comparison_fails_with_the_qk_norm_per_head(exported: tuple[Path, Path]) -> None:
    """The same weights' q/k norm taken per head (each head's 16 values) instead of over all heads at once."""
    from dataclasses import replace

    hf_dir, model_dir = exported
    model = fc.ours(model_dir)
    wrong = fc.GPT(replace(model.cfg, qk_norm_span="head"))
    state = {k: v for k, v in model.state_dict().items() if not k.endswith(("q_norm.weight", "k_norm.weight"))}
    wrong.load_state_dict(state, strict=False)  # per-head norms of ones: the scale is what differs
    ids = torch.from_numpy(np.random.default_rng(4).integers(0, model.cfg.vocab_size, (1, 30)))
    with torch.no_grad():
        assert fc.relative_error(wrong.eval()(ids)[0], fc.hf_model(hf_dir)(ids).logits) > 100 * fc.RTOL


@pytest.mark.parametrize("cache", ["concat", "static"])
def test_generate_gives_transformers_tokens(exported: tuple[Path, Path], cache: str) -> None:
    fc.check_generate(*exported, "ka to ri 12 sa ne mo", cache)


def test_export_hf_writes_olmo_2_back(exported: tuple[Path, Path], tmp_path: Path) -> None:
    written = fc.check_export_hf(*exported, tmp_path / "back", "Olmo2ForCausalLM")
    assert written["attention_bias"] is True and "head_dim" not in written
