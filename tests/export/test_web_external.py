"""`gptport export-web` of a model past graph_write.external's size (lowered here by GPTPORT_EXTERNAL_FROM_BYTES):
the graph it ships keeps its weights in external data, copied beside it as `onnx/model.onnx_data` (never loaded
whole), named in the manifest; the page passes it to onnxruntime-web's `externalData`, and in a real headless
Chromium reproduces the manifest's greedy references, fetching nothing but the bundle's own files."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest

from gptport.errors import ArtifactError, UsageError
from gptport.export import web_graph
from gptport.provenance import file_digest
from gptport.runtime import external_data
from tests.conftest import build_model_dir
from tests.support.chromium import chromium_path
from tests.support.cli import gptport
from tests.support.web_page import Page, opened

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("npm") is None, reason="no npm: export-web fetches onnxruntime-web "
                                 "with it (install Node.js)")]

LLAMA = {"pos_encoding": "rope", "n_kv_head": 2, "norm": "rmsnorm", "mlp": "swiglu", "bias": False,
         "tie_embeddings": False, "n_ctx": 96}  # room for the references: prompt + 32 tokens


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    """A small Llama-family model (trained a few steps: greedy picks are clear) exported as a large one is."""
    out = build_model_dir(tmp_path_factory.mktemp("webx") / "m", tokenizer_dir, corpus_file, steps=40, **LLAMA)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPTPORT_EXTERNAL_FROM_BYTES", "1")
        r = gptport("export", str(out), "--precision", "fp32", "--no-static")
    assert r.returncode == 0, r.stderr
    assert (out / "model.onnx.data").is_file()
    return out


@pytest.fixture(scope="module")
def bundle(model: Path, web_cache: Path) -> Path:
    out = model.parent / "web"
    r = gptport("export-web", str(model), "--out", str(out))  # auto: the fp32 graph, counted with its data
    assert r.returncode == 0, r.stderr
    return out


def test_the_shipped_graph_keeps_its_weights_outside(bundle: Path, model: Path) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert (manifest["precision"], manifest["graph"]) == ("fp32", "onnx/model.onnx")
    assert manifest["external_data"] == ["onnx/model.onnx_data"]
    data = bundle / "onnx/model.onnx_data"
    assert manifest["files"]["onnx/model.onnx_data"]["sha256"] == file_digest(data)
    assert data.read_bytes() == (model / "model.onnx.data").read_bytes()  # copied as it is: offsets unchanged
    assert {loc for _, loc in external_data.locations(bundle / "onnx/model.onnx")} == {"model.onnx_data"}
    graph = onnx.load(str(bundle / "onnx/model.onnx"), load_external_data=False)
    assert graph.graph.input[0].type.tensor_type.shape.dim[0].dim_param == web_graph.WEB_BATCH
    assert (bundle / "onnx/model.onnx").stat().st_size < data.stat().st_size


def test_a_graph_whose_data_file_is_missing_is_refused(model: Path, tmp_path: Path) -> None:
    broken = tmp_path / "m"
    shutil.copytree(model, broken, ignore=shutil.ignore_patterns("*.onnx.data"))
    with pytest.raises(ArtifactError, match="model.onnx.data is missing"):
        web_graph.write(broken / "model.onnx", tmp_path / "out" / "model.onnx")
    assert not (tmp_path / "out").exists()


def test_auto_counts_the_data_file(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """auto's size limit holds the graph with its data: a limit the graph alone is under still refuses it."""
    monkeypatch.setattr(web_graph, "AUTO_FP32_BYTES", (model / "model.onnx").stat().st_size + 1)
    with pytest.raises(UsageError, match="too much for a browser bundle"):
        web_graph.choose(model, "auto")
    monkeypatch.setattr(web_graph, "AUTO_FP32_BYTES", web_graph.graph_bytes(model / "model.onnx"))
    assert web_graph.choose(model, "auto")[0] == "fp32"


@pytest.fixture(scope="module")
def page(playwright: Any, bundle: Path) -> Iterator[Page]:
    yield from opened(playwright, bundle)


@pytest.mark.skipif(chromium_path() is None, reason="no Chromium: `apt-get install chromium` (Debian), or set "
                    "GPTPORT_CHROMIUM")
def test_page_loads_the_external_data_and_checks_itself(page: Page) -> None:
    checks = page.page.evaluate("window.gptport.selfCheck()")
    assert checks and all(c["ok"] for c in checks), json.dumps(checks)
    assert any(u.endswith("/onnx/model.onnx_data") for u in page.requests)
    page.check_clean()
