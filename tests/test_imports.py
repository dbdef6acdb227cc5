"""Importing gptport loads neither torch nor onnxruntime; the inference modules never load torch."""

from __future__ import annotations

import subprocess
import sys

import pytest


def loaded_after_import(module: str) -> set[str]:
    code = (f"import sys, {module}; "
            "print(','.join(m for m in ('torch', 'onnxruntime') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(filter(None, r.stdout.strip().split(",")))


@pytest.mark.parametrize("module", ["gptport", "gptport.tokenizer", "gptport.corpus", "gptport.config",
                                    "gptport.contract", "gptport.cli.main"])
def test_import_loads_no_framework(module: str) -> None:
    assert loaded_after_import(module) == set()


INFERENCE_MODULES = ["gptport.engine", "gptport.onnx_engine", "gptport.static_cache", "gptport.loader",
                     "gptport.generate", "gptport.slots", "gptport.variants", "gptport.sampling", "gptport.detok",
                     "gptport.providers", "gptport.gqa_graph", "gptport.bench"]


@pytest.mark.parametrize("module", INFERENCE_MODULES)
def test_inference_modules_load_no_torch(module: str) -> None:
    assert "torch" not in loaded_after_import(module)
