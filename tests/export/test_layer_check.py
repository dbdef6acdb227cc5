"""Export of a model past graph_write.external's size (lowered here by GPTPORT_EXTERNAL_FROM_BYTES): graphs in
external data, checked layer by layer against torch run one layer at a time (layer_check.py), decoding as torch
does; and the layer-by-layer check refusing a wrong graph (a weight off by 10%, a mask off by one, rotated
halves swapped)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gptport import contract
from gptport.config import ModelConfig
from gptport.errors import ValidationError
from gptport.export import contract_graph, graph_write, layer_check
from gptport.export.graph_body import Builder
from gptport.export.rope_graph import Rotary
from gptport.export.tolerance import Tolerance
from tests.conftest import build_model_dir
from tests.export.test_builder import random_model, weights_of
from tests.support.cli import assert_one_line_error, gptport

LLAMA = {"pos_encoding": "rope", "n_kv_head": 2, "norm": "rmsnorm", "mlp": "swiglu", "bias": False,
         "qkv_bias": True, "tie_embeddings": False}


@pytest.fixture(scope="module")
def streamed(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    """A Llama-family model (random weights) exported as a model too large for torch would be."""
    out = build_model_dir(tmp_path_factory.mktemp("streamed") / "m", tokenizer_dir, corpus_file, steps=0, **LLAMA)
    mp = pytest.MonkeyPatch()
    mp.setenv("GPTPORT_EXTERNAL_FROM_BYTES", "1")
    try:
        r = gptport("export", str(out), "--precision", "fp32,int8,int4", "--no-gate")
        assert r.returncode == 0, r.stderr
        refused = gptport("export", str(out), "--precision", "fp32,int8", "--force", "--gate-on-sampled-text")
    finally:
        mp.undo()
    assert_one_line_error(refused, 2, "--gate-on-sampled-text samples the whole torch model", "--heldout")
    return out


def test_every_graph_goes_to_external_data_and_nothing_else_is_left(streamed: Path) -> None:
    names = sorted(p.name for p in streamed.iterdir() if "onnx" in p.name)
    graphs = ["model.onnx", "model.int8.onnx", "model.int4.onnx", "model.static.onnx", "model.int8.static.onnx",
              "model.int4.static.onnx", "model.append.onnx"]
    assert names == sorted([*graphs, *(g + ".data" for g in graphs)])
    assert not [p for p in streamed.iterdir() if ".tmp-" in p.name or p.name.endswith(".check")]


@pytest.mark.parametrize("precision", ["fp32", "int8", "int4"])
@pytest.mark.parametrize("kv_cache", ["static", "concat"])
def test_each_graph_decodes(streamed: Path, precision: str, kv_cache: str) -> None:
    r = gptport("generate", str(streamed), "ka to", "--max-new-tokens", "8", "--precision", precision,
                "--kv-cache", kv_cache, "--json")
    assert r.returncode == 0, r.stderr
    import json

    assert json.loads(r.stdout.strip().splitlines()[-1])["token_ids"]


def test_fp32_decodes_torchs_greedy_tokens(streamed: Path) -> None:
    """generate's fp32 tokens are torch's (the whole model, here small enough to hold)."""
    import json

    from gptport import tokenizer as bpe
    from gptport.runtime.generate import generate
    from gptport.runtime.sampling import Sampling
    from gptport.training.checkpoint import load_model
    from gptport.training.torch_engine import TorchEngine

    tok = bpe.load(streamed)
    model, _ = load_model(streamed, tok)
    ids = tok.encode("ka to ri")
    want = generate(TorchEngine(model), [ids], 12, Sampling(), eot_id=-1)[0].new_ids
    r = gptport("generate", str(streamed), "ka to ri", "--max-new-tokens", "12", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])["token_ids"]  # (it stops early at the end token)
    assert got and got == list(want)[:len(got)]


@pytest.mark.parametrize("graph", ["model.onnx", "model.int4.onnx"])
def test_graphs_load_moved_and_from_another_directory(streamed: Path, tmp_path: Path, graph: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The data files are named relative to their graphs: a directory copied, then renamed, opens by a relative
    path from another working directory, and gives the same logits as in place (onnxruntime, gptport's loader)."""
    import os
    import shutil

    import onnxruntime as ort

    from gptport.runtime import onnx_engine
    from gptport.runtime.engine import positions

    def logits(path: Path) -> np.ndarray:
        engine = onnx_engine.load(path, "cpu")
        x = np.array([[5, 9, 2, 7]], dtype=np.int64)  # (1, T)
        mask = np.ones_like(x)
        return engine.step()(x, mask, positions(mask), engine.empty_past(1))[0]  # (1, T, V)

    want = logits(streamed / graph)
    shutil.copytree(streamed, tmp_path / "copy", ignore=shutil.ignore_patterns("*.safetensors"))
    os.rename(tmp_path / "copy", tmp_path / "moved")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    relative = Path("..") / "moved" / graph
    assert np.array_equal(logits(relative), want)
    session = ort.InferenceSession(str(relative), providers=["CPUExecutionProvider"])  # onnxruntime alone
    assert session.get_inputs()[0].name == "input_ids"


def _check(tmp_path: Path, build: Callable[..., object], weights: dict[str, np.ndarray], cfg: ModelConfig,
           truth: dict[str, np.ndarray]) -> list[bool]:
    """layer_check's rows (ok or not) for a graph built by `build` from `weights`, against a reference of `truth`."""
    path = tmp_path / "model.onnx"
    taps: list[str] = []
    graph_write.write(path, lambda sink: contract_graph.build(cfg, weights, sink, residuals=taps), {}, True)
    rows, _ = layer_check.check_contract(path, taps, cfg, truth, Tolerance(), layer_check.cases(cfg))
    return [r.ok for r in rows]


def test_a_right_graph_passes(tmp_path: Path) -> None:
    model = random_model(**LLAMA)
    w = weights_of(model)
    assert all(_check(tmp_path, contract_graph.build, w, model.cfg, w))


def test_a_weight_off_by_ten_percent_is_refused(tmp_path: Path) -> None:
    model = random_model(**LLAMA)
    truth = weights_of(model)
    wrong = {**truth, "h.1.mlp.c_fc.weight": truth["h.1.mlp.c_fc.weight"] * 1.1}
    assert not any(_check(tmp_path, contract_graph.build, wrong, model.cfg, truth))


def test_a_mask_off_by_one_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each query sees the key after it too (LessOrEqual against position + 1)."""
    model = random_model(**LLAMA)
    w = weights_of(model)
    real_op = Builder.op

    def op(self: Builder, op_type: str, inputs: list[str], *args: object, **kw: object) -> list[str]:
        if op_type == "LessOrEqual":
            one = self.const("one_more", np.array(1, np.int64))
            inputs = [inputs[0], real_op(self, "Add", [inputs[1], one])[0]]
        return real_op(self, op_type, inputs, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Builder, "op", op)
    assert not all(_check(tmp_path, contract_graph.build, w, model.cfg, w))


def test_rotated_halves_swapped_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = random_model(**LLAMA)
    w = weights_of(model)
    rotate = Rotary.rotate

    def swapped(self: Rotary, g: Builder, x: str, layer: int) -> str:
        half = self.config.head_dim // 2
        x1, x2 = g.op("Split", [x, g.const("rope_halves", np.array([half, half], np.int64))], 2, axis=-1)
        return rotate(self, g, g.op("Concat", [x2, x1], axis=-1)[0], layer)

    monkeypatch.setattr(Rotary, "rotate", swapped)
    assert not all(_check(tmp_path, contract_graph.build, w, model.cfg, w))


def test_taps_name_each_layers_output(tmp_path: Path) -> None:
    model = random_model(**LLAMA)
    taps: list[str] = []
    contract_graph.build(model.cfg, weights_of(model), residuals=taps)
    assert len(taps) == model.cfg.n_layer and contract.LOGITS not in taps


def test_a_graph_checked_in_pieces_of_one_layer_passes_and_decodes(tmp_path: Path) -> None:
    """Each layer its own piece (a budget of one byte): the contract and static-cache graphs pass, and both choose
    the reference's greedy tokens stepping their own caches."""
    from gptport.export import gqa_graph

    model = random_model(**LLAMA)
    w, cfg = weights_of(model), model.cfg
    paths, taps = {"contract": tmp_path / "model.onnx", "static": tmp_path / "model.static.onnx"}, {}
    for kind, build in (("contract", contract_graph.build), ("static", gqa_graph.build)):
        taps[kind] = []
        graph_write.write(paths[kind], lambda sink, b=build, t=taps[kind]: b(cfg, w, sink=sink, residuals=t), {},
                          True)
    checked = layer_check.cases(cfg)
    greedy = layer_check.Greedy([1, 2, 3], layer_check.reference_greedy(cfg, w, [1, 2, 3], 6))
    rows, n = layer_check.check_contract(paths["contract"], taps["contract"], cfg, w, Tolerance(), checked, greedy,
                                         budget=1)
    static_rows, static_n = layer_check.check_static(paths["static"], taps["static"], cfg, w, checked, Tolerance(),
                                                     greedy, budget=1)
    assert len(rows + static_rows) == 3 and all(r.ok and r.top1 == 1.0 for r in rows + static_rows)
    assert n == static_n == 6
    assert not [p for p in tmp_path.iterdir() if ".piece" in p.name]


def test_a_greedy_choice_the_reference_scores_far_below_its_best_is_refused(tmp_path: Path) -> None:
    """The greedy steps run in the same opening of the pieces as the parity cases: a step where the reference
    scores the graph's choice far below its own best is a ValidationError naming the step."""
    model = random_model(**LLAMA)
    w, cfg = weights_of(model), model.cfg
    path, taps = tmp_path / "model.onnx", list[str]()
    graph_write.write(path, lambda sink: contract_graph.build(cfg, w, sink, residuals=taps), {}, True)
    tokens, scores = layer_check.reference_greedy(cfg, w, [1, 2, 3], 4)
    wrong = scores.copy()
    wrong[2, tokens[2]] -= 10.0  # the reference "preferred" another token by far at step 2
    wrong[2, (tokens[2] + 1) % cfg.vocab_size] = scores[2].max() + 10.0
    with pytest.raises(ValidationError, match="greedy decoding differs from torch at new token 2"):
        layer_check.check_contract(path, taps, cfg, w, Tolerance(), layer_check.cases(cfg),
                                   layer_check.Greedy([1, 2, 3], (tokens, wrong)))
    assert layer_check.check_contract(path, taps, cfg, w, Tolerance(), layer_check.cases(cfg),
                                      layer_check.Greedy([1, 2, 3], (tokens, scores)))[1] == 4


def test_int4_alone_writes_no_fp32_graph_and_checks_a_slice(streamed: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """--precision int4 of a large model: the builder checked on its first layers, no fp32 graph written, the
    int4 graphs decode."""
    import shutil

    out = tmp_path / "m"
    shutil.copytree(streamed, out, ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data"))
    monkeypatch.setenv("GPTPORT_EXTERNAL_FROM_BYTES", "1")
    r = gptport("export", str(out), "--precision", "int4", "--no-gate")
    assert r.returncode == 0, r.stderr
    assert "the first 2 layers" in r.stderr
    assert sorted(p.name for p in out.glob("*.onnx")) == ["model.int4.onnx", "model.int4.static.onnx"]
    g = gptport("generate", str(out), "ka to", "--max-new-tokens", "4", "--precision", "int4")
    assert g.returncode == 0, g.stderr


def test_ort_format_is_refused_naming_why(streamed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--ort-format of a large model: refused in one line before anything is written (an .ort file holds its
    weights inside; onnxruntime 1.31 writes none past 2 GiB)."""
    import shutil

    out = tmp_path / "m"
    shutil.copytree(streamed, out, ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data"))
    monkeypatch.setenv("GPTPORT_EXTERNAL_FROM_BYTES", "1")
    r = gptport("export", str(out), "--precision", "fp32", "--ort-format")
    assert_one_line_error(r, 2, "--ort-format", "holds every weight inside it", "past 2 GiB")
    assert not [p for p in out.iterdir() if "onnx" in p.name or p.suffix == ".ort"]


def test_a_disk_too_small_is_refused_before_anything_is_written(streamed: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    from collections import namedtuple

    from gptport.errors import UsageError
    from gptport.export import exporter

    out = tmp_path / "m"
    shutil.copytree(streamed, out, ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data"))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(exporter.shutil, "disk_usage", lambda path: usage(1 << 40, 1 << 40, 1000))
    with pytest.raises(UsageError, match=r"export writes about .* GiB \(\d+ graphs\), and its disk has 0.0 GiB free"):
        exporter.export(out, ["fp32", "int4"], gate=False)
    assert not list(out.glob("*.onnx*"))


def test_too_little_memory_is_refused_in_one_line(streamed: Path) -> None:
    from gptport.errors import UsageError
    from gptport.export import exporter, streamed_steps
    from gptport.export.tolerance import Tolerance as Tol

    job = exporter._open(streamed, False, Tol(), lambda m: None)
    with pytest.raises(UsageError, match=r"exporting it needs about 1\.\d GiB of memory .* and 0\.0 GiB is free"):
        streamed_steps.check_memory(job, available=1000)
    streamed_steps.check_memory(job, available=1 << 40)  # enough: nothing said
