"""Importing gptport and its torch-free modules loads neither torch nor onnxruntime."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["gptport", "gptport.tokenizer", "gptport.corpus", "gptport.cli.main"])
def test_import_loads_no_heavy_framework(module: str) -> None:
    code = (f"import sys, {module}; "
            "heavy = [m for m in ('torch', 'onnxruntime') if m in sys.modules]; "
            "print(','.join(heavy))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "", f"{module} imported {r.stdout.strip()}"
