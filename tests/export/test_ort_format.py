"""`gptport export --ort-format`: ONNX Runtime's own format beside the contract graphs, checked like every
graph (fp32 within the export gate's relative bound of the .onnx and greedy tokens equal; int8 through
the gate), the level and the onnxruntime version recorded, the minimal build's operator config written,
and a file of another onnxruntime version refused in one line; for a GPT and for a Llama-family model
(RMSNorm, rotary positions, SwiGLU, 2 key/value heads for 4)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from gptport import contract, paths
from gptport.errors import ArtifactError
from gptport.export.ort_format import ORT_TOL
from gptport.export.tolerance import compare
from gptport.runtime.engine import empty_past, positions
from gptport.runtime.onnx_engine import load_cpu
from gptport.runtime.ort_file import META_LEVEL, META_RUNTIME, metadata
from tests.support.cli import assert_one_line_error, gptport

pytestmark = pytest.mark.slow


LLAMA = {"norm": "rmsnorm", "mlp": "swiglu", "pos_encoding": "rope", "bias": False, "n_kv_head": 2,
         "tie_embeddings": False}


@pytest.fixture(scope="module", params=["gpt", "llama"])
def ort_dir(request: pytest.FixtureRequest, trained_dir: Path, tmp_path_factory: pytest.TempPathFactory,
            tokenizer_dir: Path, corpus_file: Path) -> Path:
    from tests.conftest import build_model_dir

    d = tmp_path_factory.mktemp("ort") / "m"
    if request.param == "gpt":
        shutil.copytree(trained_dir, d)
    else:  # trained a little, so that greedy decoding and the int8 gate see real preferences
        build_model_dir(d, tokenizer_dir, corpus_file, steps=40, **LLAMA)
    r = gptport("export", str(d), "--precision", "fp32,int8", "--ort-format", "--force")
    assert r.returncode == 0, r.stderr
    assert "model.ort (level basic, from model.onnx): max |Δ| vs .onnx" in r.stderr
    assert "model.int8.ort (level basic, from model.int8.onnx): gate: top-1" in r.stderr
    return d


def test_files_metadata_and_operator_config(ort_dir: Path) -> None:
    for precision in ("fp32", "int8"):
        meta = metadata(ort_dir / contract.ort_file(precision))
        assert meta[META_LEVEL] == "basic" and meta[META_RUNTIME] == ort.__version__
        onnx_meta = load_cpu(ort_dir / contract.onnx_file(precision)).meta
        assert {k: meta[k] for k in onnx_meta} == onnx_meta  # provenance and contract carried over
    config = (ort_dir / paths.REQUIRED_OPERATORS).read_text()
    assert "ai.onnx" in config and "MatMul" in config


def test_fp32_ort_logits_within_the_gates_bound_of_onnx(ort_dir: Path) -> None:
    onnx_model, ort_model = load_cpu(ort_dir / "model.onnx"), load_cpu(ort_dir / "model.ort")
    cfg = onnx_model.config
    rng = np.random.default_rng(3)
    ids = rng.integers(0, cfg.vocab_size, size=(2, 9), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, :3] = 0  # a left-padded row
    past = empty_past(2, cfg.n_layer, cfg.n_kv_head, cfg.head_dim)
    (want, want_kv), (got, got_kv) = (m.step()(ids, mask, positions(mask), past) for m in (onnx_model, ort_model))
    assert compare("logits", got, want, ORT_TOL).ok
    assert all(compare("cache", g, w, ORT_TOL).ok for g, w in zip(got_kv, want_kv, strict=True))


def test_generate_on_the_ort_file_gives_the_onnx_tokens(ort_dir: Path) -> None:
    runs = {}
    for fmt in ("onnx", "ort"):
        r = gptport("generate", str(ort_dir), "ka to", "the", "--max-new-tokens", "24", "--kv-cache", "concat",
                    "--graph-format", fmt, "--json")
        assert r.returncode == 0, r.stderr
        runs[fmt] = [json.loads(line)["token_ids"] for line in r.stdout.splitlines()]
    assert runs["ort"] == runs["onnx"]
    assert_one_line_error(gptport("generate", str(ort_dir), "ka", "--graph-format", "ort", "--kv-cache", "static"),
                           2, "--graph-format ort", "concat")


def test_another_onnxruntime_versions_file_is_refused_in_one_line(ort_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "m"
    shutil.copytree(ort_dir, d)
    ours = ort.__version__.encode()
    other = b"0.00.0"[: len(ours)].ljust(len(ours), b"0")
    data = (d / "model.ort").read_bytes()  # the version in our metadata, and the producer's (the optimizer's)
    (d / "model.ort").write_bytes(data.replace(ours, other))  # as a file another onnxruntime wrote
    assert metadata(d / "model.ort")[META_RUNTIME] == other.decode()
    with pytest.raises(ArtifactError, match=f"written by onnxruntime {other.decode()}"):
        load_cpu(d / "model.ort")
    assert_one_line_error(gptport("generate", str(d), "ka", "--graph-format", "ort", "--kv-cache", "concat"), 1,
                           "model.ort", f"onnxruntime {other.decode()}", ort.__version__)


def test_missing_ort_file_and_bad_level(trained_dir: Path, tmp_path: Path) -> None:
    assert_one_line_error(gptport("generate", str(trained_dir), "ka", "--graph-format", "ort", "--kv-cache",
                                   "concat"), 1, "model.ort", "--ort-format")
    d = tmp_path / "m"
    shutil.copytree(trained_dir, d)
    assert_one_line_error(gptport("export", str(d), "--ort-format", "--ort-level", "max", "--force"), 2,
                           "--ort-level", "basic")
    assert not list(d.glob("*.ort"))
