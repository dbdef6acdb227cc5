"""Importing gptport loads neither torch nor onnxruntime; the inference modules never load torch."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest


def loaded_after_import(module: str) -> set[str]:
    code = (f"import sys, {module}; "
            "print(','.join(m for m in ('torch', 'onnxruntime') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(filter(None, r.stdout.strip().split(",")))


@pytest.mark.parametrize("module", ["gptport", "gptport.tokenizer", "gptport.corpus", "gptport.config",
                                    "gptport.contract", "gptport.provenance", "gptport.cli.main"])
def test_import_loads_no_framework(module: str) -> None:
    assert loaded_after_import(module) == set()


INFERENCE_MODULES = ["gptport.engine", "gptport.onnx_engine", "gptport.static_cache", "gptport.loader",
                     "gptport.generate", "gptport.slots", "gptport.variants", "gptport.sampling", "gptport.detok",
                     "gptport.providers", "gptport.gqa_graph", "gptport.bench", "gptport.gguf_export",
                     "gptport.serve.app", "gptport.serve.server", "gptport.serve.scheduler", "gptport.serve.loadgen",
                     "gptport.cli.serve_cmd", "gptport.cli.bench_serve_cmd", "gptport.serve.proxy_errors",
                     "gptport.serve.ray_cluster"]


@pytest.mark.parametrize("module", INFERENCE_MODULES)
def test_inference_modules_load_no_torch(module: str) -> None:
    assert "torch" not in loaded_after_import(module)


def test_ray_app_loads_no_torch() -> None:
    """The Ray Serve application (Ray imported with it) keeps serving torch-free."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray Serve is not installed: pip install -e '.[ray]'")
    assert "torch" not in loaded_after_import("gptport.serve.ray_app")


def test_serve_answers_with_torch_unimportable(tmp_path: Path, trained_dir: Path) -> None:
    """`gptport serve` loads, answers a completion and a stream, with `import torch` made to fail."""
    from tests.serving import serve

    blocker = tmp_path / "blocker" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text('raise ImportError("torch is blocked in this test")\n')
    env = {"PYTHONPATH": os.pathsep.join([str(blocker.parent), os.environ.get("PYTHONPATH", "")])}
    with serve(trained_dir, tmp_path / "serve.log", env=env) as served:
        status, body = served.post("/v1/completions", {"prompt": "ka to", "max_tokens": 5, "temperature": 0})
        assert status == 200 and body["usage"]["completion_tokens"] >= 1
        status, text = served.post("/v1/completions", {"prompt": "ka", "max_tokens": 3, "stream": True})
        assert status == 200 and text.rstrip().endswith("data: [DONE]")
    assert "blocked" not in (tmp_path / "serve.log").read_text()
