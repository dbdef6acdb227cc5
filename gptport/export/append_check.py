"""The multi-row append graph (scatter_graph.py) against torch, as export checks it before it is renamed
into place: rows of one StaticSlots (the static-cache graph beside it, the two graphs sharing the cache)
filled and extended by append_many in uneven chunks at different lengths, then one token each, then a
row filled to min(n_ctx, validate.PARITY_SPAN) beside one that holds a few positions. Every real
position's logits and, at the end, every row's cached keys and values, against torch run on each row's
whole sequence, within the parity bound of tolerance.py (the same as the static-cache graph's)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnxruntime as ort
import torch

from gptport.errors import ValidationError
from gptport.export.append_layers import cases
from gptport.export.tolerance import Check, Tolerance, cache_quantities, compare, merge
from gptport.export.validate import LOGITS, ParityRow, exact_step
from gptport.runtime.engine import StepFn
from gptport.runtime.onnx_engine import ORT_FAILURES, OnnxModel
from gptport.runtime.slots import StaticSlots
from gptport.training.model import GPT
from gptport.training.torch_engine import torch_step


def _reference(model: GPT, exact: StepFn, ids: np.ndarray
               ) -> tuple[np.ndarray, list[np.ndarray], np.ndarray, list[np.ndarray]]:
    """Torch float32 and float64 on one row's whole sequence (1, L): logits (L, V) and caches (H, L, hd)."""
    mask = np.ones_like(ids)
    pos = np.arange(ids.shape[1], dtype=np.int64)[None, :]
    cfg = model.cfg
    empty = [np.zeros((1, cfg.n_kv_head, 0, cfg.head_dim), dtype=np.float32) for _ in range(2 * cfg.n_layer)]
    with torch.no_grad():
        logits, past = torch_step(model)(ids, mask, pos, empty)
    exact_logits, exact_past = exact(ids, mask, pos, empty)
    return logits[0], [p[0] for p in past], exact_logits[0], [p[0] for p in exact_past]


def append_parity(model: GPT, static: OnnxModel, appender: ort.InferenceSession, tol: Tolerance,
                  seed: int = 0, which: Sequence[tuple[str, list[list[int]]]] | None = None,
                  exact: StepFn | None = None) -> list[ParityRow]:
    """Each case (by default cases(n_ctx)) run through StaticSlots.append_many (all logits), compared with
    torch (and its float64 rounding against `exact`, by default a new validate.exact_step); a run onnxruntime
    refuses is a ValidationError naming the case."""
    cfg, rng, exact = model.cfg, np.random.default_rng(seed), exact or exact_step(model)
    rows = []
    for name, steps in cases(cfg.n_ctx) if which is None else which:
        n = len(steps[0])
        slots = StaticSlots(static.session, cfg, n, appender=appender)
        seqs: list[list[int]] = [[] for _ in range(n)]
        got: list[list[np.ndarray]] = [[] for _ in range(n)]
        for sizes in steps:
            rows_in = [r for r in range(n) if sizes[r]]
            chunks = [rng.integers(0, cfg.vocab_size, sizes[r], dtype=np.int64) for r in rows_in]
            try:
                out = slots.append_many(rows_in, chunks, all_logits=True)
            except (RuntimeError, *ORT_FAILURES) as e:  # run_with_iobinding raises RuntimeError
                raise ValidationError(f"export: the multi-row append graph failed on case {name}: "
                                      f"{str(e).splitlines()[0]}") from e
            for r, logits, chunk in zip(rows_in, out, chunks, strict=True):
                got[r].append(logits)  # (T_r, V)
                seqs[r] += chunk.tolist()
        checks: list[Check] = []
        caches: list[list[Check]] = [[] for _ in range(2 * cfg.n_layer)]
        agree = total = 0
        for r in range(n):
            want, want_past, exact_logits, exact_past = _reference(model, exact, np.asarray([seqs[r]], dtype=np.int64))
            mine = np.concatenate(got[r])  # (L, V)
            checks.append(compare(LOGITS, mine, want, tol, exact_logits))
            agree, total = agree + int((mine.argmax(-1) == want.argmax(-1)).sum()), total + len(mine)
            length = len(seqs[r])
            for i, (q, buf) in enumerate(zip(cache_quantities(cfg.n_layer), slots.buffers, strict=True)):
                caches[i].append(compare(q, buf[r, :, :length], want_past[i], tol, exact_past[i]))
        rows.append(ParityRow(name, (merge(checks, tol), *(merge(c, tol) for c in caches)), agree / total))
    return rows

