"""The int8 schemes that split a graph's matrices (finer blocks for the head and the down projections) and the
per-token W8A8 rewrite, on small graphs built here: what each node became, and what it computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from gptport import contract, machine
from gptport.export import variants, w8a8

D, FFN, VOCAB = 64, 192, 96


def _graph(tmp_path: Path, layers: int = 2) -> Path:
    """x (1, M, D) through `layers` MLP pairs (D -> FFN -> D) and a head (D -> VOCAB) named logits."""
    rng = np.random.default_rng(0)
    inits, nodes, x = [], [], "x"
    for i in range(layers):
        inits += [numpy_helper.from_array((rng.standard_normal((D, FFN)) * 0.1).astype(np.float32), f"up{i}"),
                  numpy_helper.from_array((rng.standard_normal((FFN, D)) * 0.1).astype(np.float32), f"down{i}")]
        nodes += [helper.make_node("MatMul", [x, f"up{i}"], [f"h{i}"], name=f"mm_up{i}"),
                  helper.make_node("MatMul", [f"h{i}", f"down{i}"], [f"y{i}"], name=f"mm_down{i}")]
        x = f"y{i}"
    inits.append(numpy_helper.from_array((rng.standard_normal((D, VOCAB)) * 0.1).astype(np.float32), "head"))
    nodes.append(helper.make_node("MatMul", [x, "head"], [contract.LOGITS], name="mm_head"))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", 1, [1, "M", D])],
                              [helper.make_tensor_value_info(contract.LOGITS, 1, [1, "M", VOCAB])], inits)
    path = tmp_path / "chain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), str(path))
    return path


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _blocks(path: Path) -> dict[str, int]:
    """Each MatMulNBits node's block size, by the MatMul it replaced (its name without the quantizer's suffix)."""
    out = {}
    for n in onnx.load(str(path)).graph.node:
        if n.op_type == "MatMulNBits":
            block = next(a.i for a in n.attribute if a.name == "block_size")
            out[n.name.removesuffix("_Q8").removesuffix("_Q4")] = block
    return out


@pytest.mark.parametrize(("fine_down", "want"), [
    (False, {"mm_up0": 32, "mm_down0": 32, "mm_up1": 32, "mm_down1": 32, "mm_head": 16}),
    (True, {"mm_up0": 32, "mm_down0": 16, "mm_up1": 32, "mm_down1": 16, "mm_head": 16}),
])
def test_finer_blocks_go_to_the_head_and_the_down_projections(tmp_path: Path, fine_down: bool,
                                                              want: dict[str, int]) -> None:
    src, dst = _graph(tmp_path), tmp_path / "q.onnx"
    variants.quantize(src, dst, variants.Scheme("t", block=32, fine_block=16, fine_down=fine_down))
    assert _blocks(dst) == want
    x = np.random.default_rng(1).standard_normal((1, 5, D)).astype(np.float32)  # (1, M, D)
    ref, got = _run(src, x), _run(dst, x)
    assert np.abs(got - ref).max() < 0.02 * np.abs(ref).max()


def test_the_int8_ladder_tries_the_split_rung_between_block_32_and_block_16() -> None:
    ladder = variants.LADDER["int8"]
    split = ladder.index("nbits8-b32-acc4-smooth-fine16")
    assert ladder[split - 1] == "nbits8-b32-acc4-smooth" and ladder[split + 1] == "nbits8-b16-acc4-smooth"
    scheme = variants.SCHEMES[ladder[split]]
    assert (scheme.block, scheme.fine_block, scheme.fine_down, scheme.smooth) == (32, 16, True, 0.5)


# onnxruntime's u8 x s8 GEMM without VNNI (AVX2's vpmaddubsw) adds each pair of products in int16 and
# saturates with full-range weights: the scheme's numbers are wrong there (w8a8.py), measured on an AVX2 EPYC
VNNI = any(f in machine.describe().get("isa", []) for f in ("avx512_vnni", "avx_vnni", "amx_int8"))


@pytest.mark.skipif(not VNNI, reason="onnxruntime's u8 x s8 GEMM saturates without VNNI (no avx512_vnni, avx_vnni "
                    "or amx_int8 here): w8a8 is measured on VNNI CPUs only")
def test_w8a8_replaces_every_weight_matmul_and_stays_close(tmp_path: Path) -> None:
    src = _graph(tmp_path)
    proto = onnx.load(str(src))
    assert w8a8.rewrite(proto) == 5
    assert not [n for n in proto.graph.node if n.op_type == "MatMul"]
    assert sum(n.op_type == "MatMulInteger" for n in proto.graph.node) == 5
    dst = tmp_path / "w8a8.onnx"
    onnx.save(proto, str(dst))
    x = np.random.default_rng(2).standard_normal((1, 7, D)).astype(np.float32)  # (1, M, D)
    ref, got = _run(src, x), _run(dst, x)
    assert np.abs(got - ref).max() < 0.03 * np.abs(ref).max()


def test_w8a8_scales_each_row_on_its_own(tmp_path: Path) -> None:
    """A token with a huge channel leaves its neighbours' products as they were (one scale per tensor would
    quantize them to a few levels), and an all-zero row gives zeros, not NaN."""
    src = _graph(tmp_path, layers=1)
    proto = onnx.load(str(src))
    w8a8.rewrite(proto)
    dst = tmp_path / "w8a8.onnx"
    onnx.save(proto, str(dst))
    x = np.random.default_rng(3).standard_normal((1, 3, D)).astype(np.float32)  # (1, 3, D)
    alone = _run(dst, x)
    x_out = x.copy()
    x_out[0, 0, 5] = 1e4
    x_out[0, 2] = 0.0
    mixed = _run(dst, x_out)
    np.testing.assert_array_equal(mixed[0, 1], alone[0, 1])
    assert np.isfinite(mixed).all() and not mixed[0, 2].any()


def test_w8a8_quantizes_a_tensor_read_twice_once(tmp_path: Path) -> None:
    """q, k and v reading one norm's output (here two MatMuls of one input) share its quantization."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32), n) for n in ("a", "b")]
    nodes = [helper.make_node("MatMul", ["x", "a"], ["ya"], name="ma"),
             helper.make_node("MatMul", ["x", "b"], ["yb"], name="mb"), helper.make_node("Add", ["ya", "yb"], ["y"])]
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", 1, [2, D])],
                              [helper.make_tensor_value_info("y", 1, [2, D])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    assert w8a8.rewrite(proto) == 2
    kinds = [n.op_type for n in proto.graph.node]
    assert kinds.count("ReduceMax") == 1 and kinds.count("MatMulInteger") == 2


def test_w8a8_stores_a_shared_weight_once(tmp_path: Path) -> None:
    """A weight read by several MatMuls (a tied or repeated matrix) gets one int8 copy, not one per reader."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32), "w")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="m1"), helper.make_node("MatMul", ["h", "w"], ["y"],
                                                                                         name="m2")]
    graph = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("x", 1, [2, D])],
                              [helper.make_tensor_value_info("y", 1, [2, D])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    assert w8a8.rewrite(proto) == 2
    names = [i.name for i in proto.graph.initializer]
    assert len(names) == len(set(names)) and names.count("w_w8a8") == 1
