"""Phi-3 / Phi-3.5 / Phi-4-mini (Phi3ForCausalLM) through import-hf: a tiny random model with fused qkv_proj and
gate_up_proj, partial rotary (Phi-4-mini's 0.75 of each head, here 0.5) and LongRoPE (short and long factors, the
long ones once a call reaches past original_max_position_embeddings 16) gives transformers' logits within 1e-4 of
their magnitude at lengths on both sides of 16 and through the cache across it, and generate() gives its greedy
tokens; the same comparison fails on a model whose long factors are its short ones; bad config.json is refused in
one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from gptport.runtime.generate import generate
from gptport.runtime.sampling import Sampling
from gptport.training.torch_engine import TorchEngine
from tests.arch.hf_tiny import RTOL, cached_logits, hf_greedy, hf_model, imported, make, relative_error
from tests.export.test_hf_llama import hf_tokenizer_dir  # noqa: F401  (the fixture)
from tests.support.cli import assert_one_line_error, gptport

pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

ORIGINAL = 16


def phi3_config(partial: float = 0.5, **over: Any) -> dict[str, Any]:
    """A tiny Phi3Config: heads 16 wide (rotary 8: four frequencies), grouped kv heads, LongRoPE."""
    rotary = int(16 * partial) // 2
    return {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 64, "original_max_position_embeddings": ORIGINAL,
            "tie_word_embeddings": False, "resid_pdrop": 0.1, "embd_pdrop": 0.1,
            "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": partial,
                                "short_factor": [1.0 + 0.1 * i for i in range(rotary)],
                                "long_factor": [1.5 + 2.0 * i for i in range(rotary)]}, **over}


@pytest.fixture(scope="module")
def phi3(tmp_path_factory: pytest.TempPathFactory, hf_tokenizer_dir: Path) -> tuple[Path, Any]:  # noqa: F811
    root = tmp_path_factory.mktemp("phi3")
    hf_dir = make("Phi3Config", "Phi3ForCausalLM", root / "hf", hf_tokenizer_dir, **phi3_config())
    return hf_dir, imported(hf_dir, root / "m")


def test_the_config_reads_as_partial_rotary_longrope(phi3: tuple[Path, Any]) -> None:
    cfg = phi3[1].cfg
    assert (cfg.rotary_dim, cfg.rope_scaling, cfg.rope_original_n_ctx) == (8, "longrope", ORIGINAL)
    assert cfg.rope_long_factor == (1.5, 3.5, 5.5, 7.5) and len(cfg.rope_short_factor) == 4
    assert cfg.rope_attention_factor == pytest.approx((1 + torch.log(torch.tensor(4.0)).item()
                                                       / torch.log(torch.tensor(16.0)).item()) ** 0.5)
    assert (cfg.n_kv_head, cfg.d_ff, cfg.has_qkv_bias, cfg.tie_embeddings) == (2, 96, False, False)


def test_logits_equal_transformers_on_both_sides_of_the_original_context(phi3: tuple[Path, Any]) -> None:
    hf_dir, model = phi3
    hf = hf_model(hf_dir)
    torch.manual_seed(1)
    for length in (1, 7, ORIGINAL, ORIGINAL + 1, 40, 64):
        ids = torch.randint(0, model.cfg.vocab_size, (2, length))
        with torch.no_grad():
            theirs, ours = hf(ids).logits, model(ids)[0]
        assert theirs.abs().max() > 1.0
        assert relative_error(ours, theirs) <= RTOL, length


def test_the_cache_crosses_the_original_context_as_transformers_does(phi3: tuple[Path, Any]) -> None:
    """A prefill of 10 (short factors), then steps to 30: each step past 16 rotates by the long factors, the keys
    cached before keep the short ones' rotation, in both."""
    hf_dir, model = phi3
    ids = torch.randint(0, model.cfg.vocab_size, (1, 30), generator=torch.Generator().manual_seed(2))
    theirs = cached_logits(hf_model(hf_dir), ids, 10, hf=True)
    assert relative_error(cached_logits(model, ids, 10, hf=False), theirs) <= RTOL
    with torch.no_grad():  # and the cached run is not the one-call run: the factors did change mid-way
        assert relative_error(model(ids)[0], theirs) > 100 * RTOL


def test_greedy_tokens_equal_transformers_generate(phi3: tuple[Path, Any]) -> None:
    hf_dir, model = phi3
    hf = hf_model(hf_dir)
    for prompt in ([5, 17, 200, 3], list(range(30, 50))):  # crossing 16 while decoding, and a prompt past it
        got = generate(TorchEngine(model), [prompt], 20, Sampling(), eot_id=-1)
        assert got[0].new_ids == hf_greedy(hf, prompt, 20)


def test_the_comparison_fails_with_the_short_factors_past_the_original_context(phi3: tuple[Path, Any]) -> None:
    hf_dir, model = phi3
    ids = torch.randint(0, model.cfg.vocab_size, (1, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        theirs = hf_model(hf_dir)(ids).logits
        model.inv_freq_long = model.inv_freq.clone()
        try:
            assert relative_error(model(ids)[0], theirs) > 100 * RTOL
        finally:
            from gptport.training.layers import rope_inv_freq

            model.inv_freq_long = rope_inv_freq(model.cfg, long=True)


def test_phi3_mini_without_scaling_and_whole_heads(tmp_path: Path, hf_tokenizer_dir: Path) -> None:  # noqa: F811
    """Phi-3-mini-4k's shape of config: default rope over whole heads, a window no shorter than the context."""
    config = phi3_config(1.0, sliding_window=64)
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    hf_dir = make("Phi3Config", "Phi3ForCausalLM", tmp_path / "hf", hf_tokenizer_dir, **config)
    model = imported(hf_dir, tmp_path / "m")
    assert (model.cfg.rotary_dim, model.cfg.rope_scaling) == (0, "none")
    ids = torch.randint(0, model.cfg.vocab_size, (2, 33), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert relative_error(model(ids)[0], hf_model(hf_dir)(ids).logits) <= RTOL


def test_phi3_mini_4k_keeps_its_window_on_every_layer() -> None:
    """Phi-3-mini-4k-instruct's config.json: sliding_window 2047 of a 4096-token context, on all 32 layers."""
    from gptport.arch import family
    from gptport.arch.base import Specials

    mini = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 32064, "hidden_size": 3072,
            "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
            "max_position_embeddings": 4096, "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
            "rope_scaling": None, "sliding_window": 2047, "rms_norm_eps": 1e-5, "hidden_act": "silu",
            "tie_word_embeddings": False, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0}
    cfg = family("phi3").model_config(mini, 32064, Specials(1, False, (32000,), 32000), Path("config.json"))
    assert (cfg.n_ctx, cfg.sliding_window, cfg.window_layers) == (4096, 2047, tuple(range(32)))
    whole = family("phi3").model_config({**mini, "sliding_window": 4096}, 32064, Specials(1, False, (32000,), 32000),
                                        Path("config.json"))
    assert (whole.sliding_window, whole.window_layers) == (0, ())  # covers the context: full attention


BAD = [
    (lambda c: {**c, "sliding_window": 0}, "sliding_window"),
    (lambda c: {**c, "rope_scaling": None, "rope_parameters": {**c["rope_parameters"], "long_factor": [1.0]}},
     "long_factor must have 4 values (one per frequency), not 1"),
    (lambda c: {**c, "rope_parameters": {**c["rope_parameters"], "rope_type": "yarn"}}, "rope type 'yarn'"),
    (lambda c: {**c, "head_dim": 8}, "key 'head_dim' is not one gptport knows for a phi3 model"),
]


@pytest.mark.parametrize(("change", "says"), BAD, ids=["window-0", "factor-count", "yarn", "head-dim"])
def test_bad_config_is_refused_in_one_line(change: Any, says: str, phi3: tuple[Path, Any], tmp_path: Path) -> None:
    import shutil

    hf_dir = tmp_path / "hf"
    shutil.copytree(phi3[0], hf_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps(change(config)))
    out = tmp_path / "out"
    assert_one_line_error(gptport("import-hf", str(hf_dir), "--out", str(out)), 1, "config.json", says)
    assert not out.exists()
