"""SmolLM3 (SmolLM3ForCausalLM) through import-hf: a tiny random model in which some layers do not rotate q and k
(config.json's no_rope_layers: 1 where a layer USES rope) gives transformers' logits within 1e-4 of their
magnitude, through the cache too, and generate()'s greedy tokens; without its list, every 4th layer goes without
(no_rope_layer_interval); the comparison fails on a model that rotates in every layer; bad flags are refused."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from gptport.runtime.generate import generate
from gptport.runtime.sampling import Sampling
from gptport.training.model import GPT
from gptport.training.torch_engine import TorchEngine
from tests.arch.hf_tiny import RTOL, cached_logits, hf_greedy, hf_model, imported, make, relative_error
from tests.export.test_hf_llama import hf_tokenizer_dir  # noqa: F401  (the fixture)
from tests.support.cli import assert_one_line_error, gptport

pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

SHAPE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": True,
         "rope_parameters": {"rope_type": "default", "rope_theta": 20000.0}}


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory, hf_tokenizer_dir: Path) -> tuple[Path, GPT]:  # noqa: F811
    root = tmp_path_factory.mktemp("smollm3")
    hf_dir = make("SmolLM3Config", "SmolLM3ForCausalLM", root / "hf", hf_tokenizer_dir, no_rope_layers=[1, 0, 0, 1],
                  **SHAPE)
    return hf_dir, imported(hf_dir, root / "m")


def test_the_flags_read_as_the_layers_without_rope(smol: tuple[Path, GPT]) -> None:
    assert smol[1].cfg.no_rope_layers == (1, 2)


def test_logits_equal_transformers_and_through_the_cache(smol: tuple[Path, GPT]) -> None:
    hf_dir, model = smol
    hf = hf_model(hf_dir)
    torch.manual_seed(1)
    for length in (1, 9, 64):
        ids = torch.randint(0, model.cfg.vocab_size, (2, length))
        with torch.no_grad():
            theirs, ours = hf(ids).logits, model(ids)[0]
        assert theirs.abs().max() > 1.0
        assert relative_error(ours, theirs) <= RTOL, length
    ids = torch.randint(0, model.cfg.vocab_size, (1, 30))
    assert relative_error(cached_logits(model, ids, 12, hf=False), cached_logits(hf, ids, 12, hf=True)) <= RTOL


def test_greedy_tokens_equal_transformers_generate(smol: tuple[Path, GPT]) -> None:
    hf_dir, model = smol
    hf = hf_model(hf_dir)
    prompt = [5, 17, 200, 3, 9]
    assert generate(TorchEngine(model), [prompt], 16, Sampling(), eot_id=-1)[0].new_ids == hf_greedy(hf, prompt, 16)


def test_the_comparison_fails_when_every_layer_rotates(smol: tuple[Path, GPT]) -> None:
    hf_dir, model = smol
    ids = torch.randint(0, model.cfg.vocab_size, (1, 40), generator=torch.Generator().manual_seed(3))
    everywhere = GPT(replace(model.cfg, no_rope_layers=()))
    everywhere.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert relative_error(everywhere.eval()(ids)[0], hf_model(hf_dir)(ids).logits) > 100 * RTOL


def test_without_the_list_every_fourth_layer_goes_without(tmp_path: Path, hf_tokenizer_dir: Path) -> None:  # noqa: F811
    hf_dir = make("SmolLM3Config", "SmolLM3ForCausalLM", tmp_path / "hf", hf_tokenizer_dir, **SHAPE)
    config = json.loads((hf_dir / "config.json").read_text())
    config.pop("no_rope_layers")
    (hf_dir / "config.json").write_text(json.dumps(config))
    model = imported(hf_dir, tmp_path / "m")
    assert model.cfg.no_rope_layers == (3,)
    ids = torch.randint(0, model.cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert relative_error(model(ids)[0], hf_model(hf_dir)(ids).logits) <= RTOL


BAD = [
    (lambda c: {**c, "no_rope_layers": [1, 0, 1]}, "no_rope_layers must be 4 flags of 0 or 1"),
    (lambda c: {**c, "no_rope_layers": [1, 2, 1, 1]}, "no_rope_layers must be 4 flags of 0 or 1"),
    (lambda c: {**c, "sliding_window": 16, "layer_types": ["full_attention", "sliding_attention"] * 2},
     "layer_types has sliding_attention layers but use_sliding_window is false"),
    (lambda c: {**c, "use_sliding_window": True, "layer_types": ["full_attention", "sliding_attention"] * 2},
     "layer_types has sliding_attention layers but sliding_window is null"),
]


@pytest.mark.parametrize(("change", "says"), BAD, ids=["three-flags", "flag-2", "sliding-unused", "no-window"])
def test_bad_config_is_refused_in_one_line(change: Any, says: str, smol: tuple[Path, GPT], tmp_path: Path) -> None:
    hf_dir = tmp_path / "hf"
    shutil.copytree(smol[0], hf_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps(change(config)))
    out = tmp_path / "out"
    assert_one_line_error(gptport("import-hf", str(hf_dir), "--out", str(out)), 1, "config.json", says)
    assert not out.exists()


def test_the_window_is_on_layer_types_sliding_layers_else_on_those_without_rope() -> None:
    """As SmolLM3Config fills layer_types in: with use_sliding_window and a window, the layers without rope slide;
    without use_sliding_window (and no layer_types) none does; a window covering the context is none."""
    from gptport.arch import family
    from gptport.arch.base import Specials

    hf = {"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "vocab_size": 100, **SHAPE,
          "no_rope_layers": [1, 1, 0, 0], "sliding_window": 16}
    read = lambda c: family("smollm3").model_config(c, 100, Specials(None, False, (99,), 99),  # noqa: E731
                                                     Path("config.json"))
    cfg = read({**hf, "use_sliding_window": True})
    assert (cfg.n_ctx, cfg.sliding_window, cfg.window_layers, cfg.no_rope_layers) == (64, 16, (2, 3), (2, 3))
    assert read(hf).window_layers == ()
    listed = read({**hf, "use_sliding_window": True, "layer_types": ["sliding_attention", *["full_attention"] * 3]})
    assert (listed.sliding_window, listed.window_layers) == (16, (0,))
    assert read({**hf, "use_sliding_window": True, "sliding_window": 64}).window_layers == ()
