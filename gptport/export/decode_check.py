"""The one-token decode graph (cuda_graphs.py) against torch, as export checks it on the CPU before it is
renamed into place: rows of one buffer holding caches of different lengths (torch's, written in), then
decode steps of one token per row, each at its own length, the last one filling a row to n_ctx. Every
step's logits and, at the end, every row's cached keys and values, against torch run on each row's whole
sequence, within the parity bound of tolerance.py (the static-cache graphs' bound)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnxruntime as ort
import torch

from gptport import contract
from gptport.errors import ValidationError
from gptport.export.tolerance import Check, Tolerance, cache_quantities, compare, merge
from gptport.export.validate import LOGITS, ParityRow, exact_step
from gptport.runtime.onnx_engine import ORT_FAILURES
from gptport.training.model import GPT
from gptport.training.torch_engine import torch_step


def cases(n_ctx: int) -> list[tuple[str, list[int], int]]:
    """(case, each row's length before decoding, steps): the last case fills its first row to n_ctx."""
    out = [("3 rows at lengths 5, 1 and 11, 3 steps", [5, 1, 11], 3)] if n_ctx >= 16 else []
    return [*out, (f"2 rows at lengths {n_ctx - 1} and 2, 1 step", [n_ctx - 1, 2], 1)]


def _whole(model: GPT, ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], np.ndarray, list[np.ndarray]]:
    """Torch float32 and float64 on one row's whole sequence (1, L): logits (L, V) and caches (Hkv, L, hd)."""
    cfg = model.cfg
    mask = np.ones_like(ids)
    pos = np.arange(ids.shape[1], dtype=np.int64)[None, :]
    empty = [np.zeros((1, cfg.n_kv_head, 0, cfg.head_dim), dtype=np.float32) for _ in range(2 * cfg.n_layer)]
    with torch.no_grad():
        logits, past = torch_step(model)(ids, mask, pos, empty)
    exact_logits, exact_past = exact_step(model)(ids, mask, pos, empty)
    return logits[0], [p[0] for p in past], exact_logits[0], [p[0] for p in exact_past]


def _step(session: ort.InferenceSession, buffers: list[np.ndarray], tokens: np.ndarray, lengths: np.ndarray
          ) -> np.ndarray:
    """One decode step of every row, the buffers bound as past and present (written in place): logits (B, V)."""
    n_layer = len(buffers) // 2
    binding = session.io_binding()
    binding.bind_output(contract.LOGITS, "cpu")  # output 0 (get_outputs()[0])
    views = [ort.OrtValue.ortvalue_from_numpy(b) for b in buffers]
    for past, present, view in zip(contract.past_names(n_layer), contract.present_names(n_layer), views, strict=True):
        binding.bind_ortvalue_input(past, view)
        binding.bind_ortvalue_output(present, view)
    B = len(tokens)
    for name, array in ((contract.INPUT_IDS, tokens[:, None]), (contract.POSITION_IDS, lengths[:, None]),
                        (contract.SEQLENS_K, lengths.astype(np.int32)),
                        (contract.LOGITS_INDEX, np.zeros((B, 1), dtype=np.int64))):
        binding.bind_cpu_input(name, np.ascontiguousarray(array))
    session.run_with_iobinding(binding)
    return np.asarray(binding.get_outputs()[0].numpy()[:, 0])


def decode_parity(model: GPT, session: ort.InferenceSession, tol: Tolerance, seed: int = 0,
                  which: Sequence[tuple[str, list[int], int]] | None = None) -> list[ParityRow]:
    """Each case (by default cases(n_ctx)) through the decode graph's session on the CPU, compared with
    torch; a run onnxruntime refuses is a ValidationError naming the case."""
    cfg, rng = model.cfg, np.random.default_rng(seed)
    rows = []
    for name, lengths, steps in cases(cfg.n_ctx) if which is None else which:
        B = len(lengths)
        seqs = rng.integers(0, cfg.vocab_size, size=(B, max(lengths) + steps), dtype=np.int64)
        refs = [_whole(model, seqs[b:b + 1, :lengths[b] + steps]) for b in range(B)]
        buffers = [np.zeros((B, cfg.n_kv_head, cfg.n_ctx, cfg.head_dim), dtype=np.float32)
                   for _ in range(2 * cfg.n_layer)]
        for b, (_, past, _, _) in enumerate(refs):  # each row's cache before decoding: torch's
            for buf, p in zip(buffers, past, strict=True):
                buf[b, :, :lengths[b]] = p[:, :lengths[b]]
        got = np.zeros((B, steps, cfg.vocab_size), dtype=np.float32)
        at = np.array(lengths, dtype=np.int64)  # (B,)
        for s in range(steps):
            try:
                got[:, s] = _step(session, buffers, seqs[np.arange(B), at], at)
            except (RuntimeError, *ORT_FAILURES) as e:  # run_with_iobinding raises RuntimeError
                raise ValidationError(f"export: the decode graph failed on case {name}: "
                                      f"{str(e).splitlines()[0]}") from e
            at += 1
        logits: list[Check] = []
        caches: list[list[Check]] = [[] for _ in range(2 * cfg.n_layer)]
        agree = 0
        for b, (want, want_past, exact, exact_past) in enumerate(refs):
            span = slice(lengths[b], lengths[b] + steps)  # the decoded positions
            logits.append(compare(LOGITS, got[b], want[span], tol, exact[span]))
            agree += int((got[b].argmax(-1) == want[span].argmax(-1)).sum())
            for i, (q, buf) in enumerate(zip(cache_quantities(cfg.n_layer), buffers, strict=True)):
                caches[i].append(compare(q, buf[b, :, :at[b]], want_past[i], tol, exact_past[i]))
        rows.append(ParityRow(name, (merge(logits, tol), *(merge(c, tol) for c in caches)), agree / (B * steps)))
    return rows
