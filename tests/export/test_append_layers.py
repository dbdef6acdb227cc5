"""The multi-row append graph of a model past graph_write.external's size (lowered here by
GPTPORT_EXTERNAL_FROM_BYTES): written, checked layer by layer (append_layers.py) against torch run one layer at a
time, and refused when it writes a row one place off or masks one key off, with nothing written; the graph that
passes serves the same tokens as the static-cache graph alone."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gptport import contract
from gptport.errors import ValidationError
from gptport.export import append_layers, exporter, graph_write, scatter_graph
from gptport.export.graph_body import Builder
from gptport.export.tolerance import Tolerance
from tests.conftest import build_model_dir
from tests.export.test_builder import random_model, weights_of
from tests.export.test_layer_check import LLAMA

Op = Callable[..., list[str]]
REAL_OP = Builder.op


def early_write(self: Builder, op_type: str, inputs: list[str], *args: Any, **kw: Any) -> list[str]:
    """TensorScatter writing each row that holds positions one place early (a row's offset off by one)."""
    if op_type == "TensorScatter":
        one, zero = self.const("one_i64", np.array(1, np.int64)), self.const("zero_i64", np.array(0, np.int64))
        early = REAL_OP(self, "Max", [REAL_OP(self, "Sub", [inputs[2], one])[0], zero])[0]  # (B,)
        inputs = [inputs[0], inputs[1], early]
    return REAL_OP(self, op_type, inputs, *args, **kw)


def short_mask(self: Builder, op_type: str, inputs: list[str], *args: Any, **kw: Any) -> list[str]:
    """Attention told each row holds one key fewer (a mask off by one: each query misses its own key)."""
    if op_type == "Attention":
        one = self.const("one_i64", np.array(1, np.int64))
        inputs = [*inputs[:6], REAL_OP(self, "Sub", [inputs[6], one])[0]]
    return REAL_OP(self, op_type, inputs, *args, **kw)


def _check(tmp_path: Path, budget: int = 1) -> list[bool]:
    """append_layers.check's rows (ok or not) for the append graph of a random Llama-family model, each layer its
    own piece by default."""
    model = random_model(**LLAMA)
    w, cfg, taps = weights_of(model), model.cfg, list[str]()
    path = tmp_path / "model.append.onnx"
    graph_write.write(path, lambda sink: scatter_graph.build(cfg, w, sink=sink, residuals=taps), {}, True)
    rows = append_layers.check(path, taps, cfg, w, Tolerance(), budget=budget)
    assert len(rows) == len(append_layers.cases(cfg.n_ctx)) and not [p for p in tmp_path.iterdir() if ".piece" in
                                                                      p.name]
    return [r.ok and r.top1 == 1.0 for r in rows]


@pytest.mark.parametrize("budget", [1, 2**30], ids=["a layer a piece", "one piece"])
def test_a_right_graph_passes(tmp_path: Path, budget: int) -> None:
    assert all(_check(tmp_path, budget))


@pytest.mark.parametrize("wrong", [early_write, short_mask], ids=["offset", "mask"])
def test_a_wrong_graph_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wrong: Op) -> None:
    monkeypatch.setattr(Builder, "op", wrong)
    assert not any(_check(tmp_path))


def test_the_chunks_are_serves_uneven_rows() -> None:
    """Each call packs every appending row's chunk, rows writing at their own lengths (as serve runs them)."""
    run = append_layers.plan([[7, 1, 12], [5, 0, 1]], 100, np.random.default_rng(0))
    assert [len(s) for s in run.seqs] == [12, 1, 13] and run.capacity == 12 + 5
    first, second = run.calls
    assert first[contract.INPUT_IDS].shape == (1, 20) and list(second[contract.WRITE_INDEX]) == [7, 1, 12]
    assert run.places[1] == {0: (0, 5), 2: (5, 1)}  # the second row appends nothing: it is not among them


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    """A Llama-family model directory (random weights), no graphs yet."""
    return build_model_dir(tmp_path_factory.mktemp("append") / "m", tokenizer_dir, corpus_file, steps=0, **LLAMA)


@pytest.fixture(scope="module")
def exported(large: Path) -> tuple[Path, exporter.ExportReport]:
    """`large` exported fp32 past the line: every graph in external data, checked layer by layer."""
    mp = pytest.MonkeyPatch()
    mp.setenv("GPTPORT_EXTERNAL_FROM_BYTES", "1")
    try:
        report = exporter.export(large, ["fp32"], gate=False)
    finally:
        mp.undo()
    return large, report


def test_past_the_line_the_append_graph_is_written_and_checked(exported: tuple[Path, exporter.ExportReport]) -> None:
    out, report = exported
    path = out / contract.onnx_file("fp32", contract.CACHE_APPEND)
    assert path.is_file() and path.with_name(path.name + ".data").is_file()
    assert report.files["fp32 append"] == path
    rows = report.append_parity
    assert len(rows) == 2 and all(r.ok and r.top1 == 1.0 for r in rows), rows
    assert {"layer 0 hidden", "layer 1 keys", "logits"} <= {c.quantity for c in rows[0].checks}


@pytest.mark.parametrize("wrong", [early_write, short_mask], ids=["offset", "mask"])
def test_past_the_line_a_wrong_append_graph_fails_and_writes_nothing(large: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch, wrong: Op
                                                                     ) -> None:
    out = tmp_path / "m"
    shutil.copytree(large, out, ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data"))
    monkeypatch.setenv("GPTPORT_EXTERNAL_FROM_BYTES", "1")
    monkeypatch.setattr(Builder, "op", wrong)  # TensorScatter and Attention-24 are the append graph's alone
    with pytest.raises(ValidationError, match="multi-row append graph parity failed on case"):
        exporter.export(out, ["fp32"], gate=False)
    assert not [p.name for p in out.iterdir() if ".onnx" in p.name or ".tmp-" in p.name or ".piece" in p.name]


def test_the_append_graph_serves_the_static_graphs_tokens(exported: tuple[Path, exporter.ExportReport]) -> None:
    """Prompts arriving together, prefilled in uneven chunks of several rows per run of the append graph, get the
    tokens the static-cache graph alone gives (one row a prefill)."""
    from gptport.runtime.choice import GraphChoice
    from gptport.runtime.loader import open_appender, open_model
    from gptport.runtime.sampling import Sampling
    from gptport.runtime.slots import StaticSlots
    from gptport.serve.engine.scheduler import Choice
    from tests.support.scheduling import Run

    out, _ = exported
    opened = open_model(out, GraphChoice.parse(cache="static"))
    appender = open_appender(out, opened.engine)
    assert appender is not None
    prompts = [[5 + i, 9, 14 + 2 * i, 3, 7 + i][:3 + i % 3] + list(range(20, 20 + i)) for i in range(5)]
    got: dict[bool, dict[str, list[int]]] = {}
    runs: list[int] = []
    for together in (False, True):
        engine = StaticSlots(opened.engine.session, opened.engine.config, 4,
                             appender=appender.session if together else None)
        if together:
            inner = engine.append_many

            def counted(slots: Any, chunks: Any, inner: Any = inner, **kw: Any) -> Any:
                runs.append(len(slots))
                return inner(slots, chunks, **kw)

            engine.append_many = counted  # type: ignore[method-assign]
        run = Run(engine, opened.tok, prefill_chunk=3)
        choices = [Choice(p, 6, Sampling(), ignore_eos=True, out=f"p{i}") for i, p in enumerate(prompts)]
        run.serve(choices, 500)
        got[together] = {str(c.out): list(c.new_ids) for c in choices}
    assert runs and max(runs) >= 2, runs  # several rows in one run of the append graph
    assert got[True] == got[False] and all(len(t) == 6 for t in got[True].values())
