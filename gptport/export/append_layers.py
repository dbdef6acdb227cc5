"""The multi-row append graph (scatter_graph.py) checked layer by layer, for a model too large to hold in torch.
The cases (defined here, shared with append_check.py: rows of one cache filled by uneven chunks at different
lengths, then one token each) are fed as serve feeds them (runtime/append.pack); the graph runs in pieces cut from
its file (chunked.py: at most CHUNK_BYTES of its weights at once) against the torch model run one layer at a time
(layer_reference.py) on each case's rows, right-padded. Per row, every new token's residual stream after each
layer and logits, and at the end each layer's cached keys and values, within the relative bounds of tolerance.py
(record 0031), merged over the rows. The reference runs before the pieces open, and keeps each row's real
positions only. No torch at import."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gptport.config import ModelConfig
from gptport.errors import ValidationError
from gptport.export import chunked, layer_check, layer_reference
from gptport.export.layer_reference import LayerOut
from gptport.export.tolerance import Check, Tolerance, merge
from gptport.export.validate import PARITY_SPAN, ParityRow
from gptport.runtime.append import pack

if TYPE_CHECKING:
    import torch

Steps = list[list[int]]  # chunk sizes per step per row; 0 skips the row
Made = tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]  # a call's logits, residual streams, presents


def cases(n_ctx: int) -> list[tuple[str, Steps]]:
    """(case, chunk sizes per step per row): each case starts from empty rows; a size of 0 skips the row."""
    if n_ctx >= 24:
        n = min(n_ctx, PARITY_SPAN)  # the cache's end where n_ctx is short; PARITY_SPAN positions of a long one
        return [("3 rows: 7/1/12 then 5/9/1 then 1 each", [[7, 1, 12], [5, 9, 1], [1, 1, 1]]),
                (f"2 rows: {n - 3} and 2, then 3 and 1", [[n - 3, 2], [3, 1]])]
    return [("2 rows: 3/1 then 2/3 then 1 each", [[3, 1], [2, 3], [1, 1]])]


@dataclass
class Run:
    """One case as the graph's calls: the inputs of each (but the cache), where each row's tokens lie in each
    call's packed sequence, each row's whole sequence, and the cache's capacity the calls need."""

    calls: list[dict[str, np.ndarray]]
    places: list[dict[int, tuple[int, int]]]  # per call: row -> (first place among its new tokens, count)
    seqs: list[list[int]]  # per row: every token it appended
    capacity: int  # the largest write_index + K of any call


def plan(steps: Steps, vocab_size: int, rng: np.random.Generator) -> Run:
    """The calls of a case: each step appends to every row its chunk of random ids (drawn as append_check draws
    them), each row writing at its length (one bound span of every row, as StaticSlots.append_many runs them)."""
    n = len(steps[0])
    run = Run([], [], [[] for _ in range(n)], 0)
    for sizes in steps:
        write = np.array([len(s) for s in run.seqs], dtype=np.int64)  # (n,) each row's length
        chunks = {r: rng.integers(0, vocab_size, sizes[r], dtype=np.int64) for r in range(n) if sizes[r]}
        packed = pack(write, chunks, all_logits=True)
        run.calls.append(packed.feeds)
        run.places.append(packed.places)
        run.capacity = max(run.capacity, int(write.max()) + max(sizes))
        for r, chunk in chunks.items():
            run.seqs[r] += chunk.tolist()
    return run


Rows = list[list[LayerOut | np.ndarray]]  # per row: each layer's outputs then the logits, its real positions only


def padded(seqs: Sequence[Sequence[int]], dtype: torch.dtype | None = None) -> dict[str, Any]:
    """run_layers' arguments for the rows' sequences at once: right-padded (causal: no real token sees the
    padding), positions from 0, in float32 or `dtype`."""
    B, T = len(seqs), max(len(s) for s in seqs)
    ids, mask = np.zeros((B, T), np.int64), np.zeros((B, T), np.int64)  # (B, T)
    for r, s in enumerate(seqs):
        ids[r, :len(s)], mask[r, :len(s)] = s, 1
    pos = np.tile(np.arange(T, dtype=np.int64), (B, 1))  # (B, T)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "dtype": dtype}


def cut_rows(outs: Sequence[LayerOut | np.ndarray], seqs: Sequence[Sequence[int]]) -> Rows:
    """run_layers' outputs on padded(seqs) cut to each row's real positions (1, L, ...), copied (the padded go)."""
    rows: Rows = [[] for _ in seqs]
    for out in outs:
        for r, s in enumerate(seqs):
            n = len(s)
            rows[r].append(out[r:r + 1, :n].copy() if isinstance(out, np.ndarray) else LayerOut(
                out.index, out.hidden[r:r + 1, :n].copy(), out.key[r:r + 1, :, :n].copy(),
                out.value[r:r + 1, :, :n].copy()))
    return rows


def reference(cfg: ModelConfig, weights: Mapping[str, np.ndarray], seqs: Sequence[Sequence[int]],
              dtype: torch.dtype | None = None) -> Rows:
    """run_layers (float32, or `dtype`) on the rows' sequences at once (padded), each output cut to each row's
    real positions."""
    return cut_rows(list(layer_reference.run_layers(cfg, weights, **padded(seqs, dtype))), seqs)


def check(graph: Path, taps: Sequence[str], cfg: ModelConfig, weights: Mapping[str, np.ndarray], tol: Tolerance,
          which: Sequence[tuple[str, Steps]] | None = None, seed: int = 0, budget: int = chunked.CHUNK_BYTES
          ) -> list[ParityRow]:
    """The append graph at `graph` (its residual stream after each layer at `taps`) on each case (by default
    cases(min(n_ctx, layer_check.CHECK_SPAN)): the lengths of the layer-by-layer check), against the reference:
    a row per case, its checks each layer's hidden states, keys and values and the logits, its top-1 agreement
    at every real position. A run onnxruntime refuses is a ValidationError naming the case."""
    import torch

    rng = np.random.default_rng(seed)
    chosen = cases(min(cfg.n_ctx, layer_check.CHECK_SPAN)) if which is None else which
    runs = [plan(steps, cfg.vocab_size, rng) for _, steps in chosen]
    groups = [(i, g) for i, run in enumerate(runs) for g in _batches(run.seqs)]
    outs = layer_reference.run_together(cfg, weights, [padded(g, dtype) for _, g in groups
                                                       for dtype in (torch.float32, torch.float64)])
    references: list[tuple[Rows, Rows]] = [([], []) for _ in runs]  # each layer read once for every row, both types
    for k, (i, g) in enumerate(groups):
        references[i][0].extend(cut_rows(outs[2 * k], g))
        references[i][1].extend(cut_rows(outs[2 * k + 1], g))
    empties = [[np.zeros((len(run.seqs), cfg.n_kv_head, run.capacity, cfg.head_dim), np.float32)] * (2 * cfg.n_layer)
               for run in runs]
    cut = layer_check.pieces(graph, taps, cfg, weights, budget, prepack=False)  # chunked.Chunked: float32, parity
    try:
        try:
            made = cut.chains([(run.calls, empty) for run, empty in zip(runs, empties, strict=True)])
        except chunked.ChainFailed as e:
            raise ValidationError(f"export: the multi-row append graph failed on case {chosen[e.chain][0]}: "
                                  f"{str(e.__cause__).splitlines()[0]}") from e
        return [_compared(name, run, got, want, exact, tol)
                for (name, _), run, got, (want, exact) in zip(chosen, runs, made, references, strict=True)]
    finally:
        cut.close()


def _batches(seqs: list[list[int]]) -> list[list[list[int]]]:
    """A case's rows for the reference: one padded batch where padding would be at most a quarter of it (3 rows of
    13, 11 and 14 tokens: one run a float type, not three), else each row alone (29 padded positions of 32 were
    most of a float64 run's work)."""
    longest = max(len(s) for s in seqs)
    if 4 * sum(longest - len(s) for s in seqs) <= longest * len(seqs):
        return [seqs]
    return [[s] for s in seqs]


def _compared(name: str, run: Run, made: list[Made], want: Rows, exact: Rows, tol: Tolerance) -> ParityRow:
    """One case's row: each row's outputs (_gathered) against the reference's of that row (`exact`: its float64
    twin); each quantity merged over the rows."""
    per_row: list[list[Check]] = []
    agree = total = 0
    for r, seq in enumerate(run.seqs):
        logits, outs = _gathered(run, made, r)
        per_row.append(layer_reference.compare_layers(want[r], outs.__getitem__, logits, tol, exact[r]))
        reference_logits = want[r][-1]
        assert isinstance(reference_logits, np.ndarray)  # (1, L, V): run_layers' last item
        agree += int((logits.argmax(-1) == reference_logits.argmax(-1)).sum())
        total += len(seq)
    return ParityRow(name, tuple(merge(same, tol) for same in zip(*per_row, strict=True)), agree / total)


def _gathered(run: Run, made: list[Made], r: int) -> tuple[np.ndarray, list[LayerOut]]:
    """Row r's logits (1, L, V) and each layer's output: its residual stream (1, L, D), gathered from the calls
    that appended to it, and its keys and values (1, Hkv, L, hd), from the cache after the last call."""
    length = len(run.seqs[r])
    mine = [(out, run.places[c][r]) for c, out in enumerate(made) if r in run.places[c]]
    logits = np.concatenate([out[0][0, a:a + k] for out, (a, k) in mine])[None]  # (1, L, V)
    presents = made[-1][2]  # (B, Hkv, C, hd) each
    outs = [LayerOut(i, np.concatenate([out[1][i][0, a:a + k] for out, (a, k) in mine])[None],  # (1, L, D)
                     presents[2 * i][r:r + 1, :, :length], presents[2 * i + 1][r:r + 1, :, :length])
            for i in range(len(presents) // 2)]
    return logits, outs
