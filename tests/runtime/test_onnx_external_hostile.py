"""An ONNX graph whose external data lies outside its directory (a `../` location, an absolute one, a symlink
leading out) is refused by gptport/runtime/external_data.py in one line naming the graph and the location, before
onnxruntime or onnx reads any of it: through the loader every command opens a graph with, and through `gptport
generate`. A graph without external data costs one scan of its bytes, no parse."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gptport import contract
from gptport.errors import ArtifactError
from gptport.runtime import external_data
from gptport.runtime.onnx_engine import load
from tests.support.cli import assert_one_line_error, gptport


def matmul_graph(model_dir: Path) -> Path:
    """A one-MatMul graph whose weight lies in model.onnx.data beside it (and a copy in sub/w.data)."""
    model_dir.mkdir(parents=True)
    weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, str(model_dir / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)
    (model_dir / "sub").mkdir()
    shutil.copy(model_dir / "model.onnx.data", model_dir / "sub" / "w.data")
    return model_dir / "model.onnx"


def relocated(graph: Path, location: str, name: str = "evil.onnx") -> Path:
    """`graph` saved beside itself as `name`, every external tensor's location set to `location`."""
    proto = onnx.load(str(graph), load_external_data=False)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    out = graph.with_name(name)
    onnx.save(proto, str(out))
    return out


@pytest.fixture
def graph(tmp_path: Path) -> Path:
    path = matmul_graph(tmp_path / "m")
    (tmp_path / "secret.data").write_bytes((tmp_path / "m" / "model.onnx.data").read_bytes())
    (tmp_path / "m" / "link.data").symlink_to(tmp_path / "secret.data")
    (tmp_path / "m" / "up").symlink_to(tmp_path)
    return path


CASES = {  # location -> why it is refused
    "../secret.data": "it climbs out with `..`",
    "sub/../../secret.data": "it climbs out with `..`",
    "link.data": "a symlink leads out",
    "up/secret.data": "a symlink leads out",
    "": "the location is empty",
}


@pytest.mark.parametrize("location", [*CASES, "ABSOLUTE"])
def test_external_data_outside_the_directory_is_refused_before_onnxruntime(graph: Path, location: str) -> None:
    location = str(graph.parent.parent / "secret.data") if location == "ABSOLUTE" else location
    evil = relocated(graph, location)
    with pytest.raises(ArtifactError) as e:
        load(evil)
    why = CASES.get(location, "an absolute path")
    assert str(e.value) == (f"{evil}: the external data of tensor w, {location!r}, lies outside the graph's directory "
                            f"({why}); refusing to open it")


@pytest.mark.parametrize("location", ["model.onnx.data", "sub/w.data", "sub/../model.onnx.data"])
def test_external_data_inside_the_directory_is_read(graph: Path, location: str) -> None:
    """The check passes these on to onnxruntime, which then says why the graph is no gptport graph (its
    metadata), not where its data lies."""
    evil = relocated(graph, location)
    assert external_data.locations(evil) == [("w", location)]
    external_data.check(evil)
    with pytest.raises(ArtifactError) as e:
        load(evil)
    assert "external data" not in str(e.value)


def test_what_onnx_itself_refuses(graph: Path) -> None:
    """onnx 1.23's loader refuses the same locations on its own (the check holds whatever version is installed)."""
    for location in ("../secret.data", "link.data", str(graph.parent.parent / "secret.data")):
        with pytest.raises(onnx.checker.ValidationError):
            onnx.load(str(relocated(graph, location)))


def test_a_graph_without_external_data_is_only_scanned(trained_dir: Path) -> None:
    """gptport's own graphs under 2 GB hold their weights: no `location` bytes, so no parse."""
    assert not external_data.mentions_external_data(trained_dir / "model.onnx")
    external_data.check(trained_dir / "model.onnx")


def test_generate_refuses_a_model_directory_whose_graph_reads_outside_it(trained_dir: Path, tmp_path: Path) -> None:
    """A model directory whose graph (the static-cache one, which generate opens) keeps its weights in
    ../DATA: `gptport generate` exits 1 with one line naming the graph and the location, no traceback."""
    model_dir = tmp_path / "m"
    shutil.copytree(trained_dir, model_dir)
    graph = model_dir / contract.onnx_file("fp32", contract.CACHE_STATIC)
    onnx.save(onnx.load(str(graph)), str(graph), save_as_external_data=True, location="w.data", size_threshold=0)
    (model_dir / "w.data").rename(tmp_path / "w.data")
    relocated(graph, "../w.data", graph.name)
    r = gptport("generate", str(model_dir), "ka", "--max-new-tokens", "2")
    assert_one_line_error(r, 1, f"{graph}: the external data of tensor",
                          "'../w.data', lies outside the graph's directory (it climbs out with `..`)")
    assert len(r.stderr.strip().splitlines()) == 1
