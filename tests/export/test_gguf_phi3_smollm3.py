"""Phi-3 and SmolLM3 as llama.cpp's `phi3` and `smollm3`: `gptport export-gguf` of an imported tiny random
transformers model writes q|k|v as attn_qkv, gate|up as ffn_up, the rotary width as rope.dimension_count and
LongRoPE's factors as rope_factors_short/long (Phi-3), q and k rows permuted (SmolLM3, whose every 4th layer
goes without rope, as llama.cpp fixes it); `gptport import-gguf` gives back the same ModelConfig and weights.
export-gguf says when llama.cpp's LongRoPE computes what gptport does; what llama.cpp cannot compute (another
pattern of layers without rope, a Phi-3 window) is refused by name."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gptport import tokenizer as bpe
from gptport.errors import InputError
from gptport.export import gguf_llama
from gptport.export.gguf_file import GGUFFile
from gptport.training.checkpoint import load_model
from gptport.weights import open_weights
from tests.arch.hf_tiny import make
from tests.arch.test_phi3 import phi3_config
from tests.export.test_hf_llama import hf_tokenizer_dir  # noqa: F401
from tests.support.cli import assert_one_line_error, gptport

pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

ORIGINAL = 256  # Phi-3's original context: llama.cpp rounds its context up to a multiple of 256
SHAPE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": False, "rope_theta": 1000.0}


def make_model(family: str, out: Path, tokenizer: Path, **change: Any) -> Path:
    """Phi-3 with rotary 8 of 16 and LongRoPE (original 256 of 512); SmolLM3 with layer 3 of 4 without rope."""
    if family == "phi3":
        return make("Phi3Config", "Phi3ForCausalLM", out, tokenizer, **phi3_config(
            max_position_embeddings=2 * ORIGINAL, original_max_position_embeddings=ORIGINAL, **change))
    return make("SmolLM3Config", "SmolLM3ForCausalLM", out, tokenizer, **{"no_rope_layers": [1, 1, 1, 0], **SHAPE,
                                                                          **change})


def imported(root: Path, tokenizer: Path, family: str, **change: Any) -> Path:
    hf_dir = make_model(family, root / "hf", tokenizer, **change)
    r = gptport("import-hf", str(hf_dir), "--out", str(root / "m"))
    assert r.returncode == 0, r.stderr
    return root / "m"


@pytest.fixture(scope="module", params=["phi3", "smollm3"])
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            hf_tokenizer_dir: Path) -> tuple[str, Path, Path, str]:  # noqa: F811
    """(the family, gptport's import of its tiny model, the model.f32.gguf written of it, export-gguf's stderr)."""
    model_dir = imported(tmp_path_factory.mktemp(f"gguf_{request.param}"), hf_tokenizer_dir, request.param)
    r = gptport("export-gguf", str(model_dir))
    assert r.returncode == 0, r.stderr
    return request.param, model_dir, model_dir / "model.f32.gguf", r.stderr


def test_the_file_holds_what_llama_cpp_reads(written: tuple[str, Path, Path, str]) -> None:
    family, model_dir, path, _ = written
    f = GGUFFile(path)
    cfg = load_model(model_dir, bpe.load(model_dir))[1].model
    ours = open_weights(model_dir)
    assert f.text("general.architecture") == family
    if family == "phi3":
        assert f.integer("phi3.rope.dimension_count") == 8 and f.shape("blk.0.attn_qkv.weight") == (128, 64)
        assert np.array_equal(f.dequantize("blk.1.ffn_up.weight"),  # the gate's rows, then up's
                              np.concatenate([ours["h.1.mlp.c_gate.weight"], ours["h.1.mlp.c_fc.weight"]]))
        assert tuple(f.dequantize("rope_factors_long.weight")) == cfg.rope_long_factor
        assert f.integer("phi3.rope.scaling.original_context_length") == ORIGINAL
        assert f.number("phi3.rope.scaling.attn_factor") == float(str(np.float32(cfg.rope_attention_factor)))
    else:
        assert cfg.no_rope_layers == (3,) and "blk.0.attn_q.weight" in f.tensors
        assert not np.array_equal(f.dequantize("blk.0.attn_q.weight"), ours["h.0.attn.c_attn.weight"][:64])


def test_import_gguf_gives_back_the_same_model(written: tuple[str, Path, Path, str], tmp_path: Path) -> None:
    family, model_dir, path, _ = written
    r = gptport("import-gguf", str(path), "--out", str(tmp_path / "again"))
    assert r.returncode == 0, r.stderr
    ours, again = (load_model(d, bpe.load(d))[1].model for d in (model_dir, tmp_path / "again"))
    if family == "phi3":  # the attention factor goes through float32 (llama.cpp's key) and back
        assert again.rope_attention_factor == float(str(np.float32(ours.rope_attention_factor)))
        again = replace(again, rope_attention_factor=ours.rope_attention_factor)
    assert again == ours
    a, b = open_weights(model_dir), open_weights(tmp_path / "again")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[n], b[n]) for n in a)


def test_export_gguf_says_when_llama_cpps_longrope_agrees(written: tuple[str, Path, Path, str]) -> None:
    family, _, _, stderr = written
    if family != "phi3":
        assert "note:" not in stderr
        return
    assert f"when run with a context (-c, which it rounds up to a multiple of 256) of at most {ORIGINAL}" in stderr


@pytest.mark.parametrize(("family", "change", "message"), [
    ("smollm3", {"no_rope_layers": [1, 0, 0, 1]}, "layers without rope [1, 2] (llama.cpp's smollm3 skips rope on "
                                                  "every 4th layer: [3])"),
    ("smollm3", {"attention_bias": True}, "biases (llama.cpp's smollm3 has neither"),
])
def test_what_llama_cpp_cannot_compute_is_refused_by_name(family: str, change: dict[str, Any], message: str,
                                                          tmp_path: Path, hf_tokenizer_dir: Path) -> None:  # noqa: F811
    model_dir = imported(tmp_path, hf_tokenizer_dir, family, **change)
    assert_one_line_error(gptport("export-gguf", str(model_dir)), 1, message)
    assert not list(model_dir.glob("*.gguf"))


def test_a_phi3_window_is_refused_by_name(written: tuple[str, Path, Path, str]) -> None:
    family, model_dir, _, _ = written
    if family != "phi3":
        pytest.skip("Phi-3's window")
    cfg = load_model(model_dir, bpe.load(model_dir))[1].model
    windowed = replace(cfg, sliding_window=8, window_layers=(0, 1))
    with pytest.raises(InputError, match="a sliding window of 8 .llama.cpp's phi3 disables Phi-3's window"):
        gguf_llama.architecture(windowed)
