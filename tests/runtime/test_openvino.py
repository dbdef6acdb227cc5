"""`--provider openvino` without OpenVINO installed (tests/interop/openvino_check.py runs it for real, in an
environment of its own): which graphs it would take whole (a GPT's and a Llama-family model's contract graphs
exported with --no-optimize), the refusal of the others naming their nodes and what to do, the install hint,
and --fallback to the CPU. Also: exported graphs carry no Where(IsNaN) guard."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

from gptport.errors import ArtifactError
from gptport.runtime import openvino
from gptport.runtime.providers import probe
from tests.support.cli import assert_one_line_error, gptport

pytestmark = pytest.mark.skipif(openvino.ORT_NAME in ort.get_available_providers(),
                                reason="onnxruntime-openvino is installed here: these tests are for its absence")


def ops(path: Path) -> Counter[str]:
    return Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


@pytest.fixture(scope="module")
def unfused(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ov") / "m"
    shutil.copytree(trained_dir, d)
    r = gptport("export", str(d), "--precision", "fp32,int8", "--no-optimize", "--no-static", "--force")
    assert r.returncode == 0, r.stderr
    return d


def test_exported_graphs_have_no_nan_guard(unfused: Path, trained_dir: Path) -> None:
    """The torch model's additive finite mask leaves no IsNaN in the graph (OpenVINO lacks it)."""
    for path in (unfused / "model.onnx", trained_dir / "model.onnx", unfused / "model.int8.onnx"):
        assert "IsNaN" not in ops(path), path


def test_openvino_takes_the_unfused_graphs_and_refuses_fused_ones(unfused: Path, trained_dir: Path) -> None:
    assert openvino.foreign_nodes(unfused / "model.onnx") == Counter()
    assert openvino.foreign_nodes(unfused / "model.int8.onnx") == Counter()  # MatMulNBits runs there
    fused = openvino.foreign_nodes(trained_dir / "model.onnx")  # export's default: --optimize
    assert fused[("com.microsoft", "SkipLayerNormalization")] > 0
    with pytest.raises(ArtifactError, match=r"cannot run these nodes \(SkipLayerNormalization x\d+.*--no-optimize"):
        openvino.check_graph(trained_dir / "model.onnx")


@pytest.fixture(scope="module")
def llama_unfused(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    from tests.conftest import build_model_dir

    d = build_model_dir(tmp_path_factory.mktemp("ov_llama") / "m", tokenizer_dir, corpus_file, steps=0,
                        norm="rmsnorm", mlp="swiglu", pos_encoding="rope", bias=False, n_kv_head=2,
                        tie_embeddings=False)
    r = gptport("export", str(d), "--precision", "fp32,int8", "--no-optimize", "--no-static", "--force")
    assert r.returncode == 0, r.stderr
    return d


def test_openvino_takes_a_llama_models_unfused_graphs(llama_unfused: Path) -> None:
    """RMSNorm, rotary positions, SwiGLU and grouped kv heads in standard operators (and MatMulNBits)."""
    for name in ("model.onnx", "model.int8.onnx"):
        assert openvino.foreign_nodes(llama_unfused / name) == Counter(), name
        assert "IsNaN" not in ops(llama_unfused / name)
    assert ops(llama_unfused / "model.int8.onnx")["MatMulNBits"] > 0


def test_a_static_cache_graph_is_refused_saying_to_use_the_contract_graph(trained_dir: Path) -> None:
    static = trained_dir / "model.static.onnx"
    assert openvino.foreign_nodes(static)[("com.microsoft", "GroupQueryAttention")] > 0
    with pytest.raises(ArtifactError, match=r"GroupQueryAttention x\d+.*static-cache graph.*--kv-cache concat"):
        openvino.check_graph(static)


def test_without_onnxruntime_openvino_the_error_says_what_to_install(unfused: Path) -> None:
    status = probe("openvino")
    assert not status.ok and "onnxruntime-openvino" in status.reason
    assert_one_line_error(gptport("generate", str(unfused), "ka", "--provider", "openvino"), 1,
                           "--provider openvino", "onnxruntime-openvino", "--fallback")
    r = gptport("generate", str(unfused), "ka", "--provider", "openvino", "--fallback", "--json",
                "--max-new-tokens", "8")
    assert r.returncode == 0, r.stderr
    assert "falling back to cpu" in r.stderr and json.loads(r.stdout)["provider"] == "cpu"
