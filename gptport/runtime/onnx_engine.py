"""onnxruntime sessions per provider and KV-cache stepping. No torch here.

`OnnxModel.step` is the step function of generate.py. On the CPU the cache is numpy arrays fed back
each step; on CUDA and TensorRT it is OrtValues that stay on the GPU between steps (I/O binding):
only the new token ids go up and the last logits come down.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from gptport import contract, provenance
from gptport.config import ModelConfig, model_config_from_dict
from gptport.errors import ArtifactError, ProviderError, UsageError
from gptport.runtime import external_data, hugepages, openvino, ort_file, providers, static_cache
from gptport.runtime.choice import Spin
from gptport.runtime.engine import Capability, Past, StepFn

_ORT = ort.capi.onnxruntime_pybind11_state
# what InferenceSession raises on a file it cannot load (damaged bytes: a bad protobuf, a graph without
# nodes, an operator name that no kernel has, tensor data cut short); UnicodeDecodeError where the damaged
# bytes reach onnxruntime's message, which pybind11 then cannot decode
ORT_FAILURES = (_ORT.Fail, _ORT.InvalidArgument, _ORT.InvalidGraph, _ORT.InvalidProtobuf, _ORT.NoModel,
                _ORT.NoSuchFile, _ORT.NotImplemented, _ORT.RuntimeException, UnicodeDecodeError)


@dataclass
class OnnxModel:
    """A session, what its metadata says, and the provider that really runs it."""

    session: ort.InferenceSession
    config: ModelConfig  # the one recorded in the graph's metadata
    precision: str
    tokenizer_sha256: str
    provider: str = "cpu"
    cache: str = contract.CACHE_CONCAT  # concat: model.onnx's contract; static: gqa_graph.py's graph
    path: Path | None = None  # the graph file
    meta: dict[str, str] = field(default_factory=dict)  # its metadata_props (provenance: weights, config)
    _buffers: static_cache.Buffers | None = field(default=None, repr=False)

    @property
    def n_layer(self) -> int:
        return self.config.n_layer

    @property
    def n_ctx(self) -> int:
        return self.config.n_ctx

    @property
    def kv_dtype(self) -> np.dtype:
        """The cache's element type: int8 for a static graph exported with --kv-dtype int8 (its inputs say
        so), float16 for the fp16 graph, float32 otherwise."""
        if self.cache == contract.CACHE_STATIC:
            past = next(i for i in self.session.get_inputs() if i.name.startswith("past_key_values."))
            if past.type == "tensor(int8)":
                return np.dtype(np.int8)
        return np.dtype(np.float16) if self.precision == "fp16" else np.dtype(np.float32)

    @property
    def on_gpu(self) -> bool:
        return self.provider in ("cuda", "tensorrt")

    @property
    def capabilities(self) -> frozenset[Capability]:
        """Every session masks logits on the host; the static-cache graph holds slots in place and rolls
        drafts back, and its fp32 float32-cache graph on the CPU takes the multi-row append graph beside it."""
        if self.cache != contract.CACHE_STATIC:
            return frozenset({Capability.CONSTRAIN})
        static = {Capability.CONSTRAIN, Capability.STATIC_SLOTS, Capability.DRAFT}
        if self.precision == "fp32" and self.provider == "cpu" and self.kv_dtype == np.dtype(np.float32):
            static.add(Capability.APPEND_ROWS)
        return frozenset(static)

    def empty_past(self, batch: int) -> Past:
        """A zero-length cache (B, Hkv, 0, hd) per key and value, where the step function wants it; for
        the static-cache graph, the preallocated (B, Hkv, n_ctx, hd) buffers (Hkv: n_kv_head)."""
        if self.cache == contract.CACHE_STATIC:
            if self._buffers is None:
                self._buffers = static_cache.Buffers(self.config, self.kv_dtype)
            return self._buffers.fresh(batch)
        shape = (batch, self.config.n_kv_head, 0, self.config.head_dim)
        if not self.on_gpu:
            return [np.zeros(shape, dtype=self.kv_dtype) for _ in range(2 * self.n_layer)]
        return [ort.OrtValue.ortvalue_from_shape_and_type(list(shape), self.kv_dtype.type, "cuda", 0)
                for _ in range(2 * self.n_layer)]

    def step(self, last_only: bool = False) -> StepFn:
        """A step function over this session: numpy in and out on the CPU, I/O binding on a GPU.
        `last_only`: logits (B, 1, V) of each row's last token (the static graph computes only those)."""
        if self.cache == contract.CACHE_STATIC:
            return static_cache.step_fn(self.session, self.n_layer, last_only)
        names_in = contract.input_names(self.n_layer)
        names_out = contract.output_names(self.n_layer)
        session = self.session
        if not self.on_gpu:

            def step(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, past: Past) -> tuple[np.ndarray, Past]:
                outs = session.run(names_out, dict(zip(names_in, [ids, mask, pos, *past], strict=True)))
                return (outs[0][:, -1:] if last_only else outs[0]), outs[1:]

            return step
        return _bound_step(session, names_in, names_out, last_only)


def _bound_step(session: ort.InferenceSession, names_in: list[str], names_out: list[str], last_only: bool
                ) -> StepFn:
    """I/O binding: the cache (OrtValues) stays on the GPU; ids, mask and positions are tiny host copies."""

    def step(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, past: Past) -> tuple[np.ndarray, Past]:
        binding = session.io_binding()
        for name, arr in zip(names_in[:3], (ids, mask, pos), strict=True):
            binding.bind_cpu_input(name, np.ascontiguousarray(arr))
        for name, value in zip(names_in[3:], past, strict=True):
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, value)
            else:
                binding.bind_ortvalue_input(name, value)
        binding.bind_output(names_out[0], "cpu")
        for name in names_out[1:]:
            binding.bind_output(name, "cuda", 0)
        session.run_with_iobinding(binding)
        outs = binding.get_outputs()
        logits = outs[0].numpy()  # (B, T, V)
        return (logits[:, -1:] if last_only else logits), list(outs[1:])

    return step


SPIN_ALWAYS, SPIN_STEP, SPIN_NEVER = (str(s) for s in Spin)  # choice.Spin's words, as plain strings
SPIN_MODES = (SPIN_ALWAYS, SPIN_STEP, SPIN_NEVER)


def check_spin(spin: str) -> None:
    """A spin mode is one of SPIN_MODES (a one-line usage error naming --spin otherwise)."""
    if spin not in SPIN_MODES:
        raise UsageError(f"--spin {spin!r} is unknown; choose one of {', '.join(SPIN_MODES)}")


THREADS_ENV = "GPTPORT_THREADS"  # the CPU threads of every session made with threads 0 (unset: onnxruntime's choice)


def default_threads() -> int:
    """The intra-op threads a session gets where none were asked for: GPTPORT_THREADS when set (several
    gptport processes sharing a machine's cores, as a test run's workers do), else 0 (onnxruntime's own
    choice: every physical core)."""
    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return 0
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"{THREADS_ENV}={text!r}: a positive number of threads, or unset")
    return int(text)


def session_options(threads: int = 0, spin: str = SPIN_ALWAYS) -> ort.SessionOptions:
    """`threads` intra-op threads (0: default_threads()). `spin`, what the thread pool's idle workers do:
    "always" spin (onnxruntime's default: they go on spinning for a while after a run; fastest when
    onnxruntime has the cores to itself), "step" spin while a run lasts and stop as it returns (node-to-node
    hand-offs stay fast, and the cores are free between steps for other threads: the server's), "never"
    sleep at once."""
    check_spin(spin)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    threads = threads or default_threads()
    if threads > 0:
        opts.intra_op_num_threads = threads
    if spin == SPIN_NEVER:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    elif spin == SPIN_STEP:
        opts.add_session_config_entry("session.force_spinning_stop", "1")
    opts.log_severity_level = 3  # errors only: warnings about unused initializers are noise here
    return opts


def _metadata(session: ort.InferenceSession, path: Path) -> dict[str, str]:
    """The graph's metadata_props, once its contract version is checked (provenance.check_contract)."""
    meta = dict(session.get_modelmeta().custom_metadata_map)
    provenance.check_contract(path, meta)
    return meta


def file_metadata(path: Path) -> dict[str, str]:
    """A graph's metadata_props, read without creating a session (not checked); .onnx or .ort."""
    import onnx
    from google.protobuf.message import DecodeError

    if path.suffix == ".ort":
        return ort_file.metadata(path)

    try:
        return {p.key: p.value for p in onnx.load_model(str(path), load_external_data=False).metadata_props}
    except (onnx.onnx_cpp2py_export.checker.ValidationError, OSError, ValueError, DecodeError) as e:
        raise ArtifactError(f"{path}: not a readable ONNX file ({e})") from e


def _file_metadata(path: Path) -> tuple[ModelConfig, str]:
    """The config and precision in a graph's metadata, read without creating a session."""
    meta = file_metadata(path)
    provenance.check_contract(path, meta)
    return graph_config(path, meta), meta.get(contract.META_PRECISION, "fp32")


def graph_config(path: Path | str, meta: Mapping[str, str]) -> ModelConfig:
    """The model config recorded in a graph's metadata (check_contract has seen that there is one),
    refused in one line naming the graph when it is not valid JSON or not a config the model can have."""
    try:
        data = json.loads(meta[contract.META_CONFIG])
    except ValueError as e:
        raise ArtifactError(f"{path}: its {contract.META_CONFIG} metadata is not valid JSON ({e})") from e
    return model_config_from_dict(data, f"{path}: its {contract.META_CONFIG} metadata")


def load_cpu(path: str | os.PathLike[str], threads: int = 0) -> OnnxModel:
    """A CPU-provider session of an exported gptport graph, with its metadata read."""
    return load(Path(path), "cpu", threads=threads)


def load(path: Path, provider: str = "cpu", threads: int = 0, fallback: bool = False,
         say: Callable[[str], None] = lambda msg: None, spin: str = SPIN_ALWAYS, cuda_graph: bool = False
         ) -> OnnxModel:
    """A session on `provider`, checked with session.get_providers(). A provider that does not really
    run fails with the reason, or with `fallback` is reported through `say` and the next one is tried.
    `cuda_graph`: a CUDA session made with enable_cuda_graph (a static-cache graph's decode steps are
    captured and replayed: cuda_slots.py)."""
    if not path.is_file():
        raise ArtifactError(f"{path}: missing; run `gptport export` (with --precision for a variant) first")
    external_data.check(path)  # before onnxruntime reads a byte of it
    if path.suffix == ".ort":  # before onnxruntime meets a file of another version
        ort_file.check_runtime(path, ort_file.metadata(path))
    order = providers.fallback_order(provider)
    for candidate in order if fallback else order[:1]:
        model, reason = _try(path, candidate, threads, spin, cuda_graph)
        if model is not None:
            return model
        if not fallback:
            raise ProviderError(f"--provider {candidate}: {reason}; use --fallback to go on with the next provider, "
                                "or see `gptport providers`")
        say(f"provider {candidate} does not run here ({reason}); falling back to {order[order.index(candidate) + 1]}")
    raise AssertionError("unreachable: the CPU provider is last in the fallback order")


def _try(path: Path, provider: str, threads: int, spin: str = SPIN_ALWAYS, cuda_graph: bool = False
         ) -> tuple[OnnxModel | None, str]:
    ort_name = providers.ORT_NAMES[provider]
    if ort_name not in ort.get_available_providers():
        return None, f"this onnxruntime build has no {ort_name} ({providers.install_hint(provider)})"
    opts = session_options(threads, spin)
    if provider == "openvino":  # the whole graph on OpenVINO, or no session
        openvino.check_graph(path)
        for key, value in openvino.STRICT.items():
            opts.add_session_config_entry(key, value)
    chain: list[Any] = [] if provider == "openvino" else ["CPUExecutionProvider"]  # strict: no CPU EP named
    if provider != "cpu":
        config, precision = _file_metadata(path)
        chain.insert(0, (ort_name, providers.provider_options(provider, config, path, precision,
                                                              cuda_graph=cuda_graph)))
        if provider == "tensorrt":  # nodes TensorRT cannot take go to CUDA, not to the CPU
            chain.insert(1, ("CUDAExecutionProvider", {"device_id": 0}))
    with providers.captured_stderr() as log:
        try:
            session = ort.InferenceSession(str(path), opts, providers=chain)
        except ORT_FAILURES as e:
            who = "OpenVINO cannot compile it whole" if provider == "openvino" else "onnxruntime cannot load it"
            raise ArtifactError(f"{path}: {who} ({str(e).splitlines()[0]})") from e
    if session.get_providers()[0] != ort_name:
        return None, providers.reason_from_log(provider, log)
    if provider == "cpu":  # its weights, prepacked by now, on 2 MiB pages (hugepages.py)
        hugepages.back_weights()
    meta = _metadata(session, path)
    cache = meta.get(contract.META_CACHE, contract.CACHE_CONCAT)
    precision = meta.get(contract.META_PRECISION, "fp32")
    static = (contract.CACHE_STATIC, contract.CACHE_APPEND, contract.CACHE_DECODE)
    on_cuda = cache in (contract.CACHE_APPEND, contract.CACHE_DECODE) or precision == "fp16"  # export --cuda's
    if cache in static and provider != "cpu" and not (provider == "cuda" and on_cuda):
        return None, ("the static-cache graphs run on the CPU provider, and on CUDA only those of export --cuda "
                      "(GroupQueryAttention runs float32 on the CPU, float16 on CUDA)")
    config = graph_config(path, meta)
    check_io(session, config, cache, path)
    return OnnxModel(session, config, precision, meta.get(contract.META_TOKENIZER, ""), provider, cache=cache,
                     path=path, meta=meta), ""


def check_io(session: ort.InferenceSession, config: ModelConfig, cache: str, path: Path) -> None:
    """Refuse a graph whose inputs and outputs are not those its recorded config implies (the metadata
    damaged, or not written by gptport export): names per layer, heads (n_kv_head) and head size of the
    cache, vocabulary of the logits."""
    n_layer, n_kv_head, d_model, vocab = config.n_layer, config.n_kv_head, config.d_model, config.vocab_size
    names = {contract.CACHE_STATIC: contract.static_input_names, contract.CACHE_APPEND: contract.append_input_names,
             contract.CACHE_DECODE: contract.decode_input_names}
    expected = {"input names": sorted(names.get(cache, contract.input_names)(n_layer)),
                "cache heads": n_kv_head, "head size": config.head_dim, "vocabulary": vocab}
    inputs = session.get_inputs()
    past = next((i.shape for i in inputs if i.name.startswith("past_key_values.")), [None] * 4)
    found = {"input names": sorted(i.name for i in inputs), "cache heads": past[1], "head size": past[3],
             "vocabulary": session.get_outputs()[0].shape[-1]}
    differ = [k for k in expected if found[k] != expected[k] and not isinstance(found[k], (str, type(None)))]
    if differ:
        raise ArtifactError(f"{path}: its {', '.join(differ)} disagree with its {contract.META_CONFIG} metadata "
                            f"(n_layer {n_layer}, n_kv_head {n_kv_head}, d_model {d_model}, vocab_size {vocab}); "
                            "export it again")
