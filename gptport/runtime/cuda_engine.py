"""The static-cache graphs on the CUDA provider as an engine: generate, bench and eval step them through
the same device slots serve uses (cuda_slots.py). No torch here.

Which graphs: fp16 decodes and prefills with the fp16 static-cache graph (GroupQueryAttention in float16,
as CUDA runs it); fp32 decodes with the one-token decode graph and prefills with the multi-row append
graph beside it (export --cuda writes both). On the CPU provider the same engine runs the same code over
host memory: how the tests check it where there is no GPU.

The engine's cache is a batch of device slots, one row per prompt: a prefill writes each row's real
tokens (the contract's left padding taken off) from position 0, each decode step one token per row at
its own length, all rows in one bucket (the batch size), replayed as one CUDA graph once captured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gptport import contract
from gptport.config import ModelConfig
from gptport.errors import ArtifactError
from gptport.runtime import burst, cuda_memory
from gptport.runtime.cuda_slots import DeviceSlots
from gptport.runtime.engine import Capability, Past, StepFn
from gptport.runtime.onnx_engine import OnnxModel, session_options

GPU_CACHES = (contract.CACHE_STATIC, contract.CACHE_DECODE)
BURST_STEPS = 8  # greedy steps a burst when asked for: the host's share of a step (~230 us on an H200) over 8


def graph_file(precision: str) -> str | None:
    """The graph the CUDA provider decodes `precision` with from the static cache, None for a precision
    without one (int8, int4: their MatMulNBits graphs are the CPU's)."""
    if precision == "fp16":
        return contract.onnx_file("fp16", contract.CACHE_STATIC)
    if precision == "fp32":
        return contract.onnx_file("fp32", contract.CACHE_DECODE)
    return None


def graph_path(model_dir: Path, precision: str, required: bool) -> Path | None:
    """The device static-cache graph of `precision` in `model_dir` (the fp32 one with the multi-row append
    graph beside it); None when it is missing and not `required`, else refused naming what to run."""
    name = graph_file(precision)
    missing = ([] if name is None else [model_dir / name]) + (
        [model_dir / contract.onnx_file("fp32", contract.CACHE_APPEND)] if precision == "fp32" else [])
    missing = [p for p in missing if not p.is_file()]
    if name is not None and not missing:
        return model_dir / name
    if not required:
        return None
    if name is None:
        raise ArtifactError(f"--precision {precision} has no static-cache graph on CUDA (fp32 and fp16 have); "
                            "use --kv-cache concat")
    asked = "" if precision == "fp32" else f" --precision fp32,{precision}"
    raise ArtifactError(f"{missing[0]}: missing; run `gptport export {model_dir}{asked} --cuda` first")


class SlotsPast(list):  # type: ignore[type-arg]
    """The cache of a DeviceModel's step function: a batch of device slots, one per row. `stale` once a
    later empty_past() of the same batch size handed the slots out again."""

    def __init__(self, slots: DeviceSlots) -> None:
        super().__init__()
        self.slots = slots
        self.started = False
        self.stale = False


@dataclass
class DeviceModel(OnnxModel):
    """A static-cache graph on the CUDA provider (or, for checks, the CPU's) over device slots. `appender`:
    the multi-row append graph's session, which prefills for the fp32 decode graph; `graphs`: decode
    steps replayed as CUDA graphs (the session was made with enable_cuda_graph)."""

    appender: Any = None
    graphs: bool = False
    bursts: int = 0  # greedy decode steps a run (burst.py), once prepare_bursts(); 0: one step a run
    _pasts: dict[int, SlotsPast] = field(default_factory=dict, repr=False)
    _burster: tuple[int, Any] | None = field(default=None, repr=False)  # (its steps, its session)

    @property
    def device(self) -> str:
        return cuda_memory.CUDA if self.on_gpu else cuda_memory.HOST

    @property
    def capabilities(self) -> frozenset[Capability]:
        """The static-cache graph's, its slots on the device, and greedy bursts."""
        return super().capabilities | {Capability.DEVICE_SLOTS, Capability.BURST}

    def device_slots(self, n: int, config: ModelConfig | None = None) -> DeviceSlots:
        """n device slots over this engine's graphs (what serve's scheduler steps), of `config`'s n_ctx
        positions each (default: this engine's config)."""
        return DeviceSlots(self.session, config or self.config, n, self.kv_dtype, cuda_memory.memory(self.device),
                           self.appender, self.graphs)

    def empty_past(self, batch: int) -> Past:
        """A batch of empty device slots, allocated once per batch size (the previous cache of that size
        becomes stale): the captured decode graphs keep their addresses."""
        old = self._pasts.get(batch)
        if old is None:
            slots = self.device_slots(batch)
        else:
            old.stale = True
            slots = old.slots
            slots.lengths[:] = 0
            slots.kept[:] = 0
        past = self._pasts[batch] = SlotsPast(slots)
        return past

    def step(self, last_only: bool = False) -> StepFn:
        return slot_step(self.config.vocab_size, last_only)

    def prepare_bursts(self) -> None:
        """Make the bursts' session (the graph unrolled `bursts` steps, burst.py) now, or again when
        `bursts` changed since; nothing when bursts are off. Made in the caller's thread: onnxruntime
        captures CUDA graphs in global mode, when no other thread may allocate on the device."""
        if not self.bursts or (self._burster is not None and self._burster[0] == self.bursts):
            return
        import onnx

        if self.path is None:
            raise ArtifactError("bursts unroll the engine's graph file: this engine has none")
        proto = burst.unroll(onnx.load(str(self.path)), self.bursts)  # the nodes k times, the weights once
        if proto.ByteSize() > burst.MAX_PROTO_BYTES:  # one protobuf message: onnxruntime takes it whole
            raise ArtifactError(f"{self.path}: unrolled {self.bursts} steps its graph is over 2 GB; bursts are "
                                "for graphs under 2 GB")
        self._burster = (self.bursts, burst.session_like(self.session, proto, session_options()))

    def burst(self, past: Past, tokens: np.ndarray) -> np.ndarray:
        """`bursts` greedy decode steps of every row of `past` (a cache of this engine's empty_past, after
        its prefill) in one run: tokens (B,) -> the tokens chosen after them (B, bursts). After
        prepare_bursts()."""
        if not isinstance(past, SlotsPast) or past.stale or not past.started:
            raise ValueError("a burst steps a live, prefilled cache of this engine's empty_past()")
        if self._burster is None or self._burster[0] != self.bursts:
            raise ValueError(f"no session for bursts of {self.bursts} steps: call prepare_bursts() first")
        return past.slots.burst(np.asarray(tokens, dtype=np.int64), self._burster[1], self.bursts)


def slot_step(vocab: int, last_only: bool) -> StepFn:
    """The contract's step function (left-padded ids, mask, positions) over a SlotsPast: a prefill appends
    each row's real tokens to its slot, a decode step advances every row by one token."""

    def step(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, past: Past) -> tuple[np.ndarray, Past]:
        if not isinstance(past, SlotsPast):
            raise TypeError("the device static cache steps only on the cache its engine's empty_past() made")
        if past.stale:
            raise ValueError("this cache was handed out again by a later empty_past(); one live cache per engine "
                             "and batch size")
        slots, (B, T) = past.slots, ids.shape
        if not past.started:  # a prefill: each row's tokens, left padding taken off
            past.started = True
            sizes = np.maximum(mask[:, -T:].sum(axis=1), 1)  # (B,)
            rows = [ids[b, T - n:].astype(np.int64) for b, n in enumerate(sizes)]
            if last_only:
                return slots.prefill_many(0, rows)[:, None], past  # (B, 1, V)
            got = (slots.append_many(list(range(B)), rows, all_logits=True) if slots.supports_append_many
                   else [slots.append(b, r, all_logits=True) for b, r in enumerate(rows)])
            logits = np.zeros((B, T, vocab), dtype=np.float32)  # (B, T, V): padded positions get zeros
            for b, got_b in enumerate(got):
                logits[b, T - len(got_b):] = got_b
            return logits, past
        if T == 1:
            return slots.decode(np.arange(B), ids[:, 0])[:, None], past  # (B, 1, V)
        if B == 1:
            return slots.append(0, ids[0].astype(np.int64), all_logits=not last_only)[None], past
        raise ValueError("the static cache takes several new tokens after a prefill only at batch 1")

    return step


def on_device(model: OnnxModel, appender: OnnxModel | None, cuda_graph: bool) -> DeviceModel:
    """`model` (a static-cache graph of export --cuda) as a DeviceModel; `appender`, the multi-row append
    graph's model, prefills for the one-token decode graph; `cuda_graph`: its session was made with
    enable_cuda_graph (on CUDA only)."""
    if model.cache == contract.CACHE_DECODE and appender is None:
        raise ArtifactError(f"{model.path}: the one-token decode graph needs the multi-row append graph beside it")
    return DeviceModel(model.session, model.config, model.precision, model.tokenizer_sha256, model.provider,
                       cache=model.cache, path=model.path, meta=model.meta,
                       appender=None if appender is None else appender.session,
                       graphs=cuda_graph and model.provider == "cuda")
