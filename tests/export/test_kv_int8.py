"""The int8 KV cache (export --kv-dtype int8): the graph it writes, its gate (which can refuse), and
generate, eval, bench and serve running it; bad combinations refused in one line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from gptport import contract
from gptport.export import exporter, kv_quant
from gptport.runtime.choice import GraphChoice
from gptport.runtime.loader import open_model
from gptport.runtime.onnx_engine import load_cpu
from gptport.tokenizer import load, token_bytes
from tests.support.cli import gptport
from tests.support.serving import serve


@pytest.fixture(scope="module")
def kv8_dir(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of trained_dir exported with --kv-dtype int8 (fp32 and int8 weights)."""
    out = tmp_path_factory.mktemp("kv8") / "m"
    shutil.copytree(trained_dir, out)
    report = exporter.export(out, ["fp32", "int8"], force=True, kv_dtype="int8")
    assert {r.kind for r in report.kv_gates} == set(kv_quant.KINDS)
    assert report.files["fp32 static.kv8"] == out / "model.static.kv8.onnx"
    assert report.files["int8 static.kv8"] == out / "model.int8.static.kv8.onnx"
    return out


def test_the_graph_holds_an_int8_cache_with_calibrated_scales(kv8_dir: Path) -> None:
    proto = onnx.load(str(kv8_dir / "model.static.kv8.onnx"))
    caches = [v for v in (*proto.graph.input, *proto.graph.output) if v.name.startswith(("past_key", "present"))]
    assert caches and all(v.type.tensor_type.elem_type == onnx.TensorProto.INT8 for v in caches)
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta[contract.META_KV_SCALES] in kv_quant.KINDS and meta[contract.META_CACHE] == contract.CACHE_STATIC
    nodes = [n for n in proto.graph.node if n.op_type == "GroupQueryAttention"]
    scales = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer if i.name.startswith("kv8.")}
    assert len(scales) == 2 * len(nodes) and all(np.all(s > 0) for s in scales.values())
    model = open_model(kv8_dir, GraphChoice.parse(kv_dtype="int8"))
    assert model.engine.kv_dtype == np.int8 and model.cache == contract.CACHE_STATIC


def test_the_gate_refuses_a_cache_whose_scales_clip(kv8_dir: Path, tmp_path: Path) -> None:
    """Scales calibrated on values 1,000 times too small clip every key and value: the gate fails both
    kinds, nothing is kept and no temporary file is left."""
    fp32 = load_cpu(kv8_dir / "model.static.onnx")
    windows = np.stack([np.arange(1, 65) % fp32.config.vocab_size] * 2)
    k_max, v_max = kv_quant.calibrate(fp32, windows)
    rows: list[kv_quant.KvGateRow] = []
    twin = tmp_path / "model.static.onnx"
    shutil.copy(kv8_dir / "model.static.onnx", twin)
    sizes = token_bytes(load(kv8_dir))
    made = kv_quant.make("fp32 static.kv8", twin, tmp_path / "model.static.kv8.onnx", (k_max / 1000, v_max / 1000),
                         windows, sizes, gated=True, rows=rows)
    assert made is None and len(rows) == 2 and not any(r.ok for r in rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.static.onnx"]
    good = kv_quant.make("fp32 static.kv8", twin, tmp_path / "model.static.kv8.onnx", (k_max, v_max), windows, sizes,
                         gated=True, rows=rows)
    assert good is not None and rows[-1].top1 >= 0.98
    good.unlink()


def test_generate_eval_and_bench_take_kv_dtype(kv8_dir: Path) -> None:
    r = gptport("generate", str(kv8_dir), "ka to ri", "--max-new-tokens", "8", "--kv-dtype", "int8", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["kv_dtype"] == "int8" and len(out["token_ids"]) == 8
    r = gptport("eval", str(kv8_dir), str(kv8_dir / "tokenizer.json"), "--kv-dtype", "int8", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kv_dtype"] == "int8"
    r = gptport("bench", str(kv8_dir), "--kv-dtype", "float32,int8", "--no-torch-baseline", "--gen-len", "4",
                "--repeat", "1", "--json", str(kv8_dir / "bench.json"))
    assert r.returncode == 0, r.stderr
    caches = [row["kv_cache"] for row in json.loads((kv8_dir / "bench.json").read_text())["rows"]]
    assert caches == ["static", "static.kv8"]


@pytest.mark.parametrize(("args", "message"), [
    (["generate", "{d}", "x", "--kv-dtype", "int8", "--kv-cache", "concat"], "--kv-dtype int8 with --kv-cache concat"),
    (["generate", "{d}", "x", "--kv-dtype", "int4"], "--kv-dtype 'int4' is unknown"),
    (["generate", "{d}", "x", "--kv-dtype", "int8", "--precision", "int4"], "model.int4.static.kv8.onnx: missing"),
    (["export", "{d}", "--kv-dtype", "int8", "--no-static", "--force"], "--kv-dtype int8 --no-static"),
])
def test_bad_kv_dtype_requests_get_one_line(kv8_dir: Path, args: list[str], message: str) -> None:
    r = gptport(*[a.format(d=kv8_dir) for a in args])
    assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_serve_runs_the_int8_cache_and_says_so(kv8_dir: Path, tmp_path: Path) -> None:
    with serve(kv8_dir, tmp_path / "serve.log", "--slots", "2", "--kv-dtype", "int8") as s:
        status, body = s.post("/v1/completions", {"prompt": "ka to ri", "max_tokens": 5, "temperature": 0})
        per_slot = s.metric('gptport_kv_cache_bytes_per_slot{dtype="int8"}')
    assert status == 200 and body["usage"]["completion_tokens"] == 5
    cfg = json.loads((kv8_dir / "config.json").read_text())["model"]
    assert per_slot == 2 * cfg["n_layer"] * cfg["d_model"] * cfg["n_ctx"]  # one byte a value
    line = (tmp_path / "serve.log").read_text()
    assert "static cache (int8)" in line and re.search(r"KV cache \d+ MiB", line)
    assert "a gated int8 variant is here (model.int8.static.kv8.onnx: --precision int8)" in line  # not substituted
