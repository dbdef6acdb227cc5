"""onnxruntime execution providers: names, options (TensorRT profiles derived from the model config),
and whether a provider really initialises here, with the reason when it does not. No torch here."""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptport import contract
from gptport.config import ModelConfig
from gptport.errors import UsageError
from gptport.provenance import file_digest
from gptport.runtime import openvino  # keys the TensorRT engine cache: a changed graph rebuilds its engines

ORT_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider",
             "openvino": openvino.ORT_NAME}
FALLBACK_ORDER = ["tensorrt", "cuda", "cpu"]  # --fallback goes on with the next one to the right
TRT_MAX_BATCH = 8


def check_name(provider: str) -> str:
    if provider not in ORT_NAMES:
        raise UsageError(f"--provider {provider!r} is unknown; choose cpu, cuda, tensorrt or openvino")
    return provider


def fallback_order(provider: str) -> list[str]:
    """`provider`, then those --fallback goes on with: tensorrt, cuda, cpu; openvino, cpu."""
    if check_name(provider) == "openvino":
        return ["openvino", "cpu"]
    return FALLBACK_ORDER[FALLBACK_ORDER.index(provider):]


def install_hint(provider: str) -> str:
    """What to install for a provider this onnxruntime build lacks."""
    return openvino.INSTALL if provider == "openvino" else "install onnxruntime-gpu"


def trt_profiles(config: ModelConfig, max_batch: int = TRT_MAX_BATCH) -> dict[str, str]:
    """Optimization profiles for every dynamic input, the KV cache included: batch 1..max_batch,
    sequence 1..n_ctx, past 0..n_ctx-1; the optimum is batch-1 decoding at half the context."""
    n_ctx, heads, hd, n_layer = config.n_ctx, config.n_kv_head, config.head_dim, config.n_layer
    half = max(1, n_ctx // 2)

    def shapes(batch: int, seq: int, past: int) -> str:
        parts = [f"{contract.INPUT_IDS}:{batch}x{seq}", f"{contract.ATTENTION_MASK}:{batch}x{past + seq}",
                 f"{contract.POSITION_IDS}:{batch}x{seq}"]
        parts += [f"{name}:{batch}x{heads}x{past}x{hd}" for name in contract.past_names(n_layer)]
        return ",".join(parts)

    return {"trt_profile_min_shapes": shapes(1, 1, 0),
            "trt_profile_opt_shapes": shapes(1, 1, half - 1),
            "trt_profile_max_shapes": shapes(max_batch, n_ctx, n_ctx - 1)}


def provider_options(provider: str, config: ModelConfig, model_path: Path, precision: str,
                     device_id: int = 0, cuda_graph: bool = False) -> dict[str, Any]:
    """The options each provider gets. CUDA: with `cuda_graph`, runs named by a gpu_graph_id are captured
    and replayed (cuda_slots.py). TensorRT: profiles, an engine cache inside the model directory keyed by
    the model file's digest, fp16 for the fp16 variant."""
    if provider == "cuda":
        # use_tf32 0: full float32 matrix products, as torch computes them (onnxruntime's default, TF32, put the
        # fp32 graph's logits 2e-3 from torch's on an H100, twice the export gate's tolerance)
        graph = {"enable_cuda_graph": "1"} if cuda_graph else {}
        return {"device_id": device_id, "cudnn_conv_algo_search": "HEURISTIC", "use_tf32": 0, **graph}
    if provider == "openvino":
        return dict(openvino.OPTIONS)
    if provider == "tensorrt":
        cache = model_path.parent / "trt_cache" / f"{precision}-{file_digest(model_path)[:16]}"
        cache.mkdir(parents=True, exist_ok=True)
        return {"device_id": device_id, "trt_engine_cache_enable": True, "trt_engine_cache_path": str(cache),
                "trt_timing_cache_enable": True, "trt_timing_cache_path": str(cache),
                "trt_fp16_enable": precision == "fp16", **trt_profiles(config)}
    return {}


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Capture what onnxruntime writes while it creates a session: its C++ code's log on file
    descriptor 2 (provider load errors), and its Python code's prints ("EP Error ...") on sys.stdout,
    which is the payload stream of the CLI."""
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Duplicate provider ..." while it falls back
                yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode("utf-8", "replace").splitlines())
            lines.extend(printed.getvalue().splitlines())


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def reason_from_log(provider: str, log: list[str]) -> str:
    """The useful part of onnxruntime's complaint: the missing library, or its advice."""
    text = _ANSI.sub("", "\n".join(log))
    missing = re.search(r"with error: ([^\n]+?)(?:\n|$)", text)
    if missing:
        hint = "pip install 'gptport[cuda]'" if provider == "cuda" else "pip install 'gptport[tensorrt]'"
        return f"{missing.group(1).strip()} ({hint}, and an NVIDIA driver)"
    advice = re.search(r"((?:Require|Please install)[^\n]*?\.)(?=\s|$)", text)  # a sentence: "9.*" goes on
    if advice:
        return advice.group(1)
    return "onnxruntime did not initialise it (no NVIDIA GPU or driver?)"


@dataclass(frozen=True)
class ProviderStatus:
    provider: str
    ok: bool
    reason: str


def probe(provider: str) -> ProviderStatus:
    """Whether `provider` really initialises here: a one-node session must report it as running."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    name = ORT_NAMES[check_name(provider)]
    if name not in ort.get_available_providers():
        return ProviderStatus(provider, False, f"this onnxruntime build ({ort.__version__}) has no {name}; "
                                               f"{install_hint(provider)}")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    with captured_stderr() as log:
        try:
            session = ort.InferenceSession(model.SerializeToString(), providers=[name, "CPUExecutionProvider"])
            running = session.get_providers()
        except Exception as e:  # onnxruntime raises plain RuntimeError subclasses for provider failures
            return ProviderStatus(provider, False, str(e).splitlines()[0])
    if running and running[0] == name:
        return ProviderStatus(provider, True, "initialises")
    return ProviderStatus(provider, False, reason_from_log(provider, log))

