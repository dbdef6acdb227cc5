"""Slots of the static cache kept in device memory (the CUDA device; the host with the same code), decode
steps replayed as CUDA graphs, one per batch bucket. No torch here.

`DeviceSlots` is StaticSlots (slots.py) with its buffers in a cuda_memory.Memory. Every binding names rows
of a buffer by pointer and shape, as both past and present, so no step copies the cache to the host or
back. A decode step binds the rows [0, b) of the smallest bucket b (1, 2, 4, 8, 16, ...) that holds every
decoding row, with inputs and logits of its own in device memory, written in place (update_inplace) and
read back only for the rows asked: fixed shapes and addresses per bucket, which is what onnxruntime needs
to capture the step as a CUDA graph (run option gpu_graph_id, one id per bucket and cache) and replay it.
Prefills and appends are never captured (gpu_graph_id -1). The graph that decodes:
- fp16: the fp16 static-cache graph (GroupQueryAttention), which prefills too; total_sequence_length is
  held at n_ctx (the buffer's length) in every decode step, so that its shapes never change;
- fp32: the one-token decode graph (TensorScatter + Attention-24), beside the multi-row append graph,
  which does every prefill and append (scatter_graph.py: the same buffer layout).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from gptport import contract
from gptport.config import ModelConfig
from gptport.runtime import append, burst, cuda_memory
from gptport.runtime.cuda_memory import Memory
from gptport.runtime.slots import StaticSlots
from gptport.runtime.static_cache import DecodeStep

_GRAPH_IDS = itertools.count(1)  # a captured graph keeps the addresses it ran on: an id per bucket and cache


def buckets(slots: int) -> list[int]:
    """The batch sizes decode steps are captured at: powers of two below `slots`, then `slots`."""
    out = [1]
    while out[-1] * 2 < slots:
        out.append(out[-1] * 2)
    return out if out[-1] == slots else [*out, slots]


def bucket(rows: int, sizes: Sequence[int]) -> int:
    """The smallest of `sizes` (ascending) that holds `rows` rows."""
    for size in sizes:
        if size >= rows:
            return size
    raise ValueError(f"{rows} rows exceed the largest bucket ({sizes[-1]})")


def run_options(graph_id: int) -> ort.RunOptions:
    """Run options naming the CUDA graph a run is captured as, then replays (-1: run, never captured)."""
    options = ort.RunOptions()
    options.add_run_config_entry("gpu_graph_id", str(graph_id))
    return options


class DeviceDecodeStep(DecodeStep):
    """A decode step of n rows whose inputs and logits live in device memory at fixed addresses: the host
    arrays (ids, pos, seqlens_k) are copied in before each run, and only the rows asked come back."""

    def __init__(self, binding: ort.IOBinding, n: int, vocab: int, mem: Memory, inputs: set[str], n_ctx: int,
                 graph_id: int) -> None:
        self.mem, self.n_ctx, self.options = mem, n_ctx, run_options(graph_id)
        self.graph_id = graph_id
        super().__init__(binding, n, vocab, inputs=inputs)

    def _bind(self, inputs: Any) -> None:
        n, vocab = len(self.ids), self.logits.shape[-1]
        self._uploads: list[tuple[ort.OrtValue, np.ndarray]] = []  # device input <- host array, each step
        for name, array in self.arrays():
            if name not in inputs:
                continue
            if name == contract.TOTAL_SEQUENCE_LENGTH:  # read on the host; held at the buffer's length
                value = ort.OrtValue.ortvalue_from_numpy(np.array(self.n_ctx, dtype=np.int32))
                self.binding.bind_ortvalue_input(name, value)
                self._values.append(value)
                continue
            value = self.mem.zeros(array.shape, array.dtype)  # logits_index stays zeros
            self.binding.bind_ortvalue_input(name, value)
            self._values.append(value)
            if name != contract.LOGITS_INDEX:
                self._uploads.append((value, array))
        self._bind_output(n, vocab)

    def _bind_output(self, n: int, vocab: int) -> None:
        self.device_logits = self.mem.zeros((n, 1, vocab), np.dtype(np.float32))
        self.binding.bind_ortvalue_output(contract.LOGITS, self.device_logits)

    def run(self, session: ort.InferenceSession) -> None:
        for value, array in self._uploads:
            value.update_inplace(array)
        session.run_with_iobinding(self.binding, self.options)

    def rows(self, index: np.ndarray) -> np.ndarray:
        """The logits (k, V) of rows `index` (k,): the rows from the first to the last asked are copied."""
        lo, hi = int(index.min()), int(index.max()) + 1
        vocab = self.logits.shape[-1]
        out = np.empty((hi - lo, vocab), dtype=np.float32)
        self.mem.read(self.device_logits.data_ptr() + lo * vocab * 4, out)
        return out[index - lo]


class DeviceBurstStep(DeviceDecodeStep):
    """k greedy decode steps of n rows in one run of the unrolled graph (burst.py): the inputs of its first
    step go up as a decode step's do, and only the k chosen tokens a row come back."""

    def __init__(self, binding: ort.IOBinding, n: int, k: int, mem: Memory, inputs: set[str], n_ctx: int,
                 graph_id: int) -> None:
        self.k = k
        super().__init__(binding, n, 1, mem, inputs, n_ctx, graph_id)

    def _bind_output(self, n: int, vocab: int) -> None:
        self.device_ids = self.mem.zeros((n, self.k), np.dtype(np.int64))
        self.binding.bind_ortvalue_output(burst.BURST_IDS, self.device_ids)

    def tokens(self, rows: int) -> np.ndarray:
        """The chosen tokens (rows, k) of the first `rows` rows."""
        out = np.empty((rows, self.k), dtype=np.int64)
        self.mem.read(self.device_ids.data_ptr(), out)
        return out


class DeviceAppender(append.Appender):
    """The multi-row append graph over device buffers: a span's rows bound by pointer."""

    def __init__(self, session: ort.InferenceSession, slots: DeviceSlots, n_layer: int) -> None:
        super().__init__(session, slots.buffers, n_layer)
        self.slots = slots

    def binding(self, lo: int, n: int) -> Any:
        binding = self._bindings.get((lo, n))
        if binding is None:
            binding = self._bindings[(lo, n)] = self.session.io_binding()
            binding.bind_output(contract.LOGITS, "cpu")  # output 0 (get_outputs()[0]); rebinding keeps its place
            self.slots.bind_rows(binding, self._pasts, self._presents, lo, n)
        return binding


class DeviceSlots(StaticSlots):
    """StaticSlots with the buffers in `mem`; decode steps bucketed and, with `graphs`, replayed as CUDA
    graphs. `appender`: the multi-row append graph's session, which does every prefill when `session`
    is the one-token decode graph (it has no total_sequence_length)."""

    def __init__(self, session: Any, config: ModelConfig, slots: int, dtype: np.dtype, mem: Memory,
                 appender: Any = None, graphs: bool = False, sizes: Sequence[int] | None = None) -> None:
        self.mem, self.graphs = mem, graphs
        self._bursts: dict[tuple[int, int], DeviceBurstStep] = {}  # (bucket, k) -> a burst's binding
        self.sizes = list(sizes) if sizes is not None else buckets(slots)
        if self.sizes[-1] != slots or sorted(self.sizes) != self.sizes:
            raise ValueError(f"buckets {self.sizes}: ascending, the last one the slots ({slots})")
        self._uncaptured = run_options(-1) if graphs else None
        super().__init__(session, config, slots, dtype, appender)
        self.resident = None  # device memory: the host's residency does not apply
        self.decode_only = contract.TOTAL_SEQUENCE_LENGTH not in self._inputs
        if self.decode_only and self.appender is None:
            raise ValueError("the one-token decode graph needs the multi-row append graph beside it (appender=...)")

    def _allocate(self, shape: tuple[int, ...], dtype: np.dtype, count: int) -> list[Any]:
        self.buffers_shape, self.dtype = shape, dtype
        self.row_bytes = int(np.prod(shape[1:])) * dtype.itemsize  # one slot's (H, C, hd) values
        return [self.mem.zeros(shape, dtype) for _ in range(count)]

    def _appender(self, session: Any, layers: int) -> append.Appender:
        return DeviceAppender(session, self, layers)

    def bind_rows(self, binding: Any, pasts: list[str], presents: list[str], lo: int, n: int) -> None:
        """Rows [lo, lo + n) of every buffer bound by pointer as past and present: the same memory."""
        shape = (n, *self.buffers_shape[1:])
        offset = lo * self.row_bytes
        for past, present, buf in zip(pasts, presents, self.buffers, strict=True):
            cuda_memory.bind(binding, past, self.mem, buf, shape, self.dtype, offset)
            cuda_memory.bind(binding, present, self.mem, buf, shape, self.dtype, offset, output=True)

    def _bind_cache(self, lo: int, n: int) -> Any:
        binding = self.session.io_binding()
        binding.bind_output(contract.LOGITS, "cpu")  # output 0 (get_outputs()[0]); rebinding it keeps its place
        self.bind_rows(binding, self._pasts, self._presents, lo, n)
        return binding

    def _span(self, rows: np.ndarray) -> tuple[int, int]:
        return 0, bucket(int(rows.max()) + 1, self.sizes)

    def _decode_step(self, lo: int, n: int) -> DecodeStep:
        step = self._steps.get((lo, n))
        if step is None:
            binding = self.session.io_binding()
            self.bind_rows(binding, self._pasts, self._presents, lo, n)
            step = self._steps[(lo, n)] = DeviceDecodeStep(binding, n, self.vocab_size, self.mem, self._inputs,
                                                           self.n_ctx, next(_GRAPH_IDS) if self.graphs else -1)
        return step

    def burst(self, tokens: np.ndarray, session: Any, k: int) -> np.ndarray:
        """k greedy decode steps of the rows 0 .. B-1 (every slot of the batch, each holding 1 to n_ctx - k
        positions) in one run of `session`, the unrolled graph (burst.py): tokens (B,) the rows' next
        inputs -> the k tokens chosen after each (B, k). The rows' caches then hold the input token and
        the first k-1 chosen; the last chosen is the next input. Bucket rows past B must be empty."""
        rows = np.arange(len(tokens))  # (B,)
        lengths = self.lengths[rows]
        if (lengths == 0).any() or (lengths + k > self.n_ctx).any():
            raise ValueError(f"a burst of {k} steps needs rows holding 1 to n_ctx - {k} positions")
        lo, n = self._span(rows)
        if (self.lengths[len(rows):n] != 0).any() or (self.kept[len(rows):n] != 0).any():
            raise ValueError("a burst's bucket rows past its batch must be empty (they write positions 0 .. k-1)")
        step = self._bursts.get((n, k))
        if step is None:
            binding = session.io_binding()
            self.bind_rows(binding, self._pasts, self._presents, lo, n)
            names = {i.name for i in session.get_inputs()}
            step = self._bursts[(n, k)] = DeviceBurstStep(binding, n, k, self.mem, names, self.n_ctx,
                                                               next(_GRAPH_IDS) if self.graphs else -1)
        step.pos[:, 0] = self.lengths[lo:lo + n]  # (n,): empty rows at 0
        step.ids.fill(0)
        step.ids[rows, 0] = tokens
        step.seqlens_k[:] = step.pos[:, 0]
        step.run(session)
        got = step.tokens(len(rows))  # (B, k)
        for b in rows:
            at = int(lengths[b])
            self.tokens[b, at] = tokens[b]
            self.tokens[b, at + 1:at + k] = got[b, :k - 1]
        self.lengths[rows] += k
        self.kept[rows] = self.lengths[rows]
        return got

    def _execute(self, binding: Any) -> None:
        self.session.run_with_iobinding(binding, self._uncaptured)

    def append(self, slot: int, ids: np.ndarray, all_logits: bool = False) -> np.ndarray:
        if self.decode_only:
            return self.append_many([slot], [np.asarray(ids, dtype=np.int64)], all_logits)[0]
        return super().append(slot, ids, all_logits)

    def prefill_many(self, lo: int, prompts: Sequence[np.ndarray]) -> np.ndarray:
        if self.decode_only:
            if (self.lengths[lo:lo + len(prompts)] != 0).any():
                raise ValueError("prefill_many fills empty slots with 1 to n_ctx tokens each")
            logits = self.append_many(list(range(lo, lo + len(prompts))), prompts)
            return np.concatenate(logits)  # (k, V)
        return super().prefill_many(lo, prompts)

    def copy(self, src: int, dst: int, length: int) -> None:
        if self.lengths[dst] != 0 or not 0 < length <= self.lengths[src]:
            raise ValueError(f"copy needs a free destination and 1 to {self.lengths[src]} positions of slot {src}")
        heads, capacity, hd = self.buffers_shape[1:]
        size = self.dtype.itemsize
        for buf in self.buffers:  # (H, length, hd) of row src to row dst: H runs of length * hd values
            base = buf.data_ptr()
            self.mem.copy_2d(base + dst * self.row_bytes, capacity * hd * size, base + src * self.row_bytes,
                             capacity * hd * size, length * hd * size, heads)
        self.tokens[dst, :length] = self.tokens[src, :length]
        self.lengths[dst] = self.kept[dst] = length

    def cache_rows(self, index: int, row: int, length: int) -> np.ndarray:
        """Buffer `index`'s row `row`, its first `length` positions, copied to the host: (H, length, hd)."""
        out = np.empty(self.buffers_shape[1:], dtype=self.dtype)
        self.mem.read(self.buffers[index].data_ptr() + row * self.row_bytes, out)
        return out[:, :length]

    @property
    def graph_ids(self) -> dict[int, int]:
        """The CUDA graph id of each bucket decoded so far (-1: not captured)."""
        return {n: step.graph_id for (_, n), step in self._steps.items() if isinstance(step, DeviceDecodeStep)}
