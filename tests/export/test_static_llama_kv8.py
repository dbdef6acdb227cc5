"""The int8 KV cache of a Llama-family model: a llama-tiny-shaped model (RMSNorm, SwiGLU, rope, 2 key/value heads
for 4, untied head) trained briefly, exported with --kv-dtype int8: its static-cache graphs get int8-cache twins
through their gate (top-1 agreement and bits per byte against the float32 cache), and generate runs on them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptport.export import exporter, kv_quant
from tests.conftest import build_model_dir
from tests.support.cli import gptport

LLAMA = {"pos_encoding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False, "n_kv_head": 2,
         "tie_embeddings": False}


@pytest.fixture(scope="module")
def kv8_llama(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    out = build_model_dir(tmp_path_factory.mktemp("kv8_llama") / "m", tokenizer_dir, corpus_file, steps=150,
                          n_ctx=64, **LLAMA)
    report = exporter.export(out, ["fp32", "int8"], kv_dtype="int8")
    assert {r.kind for r in report.kv_gates} == set(kv_quant.KINDS)
    assert all(r.ok for r in report.static_parity) and all(r.ok for r in report.append_parity)
    assert any(r.ok for r in report.kv_gates if r.label == "fp32 static.kv8"), report.kv_gates
    assert report.files["fp32 static.kv8"] == out / "model.static.kv8.onnx"
    return out


def test_int8_cache_passes_its_gate_and_generates(kv8_llama: Path) -> None:
    runs = {}
    for kv_dtype in ("float32", "int8"):
        r = gptport("generate", str(kv8_llama), "ka to ri", "--max-new-tokens", "16", "--json", "--kv-cache", "static",
                    "--kv-dtype", kv_dtype)
        assert r.returncode == 0, r.stderr
        runs[kv_dtype] = json.loads(r.stdout)
    assert runs["int8"]["kv_dtype"] == "int8" and runs["int8"]["kv_cache"] == "static"
    int8, fp32 = runs["int8"]["token_ids"], runs["float32"]["token_ids"]
    same = sum(a == b for a, b in zip(int8, fp32, strict=False))
    assert fp32 and same >= 0.75 * min(len(int8), len(fp32)), runs  # the gate's agreement, on a short greedy run
