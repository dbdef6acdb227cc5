"""An ONNX graph of a model directory whose external data lies outside that directory (a `../` location, an absolute
one, a symlink leading out) is refused before any of it is read: onnxruntime (1.31) refuses each, and gptport's
loader says so in one line naming the graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gptport.errors import ArtifactError


def test_an_onnx_graph_whose_external_data_leaves_its_directory_is_refused(tmp_path: Path) -> None:
    """onnxruntime (1.31) refuses `../` and absolute locations and symlinks that lead out; gptport's loader says so
    in one line naming the graph."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from gptport.runtime.onnx_engine import load

    model_dir = tmp_path / "m"
    model_dir.mkdir()
    weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, str(model_dir / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)
    (tmp_path / "secret.data").write_bytes((model_dir / "model.onnx.data").read_bytes())
    (model_dir / "link.data").symlink_to(tmp_path / "secret.data")
    for location in ("../secret.data", str(tmp_path / "secret.data"), "link.data"):
        proto = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
        for entry in proto.graph.initializer[0].external_data:
            if entry.key == "location":
                entry.value = location
        evil = model_dir / "evil.onnx"
        onnx.save(proto, str(evil))
        with pytest.raises(ArtifactError) as e:
            load(evil)
        message = str(e.value)
        assert "\n" not in message and message.startswith(f"{evil}: onnxruntime cannot load it"), message
        assert "External data path" in message or "external data" in message.lower(), message
