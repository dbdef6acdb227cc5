"""onnxruntime sessions and KV-cache stepping. No torch here."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from gptport import contract
from gptport.errors import ArtifactError
from gptport.generate import Past, StepFn


@dataclass(frozen=True)
class OnnxModel:
    """A loaded session and what its metadata says."""

    session: ort.InferenceSession
    config: dict[str, Any]
    precision: str
    tokenizer_sha256: str

    @property
    def n_layer(self) -> int:
        return int(self.config["n_layer"])

    @property
    def kv_dtype(self) -> np.dtype:
        return np.dtype(np.float16) if self.precision == "fp16" else np.dtype(np.float32)

    def step(self) -> StepFn:
        """A step function over this session (inputs and outputs as numpy arrays)."""
        names_in = contract.input_names(self.n_layer)
        names_out = contract.output_names(self.n_layer)
        run = self.session.run

        def step(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, past: Past) -> tuple[np.ndarray, Past]:
            outs = run(names_out, dict(zip(names_in, [ids, mask, pos, *past], strict=True)))
            return outs[0], outs[1:]

        return step


def session_options(threads: int = 0) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads > 0:
        opts.intra_op_num_threads = threads
    opts.log_severity_level = 3  # errors only: warnings about unused initializers are noise here
    return opts


def load_cpu(path: str | os.PathLike[str], threads: int = 0) -> OnnxModel:
    """A CPU-provider session of an exported gptport graph, with its metadata read and checked."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path}: missing; run `gptport export` first")
    try:
        session = ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
    except (ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.InvalidGraph,
            ort.capi.onnxruntime_pybind11_state.InvalidProtobuf) as e:
        raise ArtifactError(f"{path}: onnxruntime cannot load it ({str(e).splitlines()[0]})") from e
    return from_session(session, path)


def from_session(session: ort.InferenceSession, path: Path) -> OnnxModel:
    meta = session.get_modelmeta().custom_metadata_map
    if contract.META_CONFIG not in meta:
        raise ArtifactError(f"{path}: not a gptport export (no {contract.META_CONFIG} metadata)")
    return OnnxModel(session, json.loads(meta[contract.META_CONFIG]), meta.get(contract.META_PRECISION, "fp32"),
                     meta.get(contract.META_TOKENIZER, ""))
