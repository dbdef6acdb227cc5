"""export --cuda: the one-token decode graph (fp32, TensorScatter + Attention-24) matches torch on every
config variant and is refused when it writes one position off; the fp16 static-cache graph passes the
fp16 gate on the CPU; both are recorded like the other graphs; the options are checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from gptport import contract
from gptport.config import ModelConfig
from gptport.errors import UsageError, ValidationError
from gptport.export import cuda_graphs, decode_check, gqa_graph, validate
from gptport.export.tolerance import Tolerance
from gptport.runtime.onnx_engine import file_metadata
from tests.support.cli import assert_one_line_error, gptport

DECODE = contract.onnx_file("fp32", contract.CACHE_DECODE)
HALF = contract.onnx_file("fp16", contract.CACHE_STATIC)


def decode_session(model: Any) -> ort.InferenceSession:
    weights = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    proto = cuda_graphs.build_decode(model.cfg, weights)
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def test_every_config_variant_matches_torch(exported: tuple[Path, Any, Any]) -> None:
    _, model, _ = exported
    rows = decode_check.decode_parity(model, decode_session(model), Tolerance())
    assert len(rows) == 2 and all(r.ok and r.top1 == 1.0 for r in rows), rows


def test_the_graph_has_fixed_shapes_and_no_attention_of_its_own(exported: tuple[Path, Any, Any]) -> None:
    """What CUDA graphs need: one token per row, the whole buffer read (no Slice to the longest row)."""
    _, model, _ = exported
    weights = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    proto = cuda_graphs.build_decode(model.cfg, weights)
    ops = {n.op_type for n in proto.graph.node}
    assert {"TensorScatter", "Attention"} <= ops and not ops & {"GroupQueryAttention", "Slice", "Shape"}
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in proto.graph.input}
    assert dims[contract.INPUT_IDS] == [contract.BATCH, 1] and contract.TOTAL_SEQUENCE_LENGTH not in dims


def shifted(proto: onnx.ModelProto, by: int) -> onnx.ModelProto:
    """The decode graph with every TensorScatter writing `by` positions past seqlens_k."""
    graph = proto.graph
    graph.initializer.append(onnx.numpy_helper.from_array(np.array([by], dtype=np.int64), "shift"))
    cast = next(n for n in graph.node if n.op_type == "Cast" and n.input[0] == contract.SEQLENS_K)
    graph.node.insert(list(graph.node).index(cast) + 1, helper.make_node("Add", [cast.output[0], "shift"], ["off"]))
    for node in graph.node:
        if node.op_type == "TensorScatter":
            node.input[2] = "off"
    return proto


def test_a_graph_writing_one_position_off_is_refused(exported: tuple[Path, Any, Any]) -> None:
    _, model, _ = exported
    weights = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    proto = shifted(cuda_graphs.build_decode(model.cfg, weights), 1)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    first = decode_check.cases(model.cfg.n_ctx)[:1]  # rows at lengths 5, 1 and 11: its numbers are off
    with pytest.raises(ValidationError, match="decode graph parity failed on case 3 rows at lengths 5, 1 and 11"):
        validate.refuse("decode graph parity", decode_check.decode_parity(model, session, Tolerance(), which=first))
    with pytest.raises(ValidationError, match="the decode graph failed on case 2 rows"):  # the full row: out of bounds
        decode_check.decode_parity(model, session, Tolerance())


def test_grouped_kv_heads_are_refused_by_name() -> None:
    config = ModelConfig(vocab_size=64, n_ctx=16, d_model=64, n_layer=1, n_head=4, n_kv_head=2)
    assert "2 key/value heads for 4 query heads" in cuda_graphs.unsupported(config)
    with pytest.raises(UsageError, match="no decode graph: 2 key/value heads"):
        cuda_graphs.build_decode(config, {})


def test_export_cuda_writes_and_records_both(trained_dir: Path, tmp_path: Path) -> None:
    import shutil

    out = tmp_path / "m"
    shutil.copytree(trained_dir, out)
    r = gptport("export", str(out), "--precision", "fp32,fp16", "--cuda", "--force")
    assert r.returncode == 0, r.stderr
    assert "decode graph (model.decode.onnx) against torch" in r.stderr and "fp16 static-cache graph" in r.stderr
    decode, half = file_metadata(out / DECODE), file_metadata(out / HALF)
    assert (decode[contract.META_CACHE], decode[contract.META_PRECISION]) == (contract.CACHE_DECODE, "fp32")
    assert (half[contract.META_CACHE], half[contract.META_PRECISION]) == (contract.CACHE_STATIC, "fp16")
    assert decode[contract.META_GATED] == half[contract.META_GATED] == "true"
    assert decode[contract.META_WEIGHTS] == file_metadata(out / "model.onnx")[contract.META_WEIGHTS]
    assert DECODE in contract.graph_files() and HALF in contract.graph_files()  # removed when the weights change
    types = {i.name: i.type.tensor_type.elem_type for i in onnx.load(str(out / HALF)).graph.input}
    assert types[contract.past_names(1)[0]] == onnx.TensorProto.FLOAT16
    again = gptport("export", str(out), "--cuda", "--no-static")
    assert_one_line_error(again, 2, "--cuda --no-static")


def test_each_residual_and_its_norm_are_one_node(exported: tuple[Path, Any, Any]) -> None:
    """The CUDA graphs write a residual sum, its projection's bias and the norm after it as one
    SkipLayerNormalization (one kernel where the CPU's graphs launch three); the CPU's keep them apart."""
    _, model, _ = exported
    cfg = model.cfg
    weights = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    first = 0 if cfg.pos_encoding == "rope" else 1  # the position table is the first layer's sum
    for proto in (cuda_graphs.build_decode(cfg, weights), gqa_graph.build(cfg, weights, cuda_graphs.CUDA_FORMS)):
        ops = [n.op_type for n in proto.graph.node]
        assert ops.count("SkipLayerNormalization") == 2 * cfg.n_layer - 1 + first
        assert ops.count("LayerNormalization") == 2 - first  # ln_f (and a rope model's first ln_1)
    cpu = [n.op_type for n in gqa_graph.build(cfg, weights).graph.node]
    assert "SkipLayerNormalization" not in cpu and cpu.count("LayerNormalization") == 2 * cfg.n_layer + 1
