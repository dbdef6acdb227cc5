"""Providers: options and TensorRT profiles derived from the config, honest probing, caches left on the device.
The runs on a GPU are in tests/gpu/test_providers.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from gptport import contract
from gptport import tokenizer as bpe
from gptport.config import ModelConfig
from gptport.errors import ProviderError, UsageError
from gptport.export.tolerance import Tolerance
from gptport.export.validate import parity
from gptport.runtime import providers
from gptport.runtime.onnx_engine import graph_config, load
from gptport.runtime.providers import ORT_NAMES, TRT_MAX_BATCH, ProviderStatus, check_name, probe, provider_options
from gptport.training.checkpoint import load_model

CONFIG = ModelConfig(vocab_size=512, n_ctx=128, d_model=64, n_layer=2, n_head=4)


def _profile(text: str) -> dict[str, tuple[int, ...]]:
    """'name:1x2x3,other:4' -> {name: (1, 2, 3), other: (4,)}, each input once."""
    out: dict[str, tuple[int, ...]] = {}
    for item in text.split(","):
        name, dims = item.rsplit(":", 1)
        assert name not in out, f"{name} twice"
        out[name] = tuple(int(d) for d in dims.split("x"))
    return out


def test_trt_profiles_cover_the_contract_graphs_dynamic_inputs(trained_dir: Path, tmp_path: Path) -> None:
    """Checked against the exported graph itself: every input with a symbolic dimension has a shape in
    each profile, of its rank, with its fixed dimensions; each profile is one consistent point (a symbol
    has one value across inputs, total = past + sequence); min <= opt <= max; the ranges are what the
    runtime asks for: batch 1..TRT_MAX_BATCH, sequence 1..n_ctx, past 0..n_ctx-1."""
    graph = tmp_path / "model.onnx"  # provider_options makes trt_cache/ beside the graph: not in the shared dir
    shutil.copy(trained_dir / "model.onnx", graph)
    proto = onnx.load(str(graph), load_external_data=False)
    config = graph_config(graph, {p.key: p.value for p in proto.metadata_props})
    n_ctx, heads, head_dim = config.n_ctx, config.n_head, config.head_dim
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in proto.graph.input}
    dynamic = {name: d for name, d in dims.items() if any(isinstance(x, str) for x in d)}
    assert len(dynamic) == 3 + 2 * config.n_layer
    options = provider_options("tensorrt", config, graph, "fp32")
    points: dict[str, dict[str, int]] = {}
    for which in ("min", "opt", "max"):
        shapes = _profile(options[f"trt_profile_{which}_shapes"])
        assert set(shapes) == set(dynamic)
        values: dict[str, set[int]] = {}
        for name, want in dynamic.items():
            assert len(shapes[name]) == len(want), name
            for d, n in zip(want, shapes[name], strict=True):
                if isinstance(d, str):
                    values.setdefault(d, set()).add(n)
                else:
                    assert n == d, (which, name)
        assert all(len(v) == 1 for v in values.values()), (which, values)
        points[which] = {sym: v.pop() for sym, v in values.items()}
        p = points[which]
        assert p[contract.TOTAL] == p[contract.PAST] + p[contract.SEQUENCE], which
    assert set(points["min"]) == {contract.BATCH, contract.SEQUENCE, contract.PAST, contract.TOTAL}
    for sym in points["min"]:
        assert points["min"][sym] <= points["opt"][sym] <= points["max"][sym], sym
    span = {sym: (points["min"][sym], points["max"][sym]) for sym in points["min"]}
    assert span[contract.BATCH] == (1, TRT_MAX_BATCH)
    assert span[contract.SEQUENCE] == (1, n_ctx)
    assert span[contract.PAST] == (0, n_ctx - 1)
    assert points["opt"][contract.SEQUENCE] == 1  # tuned for decoding, one token per step
    # the fixed dimensions agree with the model config: (batch, heads, past, head_dim) caches
    assert all(d[1] == heads and d[3] == head_dim for n, d in dynamic.items() if n.startswith("past_key_values"))


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
    # full float32 products on CUDA: onnxruntime's TF32 default put fp32 logits 2e-3 from torch's on an H100
    assert provider_options("cuda", CONFIG, model, "fp32")["use_tf32"] == 0
    assert provider_options("cpu", CONFIG, model, "fp32") == {}


def _fake_session(running: list[str], log: str = "", error: str = "") -> type:
    """An onnxruntime.InferenceSession stand-in: writes `log` to file descriptor 2 as onnxruntime's C++
    code does, raises `error`, or reports `running` as the providers it runs on."""

    class Session:
        def __init__(self, model: bytes, providers: list[str]) -> None:
            os.write(2, log.encode())
            if error:
                raise RuntimeError(error)

        def get_providers(self) -> list[str]:
            return running

    return Session


def test_probe_believes_only_the_providers_a_session_runs_on(monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime as ort

    cuda, cpu = ORT_NAMES["cuda"], ORT_NAMES["cpu"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: [cuda, cpu])
    monkeypatch.setattr(ort, "InferenceSession", _fake_session([cuda, cpu]))
    assert probe("cuda") == ProviderStatus("cuda", True, "initialises")
    # onnxruntime's silent fallback: the session runs, on the CPU alone; the reason comes from its log
    missing = ("2026 [E:onnxruntime:Default] Failed to load library libonnxruntime_providers_cuda.so with error: "
               "libcudnn.so.9: cannot open shared object file: No such file or directory\n")
    monkeypatch.setattr(ort, "InferenceSession", _fake_session([cpu], log=missing))
    status = probe("cuda")
    assert not status.ok and status.reason.startswith("libcudnn.so.9: cannot open shared object file")
    monkeypatch.setattr(ort, "InferenceSession", _fake_session([cpu]))
    assert not probe("cuda").ok and probe("cuda").reason  # a fallback with nothing logged is no success either
    monkeypatch.setattr(ort, "InferenceSession", _fake_session([], error="CUDA failure 100: no device\ndetail"))
    assert probe("cuda") == ProviderStatus("cuda", False, "CUDA failure 100: no device")
    monkeypatch.setattr(ort, "get_available_providers", lambda: [cpu])  # a CPU-only build
    status = probe("tensorrt")
    assert not status.ok and "onnxruntime-gpu" in status.reason and ORT_NAMES["tensorrt"] in status.reason


def test_probe_on_this_machine() -> None:
    assert probe("cpu") == ProviderStatus("cpu", True, "initialises")
    for name in ("cuda", "tensorrt"):
        status = probe(name)
        if not Path("/dev/nvidiactl").exists():  # no NVIDIA driver here: no GPU provider can run
            assert not status.ok, name
        assert status.ok == (status.reason == "initialises") and status.reason and "\n" not in status.reason
    with pytest.raises(UsageError):
        check_name("rocm")


def test_reason_names_the_missing_library() -> None:
    log = ["\x1b[1;31m2026 [E:onnxruntime:Default] Failed to load library libonnxruntime_providers_cuda.so with "
           "error: libcublasLt.so.13: cannot open shared object file: No such file or directory\x1b[m"]
    assert providers.reason_from_log("cuda", log).startswith("libcublasLt.so.13: cannot open shared object file")
    advice = ["W: Failed to create. Require cuDNN 9.* and CUDA 13.*. x"]
    assert providers.reason_from_log("cuda", advice) == "Require cuDNN 9.* and CUDA 13.*."
    assert providers.reason_from_log("cuda", ["Please install TensorRT 10.x.\nnext"]) == "Please install TensorRT 10.x."


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


def test_parity_reads_caches_left_on_the_device(trained_dir: Path) -> None:
    """On CUDA the bound step returns the present caches as OrtValues (they stay on the GPU): parity copies
    them down to compare. Shown here with CPU OrtValues standing in for device ones."""
    import onnxruntime as ort

    torch_model, _ = load_model(trained_dir, bpe.load(trained_dir))
    step = load(trained_dir / "model.onnx").step()

    def on_device(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, past: list) -> tuple:
        logits, present = step(ids, mask, pos, past)
        return logits, [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(p)) for p in present]

    rows = parity(torch_model, on_device, Tolerance())
    assert rows and all(r.ok for r in rows), rows


def test_gptport_threads_sets_the_sessions_threads_where_none_are_asked(monkeypatch: pytest.MonkeyPatch,
                                                                        trained_dir: Path) -> None:
    from gptport.runtime.onnx_engine import THREADS_ENV, session_options
    from tests.support.cli import assert_one_line_error, gptport

    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert session_options().intra_op_num_threads == 0  # onnxruntime's own choice
    monkeypatch.setenv(THREADS_ENV, "3")
    assert session_options().intra_op_num_threads == 3 and session_options(2).intra_op_num_threads == 2
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(THREADS_ENV, bad)
        with pytest.raises(UsageError, match=f"GPTPORT_THREADS='{bad}': a positive number of threads, or unset"):
            session_options()
    assert_one_line_error(gptport("generate", str(trained_dir), "ka", "--max-new-tokens", "2"), 2,
                          "GPTPORT_THREADS='-1'")
