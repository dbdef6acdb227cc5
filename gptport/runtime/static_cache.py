"""Stepping the static-cache graph (gqa_graph.py): the KV cache is preallocated at n_ctx once, bound
as both past and present of every step (I/O binding), and GroupQueryAttention writes each new key and
value into it in place: no per-step allocation or copy of the cache. No torch here.

The graph wants each row's tokens from cache position 0 (right padding); the generation loop speaks
the contract's left-padded ids, mask and positions. The step function translates: on a prefill it
rotates each left-padded row to the front and rotates the logits back, after that each row's length
is its mask's sum.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import onnxruntime as ort

from gptport import contract
from gptport.config import ModelConfig
from gptport.runtime.engine import Past, StepFn


class StaticCache(list):  # type: ignore[type-arg]
    """[k0, v0, k1, v1, ...] OrtValues of (B, H, n_ctx, hd), and each row's cached token count
    (None until the prefill). `stale` once a later Buffers.fresh() handed its buffers out again."""

    lengths: np.ndarray | None = None
    stale: bool = False
    binding: ort.IOBinding | None = None  # the cache bound as past and present, reused step after step
    decode: DecodeStep | None = None  # the decode step's inputs and logits, bound once to the binding


class Buffers:
    """An engine's cache buffers, allocated once per batch size and reused: a fresh cache costs no
    allocation and no page faults (a prefill writes every position it will read). One live cache per
    engine: fresh() makes the previous cache of that batch size stale, and stepping it an error."""

    def __init__(self, config: ModelConfig, dtype: np.dtype) -> None:
        self.layers = config.n_layer
        self.shape = (config.n_kv_head, config.n_ctx, config.head_dim)  # (Hkv, C, hd)
        self.dtype = dtype
        self._live: dict[int, StaticCache] = {}

    def fresh(self, batch: int) -> StaticCache:
        """An empty cache of n_ctx positions per row, on the CPU."""
        old = self._live.get(batch)
        if old is None:
            cache = StaticCache(ort.OrtValue.ortvalue_from_numpy(np.zeros((batch, *self.shape), dtype=self.dtype))
                                for _ in range(2 * self.layers))
        else:
            old.stale = True
            cache = StaticCache(old)
        self._live[batch] = cache
        return cache


class DecodeStep:
    """A decode step's binding (n rows, one token each) with every input and the logits bound once to
    arrays of their own (the OrtValues share their memory): a step writes its inputs in place, runs and
    reads the logits, and no OrtValue is made or fetched per step. (cuda_slots.DeviceDecodeStep keeps
    them in device memory instead.)"""

    def __init__(self, binding: ort.IOBinding, n: int, vocab: int, logits: np.ndarray | None = None,
                 inputs: Collection[str] | None = None) -> None:
        """`logits`: a (n, 1, vocab) float32 buffer to write into (several steps may share one, as a
        view of its first rows, when only one runs at a time); by default one of its own. `inputs`: the
        graph's input names, when it lacks some of the static-cache graph's (the decode graph has no
        total_sequence_length)."""
        self.binding = binding
        self.ids = np.zeros((n, 1), dtype=np.int64)  # (n, 1)
        self.pos = np.zeros((n, 1), dtype=np.int64)  # (n, 1)
        self.seqlens_k = np.zeros(n, dtype=np.int32)  # (n,)
        self.total = np.zeros((), dtype=np.int32)
        self.logits = np.zeros((n, 1, vocab), dtype=np.float32) if logits is None else logits  # (n, 1, V)
        if self.logits.shape != (n, 1, vocab) or self.logits.dtype != np.float32 or not self.logits.flags.c_contiguous:
            raise ValueError(f"logits buffer {self.logits.shape} {self.logits.dtype}: expected ({n}, 1, {vocab}) "
                             "contiguous float32")
        self._values: list[ort.OrtValue] = []  # they must live as long as the binding
        self._bind(inputs)

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        """Each input's name and its host array, in the graph's order."""
        return [(contract.INPUT_IDS, self.ids), (contract.POSITION_IDS, self.pos), (contract.SEQLENS_K, self.seqlens_k),
                (contract.TOTAL_SEQUENCE_LENGTH, self.total),
                (contract.LOGITS_INDEX, np.zeros((len(self.ids), 1), dtype=np.int64))]

    def _bind(self, inputs: Collection[str] | None) -> None:
        for name, array in self.arrays():
            if inputs is None or name in inputs:
                self._values.append(value := ort.OrtValue.ortvalue_from_numpy(array))
                self.binding.bind_ortvalue_input(name, value)
        self._values.append(value := ort.OrtValue.ortvalue_from_numpy(self.logits))
        self.binding.bind_ortvalue_output(contract.LOGITS, value)

    def run(self, session: ort.InferenceSession) -> None:
        """One step of the inputs as they are written."""
        session.run_with_iobinding(self.binding)

    def rows(self, index: np.ndarray) -> np.ndarray:
        """The logits (k, V) of rows `index` (k,) of the step: a copy (the buffer is the next step's)."""
        return self.logits[index, 0]


def _rotation(shift: np.ndarray, width: int) -> np.ndarray:
    """(B, T) indices that rotate each row left by `shift[b]` (right for a negative shift)."""
    return (np.arange(width)[None, :] + shift[:, None]) % width


def step_fn(session: ort.InferenceSession, n_layer: int, last_only: bool = False) -> StepFn:
    """The contract's step function (left-padded ids, mask and positions) over a static-cache session.
    `last_only`: logits (B, 1, V) of each row's last token, the head computed for those rows only."""
    pasts, presents = contract.past_names(n_layer), contract.present_names(n_layer)
    vocab = next(int(o.shape[-1]) for o in session.get_outputs() if o.name == contract.LOGITS)

    def step(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, past: Past) -> tuple[np.ndarray, Past]:
        if not isinstance(past, StaticCache):
            raise TypeError("the static-cache graph steps only on the cache its engine's empty_past() made")
        if past.stale:
            raise ValueError("this static cache was handed out again by a later empty_past(); one live cache "
                             "per engine and batch size")
        B, T = ids.shape
        lengths = np.maximum(mask.sum(axis=1), 1).astype(np.int64)  # (B,) tokens after this call
        prefill = past.lengths is None
        padded = prefill and bool((lengths < T).any())
        if padded:  # left-padded (B, T) rows -> each row's tokens from position 0
            turn = _rotation(T - lengths, T)  # (B, T): each row's real tokens to the front
            ids, pos = np.take_along_axis(ids, turn, axis=1), np.take_along_axis(pos, turn, axis=1)
        if prefill:
            total = T
        elif B > 1 and T > 1:
            raise ValueError("the static-cache graph takes several new tokens after a prefill only at batch 1")
        else:
            total = int(lengths.max())
        binding = past.binding
        if binding is None:
            past.binding = binding = session.io_binding()
            for name, value in zip(pasts, past, strict=True):
                binding.bind_ortvalue_input(name, value)
            binding.bind_output(contract.LOGITS, "cpu")  # output 0; rebinding it below keeps its place
            for name, value in zip(presents, past, strict=True):
                binding.bind_ortvalue_output(name, value)  # the same buffer: appended in place
        if not prefill and T == 1:  # decode: the inputs written in place into arrays bound once
            decode = past.decode
            if decode is None:
                past.decode = decode = DecodeStep(binding, B, vocab)
            decode.ids[:, 0], decode.pos[:, 0] = ids[:, 0], pos[:, 0]
            decode.seqlens_k[:] = lengths - 1
            decode.total[()] = total
            decode.run(session)
            past.lengths = lengths
            return decode.logits.copy(), past  # (B, 1, V): the buffer is the next step's
        past.decode = None  # the inputs below replace what it bound
        binding.bind_cpu_input(contract.INPUT_IDS, np.ascontiguousarray(ids, dtype=np.int64))
        binding.bind_cpu_input(contract.POSITION_IDS, np.ascontiguousarray(pos, dtype=np.int64))
        binding.bind_cpu_input(contract.SEQLENS_K, (lengths - 1).astype(np.int32))
        binding.bind_cpu_input(contract.TOTAL_SEQUENCE_LENGTH, np.array(total, dtype=np.int32))
        if last_only:  # each row's last token: its length - 1 once rotated to the front
            index = (lengths - 1 if padded else np.full(B, T - 1, dtype=np.int64))[:, None]  # (B, 1)
        else:
            index = np.broadcast_to(np.arange(T, dtype=np.int64), (B, T))  # (B, T)
        binding.bind_cpu_input(contract.LOGITS_INDEX, np.ascontiguousarray(index))
        binding.bind_output(contract.LOGITS, "cpu")  # afresh each call: its shape changes after the prefill
        session.run_with_iobinding(binding)
        logits = binding.get_outputs()[0].numpy()  # (B, T, V), or (B, 1, V) with last_only
        if padded and not last_only:  # back to the caller's left padding; padded positions get zeros
            back = _rotation(lengths - T, T)  # (B, T): the inverse rotation
            logits = np.take_along_axis(logits, back[:, :, None], axis=1)
            logits[np.arange(T)[None, :] < (T - lengths)[:, None]] = 0.0
        past.lengths = lengths
        return logits, past

    return step


def cache_arrays(past: StaticCache) -> list[np.ndarray]:
    """The cache as numpy, each row's cached positions first: for checks against the torch cache."""
    if past.lengths is None:
        raise ValueError("nothing cached yet")
    return [value.numpy() for value in past]
