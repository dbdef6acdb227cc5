"""The cache of torch -> ONNX traces (gptport/export/trace_cache.py): with GPTPORT_TRACE_CACHE naming a folder, a
model's second export reads the graph its first stored, byte for byte, and traces nothing; a change of any weight,
of the config or of the opset is another key; rule sets of a caller's own and an unset variable trace every time.
The suite runs with the cache on (tests/conftest.py), so the last test checks that too."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
import torch

from gptport.config import ModelConfig
from gptport.export import trace_cache
from gptport.export.torch_to_onnx import RULES, to_onnx
from gptport.training.model import GPT

SHAPE = {"vocab_size": 128, "n_ctx": 16, "d_model": 32, "n_layer": 1, "n_head": 4}


def model(seed: int = 0, **change: object) -> GPT:
    torch.manual_seed(seed)
    return GPT(ModelConfig(**{**SHAPE, **change})).eval()  # type: ignore[arg-type]


def counted(calls: list[int], proto: onnx.ModelProto) -> Callable[[], onnx.ModelProto]:
    """A trace() that says each call in `calls`."""
    def trace() -> onnx.ModelProto:
        calls.append(1)
        return proto
    return trace


def test_a_second_export_reads_the_first_ones_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(trace_cache.ENV, str(tmp_path / "traces"))
    m = model()
    first = to_onnx(m, 18)
    stored = list((tmp_path / "traces").glob("*.onnx"))
    assert [p.stem for p in stored] == [trace_cache.key(m, 18, "RULES")]
    calls: list[int] = []
    again = trace_cache.traced(m, 18, "RULES", counted(calls, onnx.ModelProto()))
    assert calls == [] and again.SerializeToString() == first.SerializeToString()
    assert not list((tmp_path / "traces").glob(".*tmp*"))  # nothing half-written left


def test_the_key_is_the_weights_the_config_and_the_opset() -> None:
    base = trace_cache.key(model(), 18, "RULES")
    assert trace_cache.key(model(), 18, "RULES") == base  # the same seeded weights: the same key
    nudged = model()
    with torch.no_grad():
        nudged.wte.weight[0, 0] += 1e-6  # one weight, the smallest change
    assert trace_cache.key(nudged, 18, "RULES") != base
    assert trace_cache.key(model(seed=1), 18, "RULES") != base
    assert trace_cache.key(model(n_ctx=32), 18, "RULES") != base  # the config (no weight's shape changes)
    assert trace_cache.key(model(), 19, "RULES") != base
    assert trace_cache.key(model(), 18, "default") != base


def test_unnamed_rules_and_no_folder_trace_each_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m, calls = model(), []
    monkeypatch.setenv(trace_cache.ENV, str(tmp_path))
    trace = counted(calls, onnx.ModelProto())
    trace_cache.traced(m, 18, None, trace)
    trace_cache.traced(m, 18, None, trace)
    monkeypatch.setenv(trace_cache.ENV, "")
    trace_cache.traced(m, 18, "RULES", trace)
    trace_cache.traced(m, 18, "RULES", trace)
    assert calls == [1, 1, 1, 1] and not list(tmp_path.iterdir())
    monkeypatch.setenv(trace_cache.ENV, str(tmp_path))
    to_onnx(m, 18, RULES[:3])  # a rule set of the caller's own: to_onnx names none, so nothing is stored
    assert not list(tmp_path.iterdir())


def test_the_suite_runs_with_a_cache_of_its_own() -> None:
    where = trace_cache.folder()
    assert where is not None and os.environ[trace_cache.ENV] == str(where), "tests/conftest.py sets it"
