"""Gemma 3 as llama.cpp's `gemma3`: `gptport export-gguf` of an imported tiny Gemma (query_pre_attn_scalar =
head_dim, the scale llama.cpp derives) writes the window, its layers as a list of flags and their RoPE base,
the norms as 1 + w (as llama.cpp's converter adds 1); `gptport import-gguf` gives back the same ModelConfig and
weights; the pattern as a number (llama.cpp's default, every 6th layer global) reads as transformers'
layer_types; a softmax scale llama.cpp cannot derive is refused by name, and so is a metadata key gptport
does not read."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from gptport import tokenizer as bpe
from gptport.export.gguf_config import model_config
from gptport.export.gguf_file import GGUFFile
from gptport.training.checkpoint import load_model
from gptport.weights import open_weights
from tests.export.test_gemma3_hf import make_gemma3
from tests.export.test_hf_llama import _vocab, hf_tokenizer_dir  # noqa: F401
from tests.support.cli import assert_one_line_error, gptport

pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")


def _imported(root: Path, tokenizer: Path, **change: object) -> Path:
    hf_dir = make_gemma3(root / "hf", tokenizer, _vocab(tokenizer), **change)
    r = gptport("import-hf", str(hf_dir), "--out", str(root / "m"))
    assert r.returncode == 0, r.stderr
    return root / "m"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory, hf_tokenizer_dir: Path) -> tuple[Path, Path]:  # noqa: F811
    model_dir = _imported(tmp_path_factory.mktemp("gemma3_gguf"), hf_tokenizer_dir, query_pre_attn_scalar=16)
    r = gptport("export-gguf", str(model_dir))
    assert r.returncode == 0, r.stderr
    return model_dir, model_dir / "model.f32.gguf"


def test_the_file_says_the_window_as_llama_cpp_reads_it(written: tuple[Path, Path]) -> None:
    model_dir, path = written
    f = GGUFFile(path)
    assert f.text("general.architecture") == "gemma3"
    assert f.integer("gemma3.attention.sliding_window") == 8
    assert f.value("gemma3.attention.sliding_window_pattern") == [True, True, False, True, False]
    assert f.number("gemma3.rope.freq_base_swa") == 100.0 and f.number("gemma3.rope.freq_base") == 1e6
    ours = open_weights(model_dir)
    assert np.array_equal(f.dequantize("blk.1.post_ffw_norm.weight"), ours["h.1.ln_2_post.weight"])  # 1 + w


def test_import_gguf_gives_back_the_same_model(written: tuple[Path, Path], tmp_path: Path) -> None:
    model_dir, path = written
    r = gptport("import-gguf", str(path), "--out", str(tmp_path / "again"))
    assert r.returncode == 0, r.stderr
    ours, again = (load_model(d, bpe.load(d))[1].model for d in (model_dir, tmp_path / "again"))
    assert again == ours
    a, b = open_weights(model_dir), open_weights(tmp_path / "again")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[n], b[n]) for n in a)


def test_a_pattern_given_as_a_number_reads_as_every_nth_layer_global(written: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    """llama.cpp's set_swa_pattern(n): layer i slides where i % n < n - 1 (transformers' (i + 1) % n != 0)."""
    from gptport import arch
    from gptport.arch.base import Specials

    _, path = written
    f = GGUFFile(path)
    copy = tmp_path / "n.gguf"
    w = gguf.GGUFWriter(copy, arch="gemma3")
    for key in ("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
                "attention.head_count_kv", "attention.key_length", "attention.value_length",
                "attention.sliding_window"):
        w.add_uint32(f"gemma3.{key}", f.integer(f"gemma3.{key}"))
    w.add_float32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32("gemma3.attention.sliding_window_pattern", 3)
    w.add_tensor("blk.0.attn_q_norm.weight", np.ones(16, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    cfg = model_config(GGUFFile(copy), arch.family("gemma3_text"), 50, Specials(None, False, (), 0))
    assert cfg.window_layers == (0, 1, 3, 4) and cfg.rope_local_theta == 10000.0 and cfg.attn_scale == 0.25


def test_a_scale_llama_cpp_cannot_derive_is_refused(tmp_path: Path, hf_tokenizer_dir: Path) -> None:  # noqa: F811
    model_dir = _imported(tmp_path, hf_tokenizer_dir)  # query_pre_attn_scalar 24, head_dim 16
    assert_one_line_error(gptport("export-gguf", str(model_dir)), 1, "softmax scale 0.204124, not the 0.25 "
                          "llama.cpp's gemma3 derives")
    assert not list(model_dir.glob("*.gguf"))
