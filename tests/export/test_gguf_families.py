"""Gemma 2, Granite and OLMo 2 as llama.cpp's `gemma2`, `granite` and `olmo2`: `gptport export-gguf` of an
imported tiny random transformers model writes what llama.cpp reads (both soft-caps, the window and its layers;
the four multipliers; OLMo 2's post-norms and its q/k norms as wide as all heads), and `gptport import-gguf`
gives back the same ModelConfig and weights. What llama.cpp cannot compute is refused by name (Gemma 2's untied
head, OLMo 2's biases or tied head), and so is what it reads and gptport does not (granite's rope switched off,
OLMo 3's window, an output tensor llama.cpp's gemma2 never reads)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest

from gptport import arch
from gptport import tokenizer as bpe
from gptport.arch.base import Specials
from gptport.errors import InputError
from gptport.export.gguf_config import model_config
from gptport.export.gguf_file import GGUFFile
from gptport.training.checkpoint import load_model
from gptport.weights import open_weights
from tests.export.test_gemma2 import GEMMA2, make_gemma2
from tests.export.test_granite import make_granite
from tests.export.test_hf_llama import _vocab, hf_tokenizer_dir  # noqa: F401
from tests.support import family_checks as fc
from tests.support.cli import assert_one_line_error, gptport

pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

# each family's tiny model as llama.cpp computes it: Gemma 2 tied, its softmax scale 1/sqrt(head_dim) (what
# llama.cpp derives), its norms' w N(8, 0.3) and a final cap of 100 (so that the sublayers outweigh the scaled
# embedding, greedy text does not repeat one token with a tied head, and no two logits come near a tie); OLMo 2
# without biases (llama.cpp's has none)
GEMMA2_TIED = {**GEMMA2, "tie_word_embeddings": True, "query_pre_attn_scalar": 16, "final_logit_softcapping": 100.0}
MAKERS: dict[str, Callable[[Path, Path], Path]] = {
    "gemma2": lambda out, tok: fc.make("Gemma2Config", "Gemma2ForCausalLM", out, tok, _vocab(tok), 8.0,
                                       **GEMMA2_TIED),
    "granite": lambda out, tok: make_granite(out, tok),
    "olmo2": lambda out, tok: fc.make("Olmo2Config", "Olmo2ForCausalLM", out, tok, _vocab(tok), 1.0,
                                      attention_bias=False, rope_theta=1000.0, tie_word_embeddings=False,
                                      rms_norm_eps=1e-6),
}


def imported(root: Path, tokenizer: Path, family: str, make: Callable[[Path, Path], Path] | None = None) -> Path:
    """import-hf of the family's tiny model (`make`: another maker), in root/m."""
    hf_dir = (make or MAKERS[family])(root / "hf", tokenizer)
    r = gptport("import-hf", str(hf_dir), "--out", str(root / "m"))
    assert r.returncode == 0, r.stderr
    return root / "m"


@pytest.fixture(scope="module", params=sorted(MAKERS))
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            hf_tokenizer_dir: Path) -> tuple[str, Path, Path]:  # noqa: F811
    """(the family, gptport's import of its tiny model, the model.f32.gguf export-gguf wrote of it)."""
    family = request.param
    model_dir = imported(tmp_path_factory.mktemp(f"gguf_{family}"), hf_tokenizer_dir, family)
    r = gptport("export-gguf", str(model_dir))
    assert r.returncode == 0, r.stderr
    return family, model_dir, model_dir / "model.f32.gguf"


def test_the_file_holds_what_llama_cpp_reads(written: tuple[str, Path, Path]) -> None:
    family, model_dir, path = written
    f = GGUFFile(path)
    assert f.text("general.architecture") == family
    ours = open_weights(model_dir)
    if family == "gemma2":
        assert (f.number("gemma2.attn_logit_softcapping"), f.number("gemma2.final_logit_softcapping")) == (4.0, 100.0)
        assert f.integer("gemma2.attention.sliding_window") == 8
        assert f.value("gemma2.attention.sliding_window_pattern") == [True, False, True, False]
        assert "output.weight" not in f.tensors and f.integer("gemma2.attention.key_length") == 16
        assert np.array_equal(f.dequantize("blk.1.post_ffw_norm.weight"), ours["h.1.ln_2_post.weight"])  # 1 + w
    elif family == "granite":
        assert [f.number(f"granite.{k}") for k in ("embedding_scale", "attention.scale", "residual_scale",
                                                   "logit_scale")] == [12.0, 0.2, 0.22, 3.0]
        assert "blk.0.attn_q.bias" in f.tensors and "blk.0.attn_output.bias" in f.tensors
    else:
        assert "blk.0.attn_norm.weight" not in f.tensors and "blk.0.post_attention_norm.weight" in f.tensors
        assert f.shape("blk.0.attn_k_norm.weight") == (32,)  # all kv heads' width, not one head's


def test_import_gguf_gives_back_the_same_model(written: tuple[str, Path, Path], tmp_path: Path) -> None:
    _, model_dir, path = written
    r = gptport("import-gguf", str(path), "--out", str(tmp_path / "again"))
    assert r.returncode == 0, r.stderr
    ours, again = (load_model(d, bpe.load(d))[1].model for d in (model_dir, tmp_path / "again"))
    assert again == ours
    a, b = open_weights(model_dir), open_weights(tmp_path / "again")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[n], b[n]) for n in a)


def _rewritten(src: Path, out: Path, drop: tuple[str, ...] = (), add: dict[str, object] | None = None,
               tensors: tuple[str, ...] = ()) -> Path:
    """`src`'s architecture keys (less `drop`, plus `add`: a bool, float or int each) and its tensors `tensors` (a
    model_config check needs no more)."""
    f = GGUFFile(src)
    name = f.text("general.architecture")
    w = gguf.GGUFWriter(out, arch=str(name))
    for key in f.keys:
        if key.startswith(f"{name}.") and key not in drop and not isinstance(f.value(key), list):
            value = f.value(key)
            (w.add_float32 if isinstance(value, float) else w.add_uint32)(key, value)  # type: ignore[operator]
    for key, value in (add or {}).items():
        {bool: w.add_bool, float: w.add_float32, int: w.add_uint32}[type(value)](key, value)  # type: ignore[operator]
    for t in tensors:
        w.add_tensor(t, f.dequantize(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _config(path: Path, family: str) -> object:
    return model_config(GGUFFile(path), arch.from_gguf(family), 50, Specials(None, False, (), 0))  # type: ignore[arg-type]


def test_llama_cpps_defaults_are_read_where_a_key_is_absent(written: tuple[str, Path, Path], tmp_path: Path) -> None:
    """gemma2: caps 50 and 30, a window of 4096 (none, past a context of 64); granite: no scale but the logits'."""
    family, _, path = written
    if family == "olmo2":
        pytest.skip("olmo2 has no keys of its own")
    keys = {"gemma2": ("attn_logit_softcapping", "final_logit_softcapping", "attention.sliding_window"),
            "granite": ("embedding_scale", "attention.scale", "residual_scale")}[family]
    cfg = _config(_rewritten(path, tmp_path / "d.gguf", tuple(f"{family}.{k}" for k in keys)), family)
    if family == "gemma2":
        assert (cfg.attn_softcap, cfg.final_softcap, cfg.sliding_window, cfg.window_layers) == (50.0, 30.0, 0, ())
    else:
        assert (cfg.embed_scale, cfg.attn_scale, cfg.residual_scale, cfg.logits_divisor) == (1.0, 0.0, 1.0, 3.0)


@pytest.mark.parametrize(("family", "key", "value", "message"), [
    ("granite", "granite.rope.scaling.finetuned", False, "granite.rope.scaling.finetuned is false"),
    ("olmo2", "olmo2.attention.sliding_window", 8, "metadata olmo2.attention.sliding_window is not a key gptport "
                                                   "knows"),
])
def test_a_key_that_changes_the_computation_is_refused(family: str, key: str, value: object, message: str,
                                                       written: tuple[str, Path, Path], tmp_path: Path) -> None:
    if written[0] != family:
        pytest.skip(f"a {family} file's key")
    with pytest.raises(InputError, match=message):
        _config(_rewritten(written[2], tmp_path / "k.gguf", add={key: value}), family)


def test_an_output_tensor_llama_cpps_gemma2_never_reads_is_refused(written: tuple[str, Path, Path],
                                                                    tmp_path: Path) -> None:
    family, _, path = written
    if family != "gemma2":
        pytest.skip("gemma2's tied head")
    f = GGUFFile(path)
    out = tmp_path / "o.gguf"
    w = gguf.GGUFWriter(out, arch="gemma2")
    for key in ("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count"):
        w.add_uint32(f"gemma2.{key}", f.integer(f"gemma2.{key}"))
    w.add_tensor("output.weight", f.dequantize("token_embd.weight"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(InputError, match="tensor output.weight, which llama.cpp's gemma2 never reads"):
        _config(out, "gemma2")


@pytest.mark.parametrize(("family", "change", "message"), [
    ("gemma2", {"tie_word_embeddings": False}, "an untied head (llama.cpp's gemma2 computes the logits with "
                                               "token_embd)"),
    ("gemma2", {"query_pre_attn_scalar": 24}, "softmax scale 0.204124, not the 0.25 llama.cpp's gemma2 derives"),
    ("olmo2", {"attention_bias": True}, "attention biases (llama.cpp's olmo2 has no output bias)"),
    ("olmo2", {"tie_word_embeddings": True}, "a tied head (llama.cpp's olmo2 reads the head"),
])
def test_what_llama_cpp_cannot_compute_is_refused_by_name(family: str, change: dict[str, object], message: str,
                                                          tmp_path: Path, hf_tokenizer_dir: Path) -> None:  # noqa: F811
    def make(out: Path, tok: Path) -> Path:
        if family == "gemma2":
            return make_gemma2(out, tok, **{"tie_word_embeddings": True, "query_pre_attn_scalar": 16, **change})
        return fc.make("Olmo2Config", "Olmo2ForCausalLM", out, tok, _vocab(tok), 1.0,
                       **{"attention_bias": False, "tie_word_embeddings": False, **change})

    model_dir = imported(tmp_path, hf_tokenizer_dir, family, make)
    assert_one_line_error(gptport("export-gguf", str(model_dir)), 1, message)
    assert not list(model_dir.glob("*.gguf"))
