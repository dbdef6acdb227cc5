"""The variants' accuracy gate of a model past graph_write.external's size (lowered here by
GPTPORT_EXTERNAL_FROM_BYTES), run layer by layer (layer_gate.py): its numbers are validate.gate's on a model held in
torch; a trained model's int8/int4 variants pass it and record their rows; a broken variant fails it and is not
written; nothing is left behind. (The gate's text sampled from the model is refused: test_layer_check's fixture.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from gptport import contract
from gptport.export import contract_graph, exporter, gqa_graph, graph_write, layer_gate, validate, variants
from gptport.export.export_job import Job
from gptport.runtime.onnx_engine import OnnxModel, file_metadata
from tests.conftest import build_model_dir
from tests.export.test_builder import random_model, weights_of
from tests.export.test_layer_check import LLAMA
from tests.support.cli import gptport


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    """A Llama-family model trained for 150 steps (its data/val.bin the gate's text), no graph exported."""
    return build_model_dir(tmp_path_factory.mktemp("gated") / "m", tokenizer_dir, corpus_file, steps=150, **LLAMA)


def leftovers(d: Path) -> list[str]:
    return [p.name for p in d.iterdir() if ".tmp-" in p.name or ".piece" in p.name]


@pytest.mark.parametrize("cache", [contract.CACHE_CONCAT, contract.CACHE_STATIC])
def test_the_layer_by_layer_gate_gives_validate_gates_numbers(cache: str, tmp_path: Path) -> None:
    """An int4 graph of a model held in torch, gated both ways on the same windows: the same row within float
    noise; the reference's file is removed by close()."""
    model = random_model(**LLAMA)
    w, cfg = weights_of(model), model.cfg
    nbits = variants.direct("nbits4-b32-acc4-head8")
    path, taps = tmp_path / "model.int4.onnx", list[str]()
    build = contract_graph.build if cache == contract.CACHE_CONCAT else gqa_graph.build
    graph_write.write(path, lambda sink: build(cfg, w, sink=sink, nbits=nbits, residuals=taps), {}, True)
    windows = np.random.default_rng(0).integers(0, cfg.vocab_size, (3, cfg.n_ctx))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = validate.gate(model, OnnxModel(session, cfg, "int4", "", cache=cache), windows, "int4")
    ref = layer_gate.reference(tmp_path, cfg, w, windows)
    try:
        got = layer_gate.gate(ref, path, taps, cfg, w, cache == contract.CACHE_STATIC, "int4")
        assert ref.path.stat().st_size == windows.size * cfg.vocab_size * 4
    finally:
        ref.close()
    assert want.positions == got.positions == windows.size
    assert 0 < want.mean_kl and got.mean_kl == pytest.approx(want.mean_kl, rel=1e-5)
    assert got.top1 == pytest.approx(want.top1, abs=1.5 / windows.size)  # a near-tie may round either way
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_disk_without_room_for_the_reference_is_refused_before_it_is_written(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from collections import namedtuple

    from gptport.errors import UsageError

    model = random_model(**LLAMA)
    windows = np.zeros((2, model.cfg.n_ctx), np.int64)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(layer_gate.shutil, "disk_usage", lambda path: usage(1 << 40, 1 << 40, 1000))
    with pytest.raises(UsageError, match=rf"{tmp_path}: the accuracy gate keeps torch's logits on its 2 windows of 32 "
                                         r"tokens \(0.0 GiB\), and its disk has 0.0 GiB free"):
        layer_gate.reference(tmp_path, model.cfg, weights_of(model), windows)
    assert not list(tmp_path.iterdir())


def test_a_gated_large_export_passes_and_records_its_gate(trained: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "m"
    shutil.copytree(trained, out)
    monkeypatch.setenv("GPTPORT_EXTERNAL_FROM_BYTES", "1")
    r = gptport("export", str(out), "--precision", "fp32,int8,int4")
    assert r.returncode == 0, r.stderr
    assert "variants against fp32" in r.stderr and "✗" not in r.stderr
    rows = [line for line in r.stderr.splitlines() if "nbits" in line and "✓" in line]  # the gate's table
    assert [line.split("│")[1].strip() for line in rows] == ["int8", "int4", "int8 static", "int4 static"]
    for name in ("model.int8.onnx", "model.int4.onnx", "model.int8.static.onnx", "model.int4.static.onnx"):
        meta = file_metadata(out / name)
        assert meta[contract.META_GATED] == "true" and meta[contract.META_GATE_TEXT] == "data/val.bin", name
        assert (out / (name + ".data")).is_file()
    assert "nbits4-grid-acc4-head8 not tried" in r.stderr  # a scheme a large model cannot take: skipped, said
    assert not leftovers(out)


def test_a_broken_variant_fails_the_gate_and_is_not_written(trained: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The int8 graphs built from weights with one matrix scaled 3x (the fp32 graph from the true ones): every rung
    misses the gate, nothing of int8 is written or left behind, fp32 still is."""
    out = tmp_path / "m"
    shutil.copytree(trained, out)
    monkeypatch.setenv("GPTPORT_EXTERNAL_FROM_BYTES", "1")
    real_build = Job.build

    def build(self: Job, cache: str, path: Path, precision: str = "fp32", *args: object, **kw: object) -> None:
        if precision == "fp32":
            return real_build(self, cache, path, precision, *args, **kw)  # type: ignore[arg-type]
        true = self.weights
        self.weights = {**{k: true[k] for k in true}, "h.1.mlp.c_proj.weight": true["h.1.mlp.c_proj.weight"] * 3}
        try:
            return real_build(self, cache, path, precision, *args, **kw)  # type: ignore[arg-type]
        finally:
            self.weights = true

    monkeypatch.setattr(Job, "build", build)
    report = exporter.export(out, ["fp32", "int8"])
    assert report.gates and not any(g.ok for g in report.gates)
    assert {g.precision for g in report.gates} == {"int8"}  # the static twin is not made from a failed contract
    assert "int8" not in report.schemes
    assert sorted(p.name for p in out.glob("*.onnx")) == ["model.append.onnx", "model.onnx", "model.static.onnx"]
    assert not list(out.glob("*.int8.*")) and not leftovers(out)

