"""Providers: options and TensorRT profiles derived from the config, honest probing, GPU runs where possible."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from gptport import contract
from gptport import tokenizer as bpe
from gptport.checkpoint import load_model
from gptport.errors import ProviderError, UsageError
from gptport.generate import generate
from gptport.onnx_engine import load
from gptport.providers import check_name, probe, provider_options, reason_from_log, trt_profiles
from gptport.sampling import Sampling
from gptport.validate import parity

CONFIG = {"n_ctx": 128, "n_head": 4, "d_model": 64, "n_layer": 2, "vocab_size": 512}


def test_trt_profiles_cover_every_dynamic_input() -> None:
    prof = trt_profiles(CONFIG, max_batch=8)
    for key, (batch, seq, past) in {"trt_profile_min_shapes": (1, 1, 0), "trt_profile_opt_shapes": (1, 1, 63),
                                    "trt_profile_max_shapes": (8, 128, 127)}.items():
        shapes = dict(item.split(":") for item in prof[key].split(","))
        assert set(shapes) == set(contract.input_names(2))
        assert shapes["input_ids"] == shapes["position_ids"] == f"{batch}x{seq}"
        assert shapes["attention_mask"] == f"{batch}x{past + seq}"
        assert shapes["past_key_values.1.value"] == f"{batch}x4x{past}x16"


def test_tensorrt_options_cache_in_the_model_dir_keyed_by_the_model(tmp_path: Path) -> None:
    model = tmp_path / "model.fp16.onnx"
    model.write_bytes(b"one")
    first = provider_options("tensorrt", CONFIG, model, "fp16")
    assert first["trt_fp16_enable"] is True and first["trt_engine_cache_enable"] is True
    assert Path(first["trt_engine_cache_path"]).parent == tmp_path / "trt_cache"
    model.write_bytes(b"two")
    second = provider_options("tensorrt", CONFIG, model, "fp16")
    assert second["trt_engine_cache_path"] != first["trt_engine_cache_path"]
    assert provider_options("tensorrt", CONFIG, model, "fp32")["trt_fp16_enable"] is False
    assert provider_options("cuda", CONFIG, model, "fp32")["device_id"] == 0
    assert provider_options("cpu", CONFIG, model, "fp32") == {}


def test_probe_is_honest() -> None:
    assert probe("cpu").ok
    for name in ("cuda", "tensorrt"):
        status = probe(name)
        assert status.ok or status.reason, f"{name}: no reason given for not running"
    with pytest.raises(UsageError):
        check_name("rocm")


def test_reason_names_the_missing_library() -> None:
    log = ["\x1b[1;31m2026 [E:onnxruntime:Default] Failed to load library libonnxruntime_providers_cuda.so with "
           "error: libcublasLt.so.13: cannot open shared object file: No such file or directory\x1b[m"]
    assert reason_from_log("cuda", log).startswith("libcublasLt.so.13: cannot open shared object file")
    assert "Require cuDNN" in reason_from_log("cuda", ["W: Failed to create. Require cuDNN 9.* and CUDA 13.*. x"])


def test_an_unavailable_provider_is_an_error_unless_fallback(trained_dir: Path) -> None:
    if probe("tensorrt").ok:
        pytest.skip("TensorRT runs on this machine: nothing to fail")
    path = trained_dir / "model.onnx"
    with pytest.raises(ProviderError, match="--provider tensorrt"):
        load(path, "tensorrt")
    notes: list[str] = []
    model = load(path, "tensorrt", fallback=True, say=notes.append)
    assert model.provider in ("cuda", "cpu") and model.session.get_providers()[0] != "TensorrtExecutionProvider"
    assert notes and "tensorrt" in notes[0]


def _results_dir(tmp_path: Path) -> Path:
    """GPU runs record what they gave; GPTPORT_GPU_RESULTS=benchmarks/results keeps it in the repo."""
    return Path(os.environ.get("GPTPORT_GPU_RESULTS", tmp_path))


def _gpu_check(trained_dir: Path, provider: str, precision: str, results: Path) -> None:
    tok = bpe.load(trained_dir)
    torch_model, _ = load_model(trained_dir, tok)
    onnx_model = load(trained_dir / contract.onnx_file(precision), provider)
    assert onnx_model.session.get_providers()[0] != "CPUExecutionProvider"
    atol = 1e-3 if precision == "fp32" else 5e-2
    rows = parity(torch_model, onnx_model.step(), atol=atol) if precision == "fp32" else []
    prompts = [tok.encode(p) for p in ("ka to ri", "the men sol", "日本")]
    cpu = generate(load(trained_dir / contract.onnx_file(precision)), prompts, 32, Sampling(), -1)
    gpu = generate(onnx_model, prompts, 32, Sampling(), -1)
    same = float(np.mean([a.new_ids == b.new_ids for a, b in zip(cpu, gpu, strict=True)]))
    record = {"provider": provider, "precision": precision, "parity": [r.__dict__ for r in rows],
              "greedy_rows_identical_to_cpu": same, "decode_tok_s": gpu[0].decode_tok_s}
    results.write_text(json.dumps(record, indent=2))
    assert all(r.ok for r in rows)
    assert same >= (1.0 if precision == "fp32" else 2 / 3)


@pytest.mark.gpu
@pytest.mark.skipif(not probe("cuda").ok, reason=f"CUDA provider does not run here: {probe('cuda').reason}")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cuda_parity_and_generation(trained_dir: Path, tmp_path: Path, precision: str) -> None:
    _gpu_check(trained_dir, "cuda", precision, _results_dir(tmp_path) / f"gpu-cuda-{precision}.json")


@pytest.mark.gpu
@pytest.mark.skipif(not probe("tensorrt").ok, reason=f"TensorRT provider does not run here: {probe('tensorrt').reason}")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_tensorrt_parity_and_generation(trained_dir: Path, tmp_path: Path, precision: str) -> None:
    _gpu_check(trained_dir, "tensorrt", precision, _results_dir(tmp_path) / f"gpu-tensorrt-{precision}.json")
