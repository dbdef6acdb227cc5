"""The GPU providers on the exported graphs: CUDA and TensorRT give torch's numbers within the GPU bound (fp32)
and the CPU provider's greedy tokens (every row in fp32, two rows of three in fp16), and record what they gave
(GPTPORT_GPU_RESULTS). Each skips, saying why, where its provider does not run."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

from gptport import contract
from gptport import tokenizer as bpe
from gptport.export.tolerance import GPU_TOL
from gptport.export.validate import parity
from gptport.runtime.generate import generate
from gptport.runtime.onnx_engine import load
from gptport.runtime.providers import ORT_NAMES, probe
from gptport.runtime.sampling import Sampling
from gptport.training.checkpoint import load_model


def _results_dir(tmp_path: Path) -> Path:
    """GPU runs record what they gave; GPTPORT_GPU_RESULTS=benchmarks/results keeps it in the repo."""
    return Path(os.environ.get("GPTPORT_GPU_RESULTS", tmp_path))


def _gpu_check(trained_dir: Path, provider: str, precision: str, results: Path) -> None:
    tok = bpe.load(trained_dir)
    torch_model, _ = load_model(trained_dir, tok)
    onnx_model = load(trained_dir / contract.onnx_file(precision), provider)
    assert onnx_model.session.get_providers()[0] == ORT_NAMES[provider]
    rows = parity(torch_model, onnx_model.step(), GPU_TOL) if precision == "fp32" else []
    prompts = [tok.encode(p) for p in ("ka to ri", "the men sol", "日本")]
    cpu = generate(load(trained_dir / contract.onnx_file(precision)), prompts, 32, Sampling(), -1)
    gpu = generate(onnx_model, prompts, 32, Sampling(), -1)
    same = float(np.mean([a.new_ids == b.new_ids for a, b in zip(cpu, gpu, strict=True)]))
    record = {"provider": provider, "precision": precision, "parity": [dataclasses.asdict(r) for r in rows],
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
