"""The multi-row append graph (model.append.onnx): export writes it beside the static-cache graph and gates
it on torch's numbers for every config variant; a graph that writes the cache one position off is refused
by that gate; it is recorded like the others (metadata, stale removal)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from gptport import contract
from gptport.errors import ValidationError
from gptport.export import append_check, validate
from gptport.export.tolerance import Tolerance
from gptport.runtime.onnx_engine import file_metadata, load_cpu

APPEND = contract.onnx_file("fp32", contract.CACHE_APPEND)


def test_every_config_variant_matches_torch(exported: tuple[Path, Any, Any]) -> None:
    out, model, _ = exported
    static = load_cpu(out / contract.onnx_file("fp32", contract.CACHE_STATIC))
    appender = load_cpu(out / APPEND)
    assert appender.cache == contract.CACHE_APPEND and appender.config == static.config
    rows = append_check.append_parity(model, static, appender.session, Tolerance())
    assert len(rows) == 2 and all(r.ok and r.top1 == 1.0 for r in rows), rows
    ops = {n.op_type for n in onnx.load(str(out / APPEND)).graph.node}
    assert {"TensorScatter", "Attention"} <= ops and "GroupQueryAttention" not in ops


def test_export_records_it_like_the_other_graphs(trained_dir: Path) -> None:
    meta = file_metadata(trained_dir / APPEND)
    assert meta[contract.META_CACHE] == contract.CACHE_APPEND and meta[contract.META_GATED] == "true"
    assert meta[contract.META_WEIGHTS] == file_metadata(trained_dir / "model.static.onnx")[contract.META_WEIGHTS]
    assert APPEND in contract.graph_files()  # removed with the others when the weights change


def shifted(path: Path, out: Path, by: int) -> Path:
    """The append graph at `path` with every TensorScatter writing `by` positions past its write_index."""
    proto = onnx.load(str(path))
    graph = proto.graph
    graph.initializer.append(onnx.numpy_helper.from_array(np.array([by], dtype=np.int64), "shift"))
    graph.node.insert(0, helper.make_node("Add", [contract.WRITE_INDEX, "shift"], ["write_index_shifted"]))
    for node in graph.node:
        if node.op_type == "TensorScatter":
            node.input[2] = "write_index_shifted"
    onnx.save(proto, str(out))
    return out


def test_a_graph_writing_one_position_off_is_refused(trained_dir: Path, tmp_path: Path) -> None:
    from gptport import tokenizer as bpe
    from gptport.training.checkpoint import load_model

    model, _ = load_model(trained_dir, bpe.load(trained_dir))
    static = load_cpu(trained_dir / "model.static.onnx")
    broken = ort.InferenceSession(str(shifted(trained_dir / APPEND, tmp_path / "broken.onnx", 1)),
                                  providers=["CPUExecutionProvider"])
    first = append_check.cases(model.cfg.n_ctx)[:1]  # rows far from n_ctx: the shifted write fits, and is wrong
    rows = append_check.append_parity(model, static, broken, Tolerance(), which=first)
    assert not rows[0].ok and rows[0].worst.ratio > 10, rows[0].worst.describe()
    with pytest.raises(ValidationError, match="multi-row append graph parity failed on case 3 rows"):
        validate.refuse("multi-row append graph parity", rows)
    with pytest.raises(ValidationError, match=r"failed on case 2 rows: .*TensorScatter.*exceeds"):
        append_check.append_parity(model, static, broken, Tolerance(), which=append_check.cases(model.cfg.n_ctx)[1:])
