"""What each engine declares it can do (engine.Capability) and the refusal a feature gets where its engine
lacks what it needs: the concat graph, the static-cache graphs (fp32 with the multi-row append graph's twin,
int8), export --cuda's graphs on the CPU, the torch engine; and no caller probes an engine for a method."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gptport import contract
from gptport.errors import UsageError
from gptport.runtime import cuda_engine
from gptport.runtime.engine import Capability, bursting, require
from gptport.runtime.onnx_engine import load_cpu
from gptport.runtime.speculative import static_model

C = Capability
PACKAGE = Path(__file__).resolve().parents[2] / "gptport"


def test_the_concat_graph_only_masks(trained_dir: Path) -> None:
    assert load_cpu(trained_dir / "model.onnx").capabilities == {C.CONSTRAIN}


def test_the_static_graphs_hold_slots_and_roll_drafts_back(trained_dir: Path) -> None:
    fp32 = load_cpu(trained_dir / contract.onnx_file("fp32", contract.CACHE_STATIC))
    assert fp32.capabilities == {C.CONSTRAIN, C.STATIC_SLOTS, C.DRAFT, C.APPEND_ROWS}
    int8 = load_cpu(trained_dir / contract.onnx_file("int8", contract.CACHE_STATIC))
    assert int8.capabilities == {C.CONSTRAIN, C.STATIC_SLOTS, C.DRAFT}  # no append graph is its twin


def test_device_graphs_burst_and_keep_their_slots(cuda_dir: Path) -> None:
    path = cuda_engine.graph_path(cuda_dir, "fp32", required=True)  # the one-token decode graph
    assert path is not None
    twin = load_cpu(cuda_dir / contract.onnx_file("fp32", contract.CACHE_APPEND))
    model = cuda_engine.on_device(load_cpu(path), twin, cuda_graph=False)
    assert model.capabilities == {C.CONSTRAIN, C.DEVICE_SLOTS, C.BURST}  # its drafts would need the static graph
    assert bursting(model) is None  # declared, but off until asked for
    model.bursts = 4
    assert bursting(model) is model


def test_the_torch_engine_only_masks(trained_dir: Path) -> None:
    from gptport.training.torch_engine import open_torch

    assert open_torch(trained_dir).engine.capabilities == {C.CONSTRAIN}


def test_a_feature_is_refused_naming_what_the_engine_lacks(trained_dir: Path) -> None:
    concat = load_cpu(trained_dir / "model.onnx")
    with pytest.raises(UsageError, match=r"^--draft needs drafts rolled back in place \(the static-cache graph\): "
                                         r"onnx engine, CPU provider"):
        static_model(concat, "--draft")
    with pytest.raises(UsageError, match=r"^bursts needs greedy bursts \(export --cuda's graphs on --provider cuda\)$"):
        require(concat, C.BURST, "bursts")
    assert bursting(concat) is None
    require(concat, C.CONSTRAIN, "a constraint")  # declared: no refusal


def test_no_module_probes_an_engine_for_a_member() -> None:
    probe = re.compile(r"\b(hasattr|getattr)\((self\.)?(engine|model|target|opened(\.engine)?|small)\b")
    found = [f"{p.relative_to(PACKAGE)}:{i}" for p in sorted(PACKAGE.rglob("*.py"))
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if probe.search(line)]
    assert found == [], "engines declare what they can do (engine.Capability): " + ", ".join(found)
