"""import-hf of Gemma 3 (Gemma3ForCausalLM, text only): a tiny random transformers model with sliding and full
layers mixed, a window of 8, a local RoPE base unlike the global one and a query_pre_attn_scalar unlike head_dim,
its weights drawn wide (norms' w too, so 1 + w is far from 1). gptport's torch model gives transformers' logits
within 1e-4 of their magnitude at lengths inside and past the window, through its KV cache, layer by layer
(layer_reference.py), and the same greedy tokens past the window; a model whose window is cut off by one fails
the comparison."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gptport import tokenizer as bpe
from gptport.export.hf import import_hf
from gptport.runtime.generate import generate
from gptport.runtime.sampling import Sampling
from gptport.training.checkpoint import load_model
from gptport.training.model import GPT
from gptport.training.torch_engine import TorchEngine
from gptport.weights import open_weights
from tests.export.test_hf_llama import _vocab, hf_tokenizer_dir, relative_error  # noqa: F401
from tests.support.cli import assert_one_line_error, gptport
from tests.support.family_checks import check_layers, check_logits, hf_model, make

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

RTOL = 1e-4
WINDOW = 8
GEMMA3: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 5, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 64, "sliding_window": WINDOW,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                    "full_attention"],
    "rope_theta": 1e6, "rope_local_base_freq": 100.0, "query_pre_attn_scalar": 24, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True}


def make_gemma3(out: Path, tokenizer: Path, vocab: int, **change: Any) -> Path:
    """A tiny random Gemma 3, every weight N(0, 0.3) (norms' w too: 1 + w about 1), saved with the tokenizer."""
    return make("Gemma3TextConfig", "Gemma3ForCausalLM", out, tokenizer, vocab, 0.0, **{**GEMMA3, **change})


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory, hf_tokenizer_dir: Path) -> tuple[Path, Path]:  # noqa: F811
    """(the transformers directory, gptport's import of it)."""
    root = tmp_path_factory.mktemp("gemma3")
    hf_dir = make_gemma3(root / "hf", hf_tokenizer_dir, _vocab(hf_tokenizer_dir))
    import_hf(hf_dir, root / "m")
    return hf_dir, root / "m"


def _ours(model_dir: Path) -> GPT:
    return load_model(model_dir, bpe.load(model_dir))[0]


def test_the_config_says_what_gemma_computes(gemma: tuple[Path, Path]) -> None:
    cfg = _ours(gemma[1]).cfg
    assert (cfg.mlp, cfg.gelu, cfg.qk_norm, cfg.post_norms, cfg.tie_embeddings) == ("geglu", "tanh", True, True, True)
    assert (cfg.sliding_window, cfg.window_layers, cfg.rope_local_theta, cfg.rope_theta) == (WINDOW, (0, 1, 3),
                                                                                            100.0, 1e6)
    assert cfg.embed_scale == 8.0 and cfg.attn_scale == 24 ** -0.5
    saved = json.loads((gemma[1] / "config.json").read_text())
    assert saved["format_version"] == 3 and saved["model"]["window_layers"] == [0, 1, 3]
    hf_norm = open_weights(gemma[0])["model.layers.0.input_layernorm.weight"]
    ours = open_weights(gemma[1])["h.0.ln_1.weight"]  # 1 + w folded in, in float32: bit for bit
    assert np.array_equal(ours, np.asarray(hf_norm, np.float32) + np.float32(1))


def test_logits_equal_transformers_inside_and_past_the_window(gemma: tuple[Path, Path]) -> None:
    check_logits(*gemma, (1, 7, WINDOW, WINDOW + 1, 33, 64), prefill=20, total=40)  # cached steps past the window


def test_each_layer_equals_transformers(gemma: tuple[Path, Path]) -> None:
    check_layers(*gemma, length=30)


def test_greedy_tokens_past_the_window_equal_transformers(gemma: tuple[Path, Path]) -> None:
    hf_dir, model_dir = gemma
    model, hf = _ours(model_dir), hf_model(hf_dir)
    prompts = [[5, 17, 200, 3, 9, 11], [9], [44, 45, 46, 47, 48, 49, 50, 51, 52, 53]]  # left-padded batch
    got = generate(TorchEngine(model), prompts, 14, Sampling(), eot_id=-1)
    for prompt, row in zip(prompts, got, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            for _ in range(14):
                ids = torch.cat([ids, hf(ids).logits[:, -1:].argmax(-1)], dim=1)
        assert row.new_ids == ids[0, len(prompt):].tolist()


@pytest.mark.parametrize("window", [WINDOW - 1, WINDOW + 1, 0], ids=["one-short", "one-long", "none"])
def test_the_comparison_fails_on_a_wrong_window(window: int, gemma: tuple[Path, Path]) -> None:
    hf_dir, model_dir = gemma
    model = _ours(model_dir)
    wrong = GPT(replace(model.cfg, sliding_window=window))
    wrong.load_state_dict(model.state_dict())
    ids = torch.randint(0, model.cfg.vocab_size, (1, 40))
    with torch.no_grad():
        assert relative_error(wrong.eval()(ids)[0], hf_model(hf_dir)(ids).logits) > 100 * RTOL


BAD = [({"final_logit_softcapping": 30.0}, "final_logit_softcapping is 30.0, which gptport does not compute"),
       ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping is 50.0"),
       ({"use_bidirectional_attention": True}, "use_bidirectional_attention is True"),
       ({"hidden_activation": "silu"}, "hidden_activation 'silu' is not a GELU"),
       ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}}},
        "the sliding layers' rope type 'yarn'"),
       ({"layer_types": ["sliding_attention"]}, "layer_types must list the 5 layers' types")]


@pytest.mark.parametrize(("change", "says"), BAD, ids=["final-softcap", "attn-softcap", "bidirectional", "silu",
                                                       "local-yarn", "short-layer-types"])
def test_what_gemma_3_computes_otherwise_is_refused(change: dict[str, Any], says: str, tmp_path: Path,
                                                    hf_tokenizer_dir: Path) -> None:  # noqa: F811
    hf_dir = tmp_path / "hf"
    make_gemma3(hf_dir, hf_tokenizer_dir, _vocab(hf_tokenizer_dir))
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, **change}))
    out = tmp_path / "out"
    assert_one_line_error(gptport("import-hf", str(hf_dir), "--out", str(out)), 1, "config.json", says)
    assert not out.exists()
