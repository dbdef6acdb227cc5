"""`--provider openvino` without OpenVINO installed (tests/interop/openvino_check.py runs it for real, in an
environment of its own): which graphs it would take whole, the refusal of the others naming their nodes,
the install hint, and --fallback to the CPU. Also: exported graphs carry no Where(IsNaN) guard."""

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


def test_without_onnxruntime_openvino_the_error_says_what_to_install(unfused: Path) -> None:
    status = probe("openvino")
    assert not status.ok and "onnxruntime-openvino" in status.reason
    assert_one_line_error(gptport("generate", str(unfused), "ka", "--provider", "openvino"), 1,
                           "--provider openvino", "onnxruntime-openvino", "--fallback")
    r = gptport("generate", str(unfused), "ka", "--provider", "openvino", "--fallback", "--json",
                "--max-new-tokens", "8")
    assert r.returncode == 0, r.stderr
    assert "falling back to cpu" in r.stderr and json.loads(r.stdout)["provider"] == "cpu"
