"""Appending several tokens to each of several rows of the static cache in one run, with the multi-row
append graph (export/scatter_graph.py) over the buffers StaticSlots keeps: which rows go into one run,
where each row of the bound span writes, and the run itself. No torch here.

A run binds rows [lo, hi) of every buffer as both past and present (the graph's TensorScatter writes in
place). The new tokens go in packed (the matrix products run on real tokens only), but each layer's
cache write covers the same K positions in every row of the span (the run's longest chunk), from the
row's own `write_index`:
- a row that appends k < K tokens writes padding past its real tokens, where no
  attention reads (each row attends to its first write_index + K positions, causally, and its real
  tokens come first) and its next append writes over it;
- a busy row of the span that appends nothing writes padding at its own length, likewise unread;
- a free row writes past the prefix it keeps for reuse (`kept`), which shrinks to n_ctx - K if the
  padding would not fit after it.
So every row needs write_index + K <= n_ctx: a member whose length + K exceeds it is appended alone,
and a busy non-member whose padding would not fit splits the span in two runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from gptport import contract


@dataclass(frozen=True)
class Run:
    """One run of the multi-row append graph: rows [lo, lo + n) bound, the members' slots in the order
    asked (their chunks' indices in `order`), K positions written per row."""

    lo: int
    n: int
    order: tuple[int, ...]  # indices into the request's (slots, chunks) of the rows appended by this run
    width: int  # K


def plan(lengths: np.ndarray, n_ctx: int, slots: Sequence[int], sizes: Sequence[int]) -> tuple[list[Run], list[int]]:
    """The runs that append sizes[i] tokens to slots[i] (every slot distinct, lengths (S,) what each slot
    holds), and the indices of the requests appended alone (length + the run's K > n_ctx)."""
    width = max(sizes)
    alone = [i for i, s in enumerate(slots) if lengths[s] + width > n_ctx]
    together = sorted((i for i in range(len(slots)) if i not in set(alone)), key=lambda i: slots[i])
    groups: list[list[int]] = []
    for i in together:
        if groups:
            prev = slots[groups[-1][-1]]
            between = lengths[prev + 1:slots[i]]  # (m,) the non-members between two members
            if ((between > 0) & (between + width > n_ctx)).any():  # a busy row whose padding would not fit
                groups.append([])
        else:
            groups.append([])
        groups[-1].append(i)
    runs = []
    for g in groups:
        lo, hi = slots[g[0]], slots[g[-1]] + 1
        runs.append(Run(lo, hi - lo, tuple(g), max(sizes[i] for i in g)))
    return runs, alone


class Appender:
    """The multi-row append graph's session over a slot engine's buffers: one I/O binding per bound span
    (lo, n), made once, with the cache rows bound as past and present (the same memory: written in place)."""

    def __init__(self, session: ort.InferenceSession, buffers: Sequence[np.ndarray], n_layer: int) -> None:
        self.session, self.buffers = session, buffers
        self._pasts, self._presents = contract.past_names(n_layer), contract.present_names(n_layer)
        self._bindings: dict[tuple[int, int], Any] = {}
        self._views: list[ort.OrtValue] = []  # OrtValues over the buffers: they must live as long as their bindings

    def binding(self, lo: int, n: int) -> Any:
        """The I/O binding of rows [lo, lo + n), made once."""
        binding = self._bindings.get((lo, n))
        if binding is None:
            binding = self._bindings[(lo, n)] = self.session.io_binding()
            binding.bind_output(contract.LOGITS, "cpu")  # output 0 (get_outputs()[0]); rebinding keeps its place
            for past, present, buf in zip(self._pasts, self._presents, self.buffers, strict=True):
                view = ort.OrtValue.ortvalue_from_numpy(buf[lo:lo + n])  # shares the buffer's memory
                self._views.append(view)
                binding.bind_ortvalue_input(past, view)
                binding.bind_ortvalue_output(present, view)  # the same memory: TensorScatter writes in place
        return binding

    def run(self, lo: int, write: np.ndarray, chunks: Mapping[int, np.ndarray], all_logits: bool = False
            ) -> dict[int, np.ndarray]:
        """Rows [lo, lo + n) each write from write (n,); row r of the span appends chunks[r] (T_r,), the
        others padding. The logits of each chunk's tokens (T_r, V), or of its last one (1, V), by row."""
        packed = pack(write, chunks, all_logits)
        binding = self.binding(lo, len(write))
        for name, value in packed.feeds.items():
            binding.bind_cpu_input(name, value)
        binding.bind_output(contract.LOGITS, "cpu")  # afresh each call: its shape changes
        self.session.run_with_iobinding(binding)
        logits = binding.get_outputs()[0].numpy()[0]  # (L, V)
        if all_logits:
            return {r: logits[a:a + k] for r, (a, k) in packed.places.items()}
        return {r: logits[i:i + 1] for i, r in enumerate(packed.places)}


@dataclass(frozen=True)
class Packed:
    """One run's inputs but the cache, and where each appending row's tokens lie in its packed sequence."""

    feeds: dict[str, np.ndarray]
    places: dict[int, tuple[int, int]]  # row of the span -> (its first place among the T new tokens, its count)


def pack(write: np.ndarray, chunks: Mapping[int, np.ndarray], all_logits: bool = False) -> Packed:
    """The multi-row append graph's inputs (but the cache) for rows that each write from write (n,), row r
    appending chunks[r] (T_r,) and the others padding: the logits of every new token with `all_logits`, else of
    each chunk's last. What Appender.run binds, and what export's layer-by-layer check feeds (append_layers.py)."""
    order = np.array(sorted(chunks), dtype=np.int64)  # (m,) the appending rows, in span order
    sizes = np.array([len(chunks[r]) for r in order], dtype=np.int64)  # (m,)
    starts = np.cumsum(sizes) - sizes  # (m,) each row's first place in the packed sequence
    total, width = int(sizes.sum()), int(sizes.max())
    row = np.repeat(order, sizes)  # (T,) each packed token's row
    j = np.arange(total, dtype=np.int64) - np.repeat(starts, sizes)  # (T,) its place in its row
    pack_index = np.zeros((len(write), width), dtype=np.int64)  # (n, K); a row appending nothing reads place 0
    pack_index[order] = starts[:, None] + np.minimum(np.arange(width)[None, :], sizes[:, None] - 1)  # padding: last
    wanted = np.arange(total, dtype=np.int64) if all_logits else starts + sizes - 1  # (L,)
    feeds = {contract.INPUT_IDS: np.concatenate([chunks[r] for r in order]).astype(np.int64)[None],  # (1, T)
             contract.POSITION_IDS: (write[row] + j)[None].astype(np.int64),  # (1, T)
             contract.WRITE_INDEX: np.ascontiguousarray(write, dtype=np.int64),  # (n,)
             contract.PACK_INDEX: pack_index,
             contract.UNPACK_INDEX: row * width + j,  # (T,)
             contract.LOGITS_INDEX: wanted[None]}  # (1, L)
    return Packed(feeds, {int(r): (int(a), int(k)) for r, a, k in zip(order, starts, sizes, strict=True)})
