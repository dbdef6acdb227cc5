"""Weights already on a 4-bit grid encoded exactly (export/grid.py): llama.cpp's Q4_0 and Q4_1 blocks (and blocks
that use only some of the 16 levels, as Q4_K's sub-blocks may) are found and rebuilt to float32 rounding, weights
off the grid are turned away (a single nudged value past the sampled columns included, and a matrix that is
constant along K), a scheme whose grid matrices are a small share of the weights does not apply, the encoded
MatMul gives the float product where requantizing the same weights does not, and `gptport export --precision
int4` of a Q4_1 GGUF import ships the exact encoding for the contract and static-cache graphs, while a model
trained here skips those rungs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gptport.export import grid, variants
from tests.support import gguf_files as gf
from tests.support.cli import gptport

K, N = 96, 160  # N past grid.SAMPLE_COLUMNS, so the whole matrix is checked after the sample


def on_grid(qtype: gf.Q, seed: int = 0) -> np.ndarray:
    """(K, N) weights as a GGUF of `qtype` stores them: rows of K quantized in blocks of 32, transposed to
    the (K, N) of a MatMul's weight."""
    w = np.random.default_rng(seed).standard_normal((N, K)).astype(np.float32) * 0.3 + 0.05
    return np.ascontiguousarray(gf.roundtrip(w, qtype).T)


@pytest.mark.parametrize("qtype", [gf.Q.Q4_0, gf.Q.Q4_1], ids=lambda q: q.name)
def test_gguf_4bit_blocks_are_found_and_rebuilt_exactly(qtype: gf.Q) -> None:
    w = on_grid(qtype)
    g = grid.find(w)
    assert g is not None
    assert g.q.shape == (K // 32, 32, N) and int(g.q.max()) <= 15
    rebuilt = (g.scale[:, None, :] * g.q + g.offset[:, None, :]).reshape(K, N)
    np.testing.assert_allclose(rebuilt, w, rtol=0, atol=float(np.abs(w).max()) * 1e-6)


def test_blocks_using_only_some_levels_are_found() -> None:
    """Q4_K's sub-blocks need not reach codes 0 and 15: a block whose values span 7 steps is still on a grid."""
    rng = np.random.default_rng(1)
    codes = rng.integers(3, 11, (K // 32, 32, N)).astype(np.float32)  # (nb, 32, N): 8 of the 16 levels
    codes[:, 0, :], codes[:, 1, :] = 3, 10
    scale = rng.uniform(0.01, 0.05, (K // 32, 1, N)).astype(np.float32)
    w = (scale * codes - 0.2).astype(np.float32).reshape(K, N)
    g = grid.find(w)
    assert g is not None
    rebuilt = (g.scale[:, None, :] * g.q + g.offset[:, None, :]).reshape(K, N)
    np.testing.assert_allclose(rebuilt, w, rtol=0, atol=1e-6)


def test_weights_off_the_grid_are_turned_away() -> None:
    rng = np.random.default_rng(2)
    assert grid.find(rng.standard_normal((K, N)).astype(np.float32)) is None  # trained weights
    q8 = np.ascontiguousarray(gf.roundtrip(rng.standard_normal((N, K)).astype(np.float32), gf.Q.Q8_0).T)
    assert grid.find(q8) is None  # 255 levels a block
    nudged = on_grid(gf.Q.Q4_1)
    nudged[40, N - 1] += 1e-3 * float(np.abs(nudged[32:64, N - 1]).max())  # past the sampled columns
    assert grid.find(nudged) is None
    assert grid.find(on_grid(gf.Q.Q4_1)[:80]) is None  # K not a multiple of the block
    assert grid.find(np.zeros((K, N), np.float32)) is None  # constant along K: nothing to keep exact


def matmuls(weights: dict[str, np.ndarray], lead: tuple[int, ...] = (2, 5)) -> onnx.ModelProto:
    """y_NAME = x @ W_NAME for each weight, all reading one (*lead, K) input."""
    nodes = [helper.make_node("MatMul", ["x", f"W_{n}"], [f"y_{n}"], name=f"mm_{n}") for n in weights]
    outputs = [helper.make_tensor_value_info(f"y_{n}", TensorProto.FLOAT, [*lead, w.shape[1]])
               for n, w in weights.items()]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, K])],
                              outputs, [numpy_helper.from_array(w, f"W_{n}") for n, w in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def run(proto: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})


@pytest.mark.parametrize("lead", [(2, 5), (7,)], ids=["(B, T, K)", "(T, K)"])
def test_the_encoded_matmul_gives_the_float_product(lead: tuple[int, ...], tmp_path: Path) -> None:
    weights = {"a": on_grid(gf.Q.Q4_1, 3), "b": on_grid(gf.Q.Q4_0, 4)}
    x = np.random.default_rng(5).standard_normal((*lead, K)).astype(np.float32) * 3  # (*lead, K)
    proto = matmuls(weights, lead)
    added = grid.encode(proto, accuracy_level=0)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("MatMulNBits") == 2 and ops.count("Add") == 2 and ops.count("ReduceSum") == 1
    assert sum(n.endswith("_grid_sum") for n in added) == 1  # one block sum for the input both read
    assert not {i.name for i in proto.graph.initializer} & {"W_a", "W_b"}  # the float weights are gone
    # nothing beside the weights' own codes, steps and offsets grows with K (no (K, K/32) indicator)
    assert max(int(np.prod(i.dims)) for i in proto.graph.initializer if "_grid_" not in i.name) <= len(lead) + 2
    for got, w in zip(run(proto, x), weights.values(), strict=True):
        want = x.astype(np.float64) @ w.astype(np.float64)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    # the check has teeth: the same weights quantized again onto a symmetric 4-bit grid are far off
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save_model(matmuls({"a": weights["a"]}, lead), str(src))
    variants.quantize(src, dst, variants.SCHEMES["nbits4-b32-acc0-head8"])
    want = x.astype(np.float64) @ weights["a"].astype(np.float64)
    assert np.abs(run(onnx.load(str(dst)), x)[0] - want).max() > 1e-2 * np.abs(want).max()


def test_a_weight_two_matmuls_share_is_encoded_once() -> None:
    w = on_grid(gf.Q.Q4_1, 7)
    nodes = [helper.make_node("MatMul", [x, "W"], [f"y_{x}"], name=f"mm_{x}") for x in ("x", "x2")]
    inputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [2, 5, K]) for x in ("x", "x2")]
    outputs = [helper.make_tensor_value_info(f"y_{x}", TensorProto.FLOAT, [2, 5, N]) for x in ("x", "x2")]
    proto = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(w, "W")]),
                              opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    grid.encode(proto, accuracy_level=0)
    names = [i.name for i in proto.graph.initializer]
    assert len(names) == len(set(names)) and sum(n.endswith("_grid_q4") for n in names) == 1
    rng = np.random.default_rng(8)
    feeds = {x: rng.standard_normal((2, 5, K)).astype(np.float32) for x in ("x", "x2")}
    got = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for y, x in zip(got, feeds.values(), strict=True):
        want = x.astype(np.float64) @ w.astype(np.float64)
        assert np.abs(y - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("on", [0, 1], ids=["none on the grid", "a small share on the grid"])
def test_grid_schemes_do_not_apply_to_weights_mostly_off_the_grid(on: int, tmp_path: Path) -> None:
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    trained = np.random.default_rng(6).standard_normal((K, N)).astype(np.float32)
    weights = {"a": trained, "b": trained[:, :100] * 2} | ({"c": on_grid(gf.Q.Q4_1)[:, :32]} if on else {})
    onnx.save_model(matmuls(weights), str(src))
    share = f"{on * 32 / (N + 100 + on * 32):.1%}"  # c's columns, if there, of all the columns of K rows
    for name in ("nbits4-grid-acc4-head8", "nbits4-grid-acc0-head8"):
        with pytest.raises(variants.NotApplicable, match=rf"^{re.escape(share)} of the MatMul weights lie on a "
                                                          rf"4-bit grid \({on} of {2 + on} matrices\)"):
            variants.quantize(src, dst, variants.SCHEMES[name])
        assert not dst.exists()


@pytest.mark.slow
def test_export_ships_the_exact_int4_of_a_q4_1_import(tmp_path: Path, tokenizer_dir: Path) -> None:
    from tokenizers import AddedToken, Tokenizer

    from gptport.export.exporter import export
    from tests.export.test_gguf_import import SPECIALS, hf_llama, write_llama

    tok: Any = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    path = write_llama(tmp_path / "m.gguf", hf_llama(tok.get_vocab_size(), "gqa-untied-llama3"), tok, gf.Q.Q4_1)
    model = tmp_path / "m"
    assert gptport("import-gguf", str(path), "--out", str(model)).returncode == 0
    said: list[str] = []
    report = export(model, ["fp32", "int4"], sampled_text=True, say=said.append)
    assert report.schemes["int4"].startswith("nbits4-grid-"), (report.schemes, report.gates)
    assert report.schemes["int4 static"] == report.schemes["int4"]
    for name in ("model.int4.onnx", "model.int4.static.onnx"):
        nodes = onnx.load(str(model / name)).graph.node
        grid_nodes = [n for n in nodes if n.op_type == "MatMulNBits" and n.name.endswith("_Q4_grid")]
        assert len(grid_nodes) >= 4 * 2 + 1, name  # every layer's matrices and the untied head
        assert not [n for n in nodes if n.op_type == "MatMulNBits" and n not in grid_nodes], name


def test_a_model_trained_here_skips_the_grid_rungs(tmp_path: Path, trained_dir: Path) -> None:
    import shutil

    from gptport.export.exporter import export

    model = tmp_path / "m"
    shutil.copytree(trained_dir, model)
    said: list[str] = []
    report = export(model, ["fp32", "int4"], static=False, force=True, say=said.append)
    skipped = [line for line in said if "does not apply" in line]
    assert [line.split(": ")[1].split()[0] for line in skipped] == list(variants.LADDER["int4"][:2])
    assert [(label, scheme) for label, scheme, _ in report.not_applied] == [
        ("int4", s) for s in variants.LADDER["int4"][:2]]
    assert all(why.startswith("0.0% of the MatMul weights lie on a 4-bit grid (0 of ") for *_, why in
               report.not_applied)
    assert report.schemes["int4"] == "nbits4-b32-awq-acc4-head8"  # the first requantizing rung (awq.py) passes
    assert [g.scheme for g in report.gates] == ["nbits4-b32-awq-acc4-head8"]
