"""A static-cache graph built after the contract graph of the same weights and scheme copies the weights that graph
wrote (tensor_sink.ExternalSink's `earlier`) instead of reading, converting or quantizing them again: its data file
is its own, and its initializers are byte for byte what it builds alone, for every family and scheme."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from safetensors.numpy import save_file

from gptport.export import contract_graph, gqa_graph, graph_write, nbits
from gptport.export.nbits import NBits
from gptport.weights import ModelWeights
from tests.export.test_builder import CHOICES, random_model, weights_of

SCHEMES = [None, NBits(4, 32, 4, True), NBits(8, 32, 0, False)]


def _tensors(path: Path) -> dict[str, bytes]:
    proto = onnx.load(str(path))  # its external data read: only its own file
    return {t.name: numpy_helper.to_array(t).tobytes() for t in proto.graph.initializer}


@pytest.mark.parametrize("scheme", SCHEMES, ids=["fp32", "int4", "int8-zp"])
@pytest.mark.parametrize("change", [c for c in CHOICES if c.get("pos_encoding") == "rope"] + [{}],
                         ids=lambda c: ",".join(c) or "gpt2")
def test_the_static_graph_copies_the_contract_graphs_weights_exactly(change: dict[str, object],
                                                                     scheme: NBits | None, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    model = random_model(**change)
    cfg, weights = model.cfg, weights_of(model)
    if gqa_graph.unsupported(cfg):
        pytest.skip(f"no static-cache graph for this config: {gqa_graph.unsupported(cfg)}")
    alone, contract, reused = tmp_path / "alone.onnx", tmp_path / "model.onnx", tmp_path / "model.static.onnx"
    graph_write.write(alone, lambda s: gqa_graph.build(cfg, weights, sink=s, nbits=scheme), {}, True)
    made = graph_write.write(contract, lambda s: contract_graph.build(cfg, weights, s, scheme), {}, True)
    assert made is not None and made.unchanged()
    quantized = []
    real_slabs = nbits.slabs
    monkeypatch.setattr("gptport.export.graph_body.slabs", lambda w, q: quantized.append(w.shape) or real_slabs(w, q))
    save_file(weights, str(tmp_path / "model.safetensors"))
    stored, read = ModelWeights(tmp_path / "model.safetensors"), []
    real_read = ModelWeights.__getitem__
    monkeypatch.setattr(ModelWeights, "__getitem__", lambda self, n: read.append(n) or real_read(self, n))
    graph_write.write(reused, lambda s: gqa_graph.build(cfg, stored, sink=s, nbits=scheme), {}, True, earlier=made)
    assert quantized == [] and [n for n in read if len(stored.shape(n)) == 2] == []  # the contract graph's
    assert reused.with_name("model.static.onnx.data").stat().st_nlink == 1  # a file of its own (onnx refuses links)
    onnx.checker.check_model(str(reused), full_check=True)
    want, got = _tensors(alone), _tensors(reused)
    assert sorted(got) == sorted(want) and all(got[n] == want[n] for n in want)


def test_a_contract_graph_written_again_is_not_reused(tmp_path: Path) -> None:
    model = random_model(pos_encoding="rope", n_kv_head=2)
    cfg, weights = model.cfg, weights_of(model)
    contract = tmp_path / "model.onnx"
    made = graph_write.write(contract, lambda s: contract_graph.build(cfg, weights, s), {}, True)
    graph_write.write(contract, lambda s: contract_graph.build(cfg, weights, s, NBits(4, 32, 4, True)), {}, True)
    assert made is not None and not made.unchanged()  # another file under the same name: its offsets are not these
    static = tmp_path / "model.static.onnx"
    graph_write.write(static, lambda s: gqa_graph.build(cfg, weights, sink=s), {}, True, earlier=made)
    alone = tmp_path / "alone.onnx"
    graph_write.write(alone, lambda s: gqa_graph.build(cfg, weights, sink=s), {}, True)
    want, got = _tensors(alone), _tensors(static)
    assert all(np.array_equal(got[n], want[n]) for n in want)
