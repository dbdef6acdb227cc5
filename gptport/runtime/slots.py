"""A model as continuous batching sees it: a KV cache of S rows (slots), each holding one sequence.

A slot is filled by `append` (a prompt, or a chunk of one, on its own), and `decode` advances every
busy slot by one token in one step. Slots come and go independently; nothing here samples or knows
about requests. No torch here.

- `StaticSlots`, over the static-cache graph (gqa_graph.py, CPU): one (S, H, n_ctx, hd) buffer per key
  and value. A step over rows [lo, lo + n) binds views of those rows as both past and present, and
  GroupQueryAttention writes each row's new keys and values at that row's own length, in place.
  A freed slot keeps the tokens its cache holds: `reuse` lets a prompt that starts with them go on
  from there (prefix caching), `copy` hands one slot's first positions to another. With the multi-row
  append graph beside it (export/scatter_graph.py), `append_many` appends chunks of any length to several
  rows, each at its own length, in one run over the same buffers (runtime/append.py).
- `ConcatSlots` (concat_slots.py), over any `Engine` (the contract graph on any provider, or the torch
  model): the busy slots' caches form one left-padded batch; a slot joins it by padding and leaves by
  being cut out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from gptport import contract
from gptport.config import ModelConfig
from gptport.runtime import append, hugepages
from gptport.runtime.engine import FLOAT32
from gptport.runtime.static_cache import DecodeStep


class SlotEngine(Protocol):
    """What the scheduler needs of a model: S slots of n_ctx positions each. length, append, decode and
    free are what every slot engine does; the capabilities below say which of the optional methods work
    (the others raise NotImplementedError), so the scheduler asks them rather than probing for methods."""

    n_ctx: int
    slots: int
    # cached, reuse, copy and truncate: a freed slot keeps its cache, and positions are shared or rolled back
    supports_reuse: bool = False
    # prefill_many: whole prompts into adjacent empty slots in one step
    supports_prefill_many: bool = False
    # decode takes a slot whose prompt is one token short, beside the decoding ones (its last token joins the step)
    supports_join: bool = False
    # append_many: chunks of any length appended to several slots, each at its own length, in one step
    supports_append_many: bool = False

    def length(self, slot: int) -> int:
        """Positions the slot holds."""
        ...

    def append(self, slot: int, ids: np.ndarray, all_logits: bool = False) -> np.ndarray:
        """Write ids (T,) at the slot's next T positions: logits (T, V), or (1, V) of the last token."""
        ...

    def decode(self, slots: Sequence[int], tokens: np.ndarray) -> np.ndarray:
        """One token per slot (k,) at its next position, all in one step: logits (k, V) in `slots` order."""
        ...

    def free(self, slot: int) -> None:
        """Forget the slot's sequence; its positions are reused by the next append."""
        ...

    def cached(self, slots: Sequence[int], ids: Sequence[int]) -> np.ndarray:
        """For each slot, how many of ids' first tokens its kept cache holds (k,) (supports_reuse)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no cache of freed slots")

    def reuse(self, slot: int, ids: Sequence[int]) -> int:
        """Take up a free slot's kept cache for a prompt; the positions reused (supports_reuse)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no cache of freed slots")

    def copy(self, src: int, dst: int, length: int) -> None:
        """Give the free slot dst the first `length` positions of src's cache (supports_reuse)."""
        raise NotImplementedError(f"{type(self).__name__} copies no cache between slots")

    def truncate(self, slot: int, length: int) -> None:
        """Keep the slot's first `length` positions (supports_reuse)."""
        raise NotImplementedError(f"{type(self).__name__} rolls no positions back")

    def prefill_many(self, lo: int, prompts: Sequence[np.ndarray]) -> np.ndarray:
        """Whole prompts into the empty slots lo, lo+1, ... in one step: logits (k, V) (supports_prefill_many)."""
        raise NotImplementedError(f"{type(self).__name__} prefills one slot at a time")

    def append_many(self, slots: Sequence[int], chunks: Sequence[np.ndarray], all_logits: bool = False
                    ) -> list[np.ndarray]:
        """append() of chunks[i] to slots[i] for every i, in one step (supports_append_many)."""
        raise NotImplementedError(f"{type(self).__name__} appends to one slot at a time")


class StaticSlots(SlotEngine):
    """Slots as rows of the static-cache graph's preallocated cache (CPU, float32). Its decode step takes
    any rows that hold positions, so it does all the optional methods; append_many needs `appender`, a
    session of the multi-row append graph of the same weights."""

    supports_reuse = supports_prefill_many = supports_join = True

    def __init__(self, session: Any, config: ModelConfig, slots: int, dtype: np.dtype = FLOAT32,
                 appender: Any = None, hold: bool = False) -> None:
        self.session, self.slots = session, slots
        self.n_ctx, layers, self.vocab_size = config.n_ctx, config.n_layer, config.vocab_size
        self._pasts, self._presents = contract.past_names(layers), contract.present_names(layers)
        shape = (slots, config.n_kv_head, self.n_ctx, config.head_dim)  # (S, Hkv, C, hd)
        nbytes = 2 * layers * int(np.prod(shape)) * np.dtype(dtype).itemsize
        self.resident: bool | None = hold and hugepages.fits(nbytes)  # `hold` (serve's): faulted in when made
        self.buffers = self._allocate(shape, np.dtype(dtype), 2 * layers)
        self.lengths = np.zeros(slots, dtype=np.int64)  # (S,)
        self.tokens = np.zeros((slots, self.n_ctx), dtype=np.int64)  # (S, C) the ids each row's cache was written with
        self.kept = np.zeros(slots, dtype=np.int64)  # (S,) positions of `tokens` the cache holds, freed rows too
        self._bindings: dict[tuple[int, int], Any] = {}
        self._steps: dict[tuple[int, int], DecodeStep] = {}
        # one logits buffer for every decode span (its first n rows): a span per (lo, n) with logits of
        # its own would hold ~S^3/6 rows of V floats (9 GB at 64 slots and GPT-2's vocabulary)
        self._logits = np.zeros((slots, 1, config.vocab_size), dtype=np.float32)  # (S, 1, V)
        self._views: list[Any] = []  # OrtValues over the buffers: they must live as long as their bindings
        self._inputs = {i.name for i in session.get_inputs()}  # the decode graph has no total_sequence_length
        if appender is not None and np.dtype(dtype) != FLOAT32:
            raise ValueError(f"the multi-row append graph's cache is float32, not {np.dtype(dtype)}")
        self.appender = None if appender is None else self._appender(appender, layers)
        self.supports_append_many = self.appender is not None

    def _allocate(self, shape: tuple[int, ...], dtype: np.dtype, count: int) -> list[Any]:
        """The cache buffers: `count` zero-filled arrays of `shape`, faulted in now where `resident`
        (hugepages.resident_zeros: a fresh server's first prompts do not pay for touching their rows)."""
        zeros = hugepages.resident_zeros if self.resident else np.zeros
        return [zeros(shape, dtype) for _ in range(count)]

    def _appender(self, session: Any, layers: int) -> append.Appender:
        """The multi-row append graph's runs over the buffers."""
        return append.Appender(session, self.buffers, layers)

    def length(self, slot: int) -> int:
        return int(self.lengths[slot])

    def _binding(self, lo: int, n: int) -> Any:
        """An I/O binding with rows [lo, lo + n) of every cache buffer bound as past and present."""
        binding = self._bindings.get((lo, n))
        if binding is None:
            binding = self._bindings[(lo, n)] = self._bind_cache(lo, n)
        return binding

    def _bind_cache(self, lo: int, n: int) -> Any:
        binding = self.session.io_binding()
        binding.bind_output(contract.LOGITS, "cpu")  # output 0 (get_outputs()[0]); rebinding it keeps its place
        for past, present, buf in zip(self._pasts, self._presents, self.buffers, strict=True):
            view = ort.OrtValue.ortvalue_from_numpy(buf[lo:lo + n])  # shares the buffer's memory
            self._views.append(view)
            binding.bind_ortvalue_input(past, view)
            binding.bind_ortvalue_output(present, view)  # the same memory: appended in place
        return binding

    def _decode_step(self, lo: int, n: int) -> DecodeStep:
        """The decode binding of rows [lo, lo + n), made once."""
        step = self._steps.get((lo, n))
        if step is None:
            step = self._steps[(lo, n)] = DecodeStep(self._bind_cache(lo, n), n, self.vocab_size, self._logits[:n],
                                                     self._inputs)
        return step

    def _span(self, rows: np.ndarray) -> tuple[int, int]:
        """The rows [lo, lo + n) a decode step of `rows` (k,) binds: from the first to the last."""
        lo = int(rows.min())
        return lo, int(rows.max()) + 1 - lo

    def _execute(self, binding: Any) -> None:
        """One run of a binding that is not a decode step's (a prefill, an append)."""
        self.session.run_with_iobinding(binding)

    def _run(self, binding: Any, ids: np.ndarray, pos: np.ndarray, seqlens_k: np.ndarray, total: int,
             index: np.ndarray) -> np.ndarray:
        binding.bind_cpu_input(contract.INPUT_IDS, np.ascontiguousarray(ids, dtype=np.int64))
        binding.bind_cpu_input(contract.POSITION_IDS, np.ascontiguousarray(pos, dtype=np.int64))
        binding.bind_cpu_input(contract.SEQLENS_K, seqlens_k.astype(np.int32))
        binding.bind_cpu_input(contract.TOTAL_SEQUENCE_LENGTH, np.array(total, dtype=np.int32))
        binding.bind_cpu_input(contract.LOGITS_INDEX, np.ascontiguousarray(index, dtype=np.int64))
        binding.bind_output(contract.LOGITS, "cpu")  # afresh each call: its shape changes
        self._execute(binding)
        return binding.get_outputs()[0].numpy()  # (B, L, V)

    def append(self, slot: int, ids: np.ndarray, all_logits: bool = False) -> np.ndarray:
        start, T = int(self.lengths[slot]), len(ids)
        if start + T > self.n_ctx:
            raise ValueError(f"slot {slot}: {start} + {T} positions exceed n_ctx {self.n_ctx}")
        pos = np.arange(start, start + T, dtype=np.int64)[None, :]  # (1, T)
        index = np.arange(T, dtype=np.int64)[None, :] if all_logits else np.array([[T - 1]], dtype=np.int64)
        logits = self._run(self._binding(slot, 1), ids[None, :], pos, np.array([start + T - 1]), start + T, index)
        self.lengths[slot] += T
        self.tokens[slot, start:start + T] = ids
        self.kept[slot] = start + T
        return logits[0]  # (T, V) or (1, V)

    def prefill_many(self, lo: int, prompts: Sequence[np.ndarray]) -> np.ndarray:
        """Whole prompts into the empty slots lo, lo+1, ... in one step (the rows' matrix products share
        the weights' reads): the logits (k, V) of each prompt's last token."""
        k, lens = len(prompts), np.array([len(p) for p in prompts], dtype=np.int64)  # (k,)
        if (self.lengths[lo:lo + k] != 0).any() or lens.max() > self.n_ctx or lens.min() < 1:
            raise ValueError("prefill_many fills empty slots with 1 to n_ctx tokens each")
        T = int(lens.max())
        ids = np.zeros((k, T), dtype=np.int64)  # (k, T) right-padded: GroupQueryAttention reads seqlens_k
        for r, p in enumerate(prompts):
            ids[r, :len(p)] = p
        pos = np.broadcast_to(np.arange(T, dtype=np.int64), (k, T))  # (k, T); padding writes past each row's end
        logits = self._run(self._binding(lo, k), ids, pos, lens - 1, T, (lens - 1)[:, None])
        self.lengths[lo:lo + k] = self.kept[lo:lo + k] = lens
        for r, p in enumerate(prompts):
            self.tokens[lo + r, :len(p)] = p
        return logits[:, 0]  # (k, V)

    def append_many(self, slots: Sequence[int], chunks: Sequence[np.ndarray], all_logits: bool = False
                    ) -> list[np.ndarray]:
        """Write chunks[i] (T_i,) at slot slots[i]'s next positions for every i, in as few runs of the
        multi-row append graph as the rows allow (one, unless a row is near n_ctx: append.plan): the
        logits (T_i, V) of each chunk, or (1, V) of its last token."""
        if self.appender is None:
            raise NotImplementedError("append_many needs the multi-row append graph (StaticSlots(appender=...))")
        sizes = [len(c) for c in chunks]
        if len(set(slots)) != len(slots) or len(sizes) != len(slots) or min(sizes, default=1) < 1:
            raise ValueError("append_many takes distinct slots with 1 or more tokens each")
        over = [s for s, k in zip(slots, sizes, strict=True) if self.lengths[s] + k > self.n_ctx]
        if over:
            raise ValueError(f"slot {over[0]}: {self.lengths[over[0]]} + its tokens exceed n_ctx {self.n_ctx}")
        out: list[np.ndarray] = [np.empty(0)] * len(slots)
        runs, alone = append.plan(self.lengths, self.n_ctx, slots, sizes)
        for run in runs:
            rows = np.arange(run.lo, run.lo + run.n)  # (n,)
            members = {slots[i] - run.lo: i for i in run.order}  # row in the span -> request index
            write = self.lengths[rows].copy()  # (n,) where each row writes
            free = write == 0
            free[list(members)] = False
            write[free] = np.minimum(self.kept[rows][free], self.n_ctx - run.width)  # past a kept prefix
            self.kept[rows[free]] = write[free]
            logits = self.appender.run(run.lo, write, {r: np.asarray(chunks[i]) for r, i in members.items()},
                                       all_logits)
            for r, i in members.items():
                out[i] = logits[r]  # (T_i, V) or (1, V)
                slot, start = run.lo + r, int(write[r])
                self.tokens[slot, start:start + sizes[i]] = chunks[i]
                self.lengths[slot] = self.kept[slot] = start + sizes[i]
        for i in alone:
            out[i] = self.append(slots[i], np.asarray(chunks[i], dtype=np.int64), all_logits)
        return out

    def decode(self, slots: Sequence[int], tokens: np.ndarray) -> np.ndarray:
        rows = np.asarray(slots, dtype=np.int64)  # (k,)
        if (self.lengths[rows] >= self.n_ctx).any() or (self.lengths[rows] == 0).any():
            raise ValueError("decode needs slots that hold between 1 and n_ctx - 1 positions")
        lo, n = self._span(rows)
        hi = lo + n
        # Rows in [lo, hi) that are not decoding step a dummy token at their own length: a row between
        # prefill chunks writes token 0 where its next append writes; a free row writes at position 0 the
        # token its kept cache holds there, which leaves those keys and values as they were (position 0
        # attends to itself alone), so a prefix kept for reuse survives.
        step = self._decode_step(lo, n)
        np.minimum(self.lengths[lo:hi], self.n_ctx - 1, out=step.pos[:, 0])  # (n,) write positions
        step.ids.fill(0)
        kept = (self.lengths[lo:hi] == 0) & (self.kept[lo:hi] > 0)  # (n,) free rows holding a cache
        step.ids[kept, 0] = self.tokens[lo:hi, 0][kept]
        step.ids[rows - lo, 0] = tokens
        step.seqlens_k[:] = step.pos[:, 0]
        step.total[()] = step.seqlens_k.max() + 1
        step.run(self.session)
        self.tokens[rows, self.lengths[rows]] = tokens
        self.lengths[rows] += 1
        self.kept[rows] = self.lengths[rows]
        return step.rows(rows - lo)  # (k, V): a copy; the buffer is the next step's

    def free(self, slot: int) -> None:
        self.lengths[slot] = 0  # tokens and kept stay: the cache is there for `reuse`

    def cached(self, slots: Sequence[int], ids: Sequence[int]) -> np.ndarray:
        """For each slot, how many of ids' first tokens its cache holds (k,), at most len(ids) - 1: the
        last token is always run, its logits are the request's first."""
        rows = np.asarray(slots, dtype=np.int64)  # (k,)
        n = min(len(ids) - 1, int(self.kept[rows].max(initial=0)))
        if n <= 0:
            return np.zeros(len(rows), dtype=np.int64)
        same = self.tokens[rows, :n] == np.asarray(ids[:n], dtype=np.int64)  # (k, n)
        run = np.where(same.all(axis=1), n, np.argmin(same, axis=1))  # (k,) the first mismatch
        return np.minimum(run, self.kept[rows])

    def reuse(self, slot: int, ids: Sequence[int]) -> int:
        """Take up a free slot's kept cache for a prompt: its length becomes the shared prefix's, which the
        next append goes on from; the positions reused."""
        if self.lengths[slot] != 0:
            raise ValueError(f"slot {slot} is in use; only a free slot's cache is reused")
        m = int(self.cached([slot], ids)[0])
        self.lengths[slot] = self.kept[slot] = m
        return m

    def copy(self, src: int, dst: int, length: int) -> None:
        """Give the free slot dst the first `length` positions of src's cache (a prompt prefilled once for
        several choices, or a prefix another row holds)."""
        if self.lengths[dst] != 0 or not 0 < length <= self.lengths[src]:
            raise ValueError(f"copy needs a free destination and 1 to {self.lengths[src]} positions of slot {src}")
        for buf in self.buffers:
            buf[dst, :, :length] = buf[src, :, :length]  # (H, length, hd)
        self.tokens[dst, :length] = self.tokens[src, :length]
        self.lengths[dst] = self.kept[dst] = length

    def truncate(self, slot: int, length: int) -> None:
        """Keep the slot's first `length` positions (a rejected draft's are rolled back: the next append
        writes over them, and attention reads only up to the length)."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"slot {slot} holds {self.lengths[slot]} positions; cannot keep {length}")
        self.lengths[slot] = self.kept[slot] = length
