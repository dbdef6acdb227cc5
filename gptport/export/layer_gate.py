"""The variants' accuracy gate for a model checked layer by layer (job.model None, past graph_write.external's
line): the same metrics as validate.gate (top-1 agreement with agreement.TIE_NATS ties, mean KL), without ever
holding the torch model or the variant whole.

- Reference: torch's float32 logits on the gate's windows, computed once per export by layer_reference.run_layers,
  every window through one layer at a time (memory: one layer's weights and the windows' activations), the head
  HEAD_ROWS positions at a time. The logits (N, T, V: 2.5 GB for 8 windows of 512 at a vocabulary of 152k) go to a
  temporary file in the model directory (atomic.temp_name, removed by close()), read back KL_ROWS positions at a
  time for every variant and rung.
- gate: the variant's graph cut into pieces (layer_check.pieces, at most chunked.CHUNK_BYTES of weights a piece),
  each piece opened once for all windows (chunked.Chunked.each); each window's logits scored against the reference
  as they come (agreement.score). No torch here (layer_reference imports it where it runs)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from gptport import atomic
from gptport.config import ModelConfig
from gptport.errors import UsageError
from gptport.export import layer_check, layer_reference
from gptport.export.agreement import KL_ROWS, score
from gptport.export.validate import GATE_TOP1, GateRow

REFERENCE_NAME = "model.gate-reference"  # its temporary file: .model.gate-reference.tmp-<pid>-<hex>
HEAD_ROWS = 128  # positions whose reference logits are made at once: (128, V) float32, 78 MB at V 152k


class Reference:
    """torch's float32 logits on the gate's windows (N, T), row-major (N, T, V) float32 in the file at `path`."""

    def __init__(self, path: Path, windows: np.ndarray, vocab: int) -> None:
        self.path, self.windows, self.vocab = path, windows, vocab

    def rows(self, n: int, lo: int, hi: int) -> np.ndarray:
        """Window n's reference logits at positions lo..hi-1 (hi at most T): (hi - lo, V) float32."""
        T, V = self.windows.shape[1], self.vocab
        hi = min(hi, T)
        return np.fromfile(self.path, np.float32, count=(hi - lo) * V, offset=(n * T + lo) * V * 4).reshape(-1, V)

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


def reference(model_dir: Path, cfg: ModelConfig, weights: Mapping[str, np.ndarray], windows: np.ndarray
              ) -> Reference:
    """torch's logits on `windows` (N, T) computed layer by layer, into a temporary file of `model_dir` (refused in
    one line, before it is written, where the disk has not room for it)."""
    N, T = windows.shape
    need = N * T * cfg.vocab_size * 4
    free = shutil.disk_usage(model_dir).free
    if need > free:
        raise UsageError(f"{model_dir}: the accuracy gate keeps torch's logits on its {N} windows of {T} tokens "
                         f"({need / 2**30:.1f} GiB), and its disk has {free / 2**30:.1f} GiB free")
    normed = np.zeros(0, np.float32)
    for out in layer_reference.run_layers(cfg, weights, windows, logits=False):  # one layer at a time
        if isinstance(out, np.ndarray):
            normed = out  # (N, T, D): the final norm's output
    head = layer_reference.head(cfg, weights.__getitem__)
    made = Reference(atomic.temp_name(model_dir / REFERENCE_NAME), windows, cfg.vocab_size)
    try:
        with open(made.path, "wb") as f:
            for n in range(N):
                for lo in range(0, T, HEAD_ROWS):
                    head(normed[n, lo:lo + HEAD_ROWS]).astype(np.float32, copy=False).tofile(f)  # (rows, V)
    except BaseException:
        made.close()
        raise
    return made


def gate(ref: Reference, graph: Path, taps: Sequence[str], cfg: ModelConfig, weights: Mapping[str, np.ndarray],
         static: bool, precision: str) -> GateRow:
    """validate.gate's row for the variant at `graph` (a contract graph, or a static-cache one when `static`; `taps`
    its residual stream after each layer), run in pieces over each of ref's windows from an empty cache."""
    N, T = ref.windows.shape
    width = T if static else 0  # the static-cache graph's buffers: a cache of the window's length
    past = [np.zeros((1, cfg.n_kv_head, width, cfg.head_dim), np.float32)] * (2 * cfg.n_layer)
    calls = [(layer_check.static_calls if static else layer_check.contract_calls)(row[None, :], [])[0]
             for row in ref.windows]  # (1, T) each
    agree, kl = 0, 0.0
    cut = layer_check.pieces(graph, taps, cfg, weights)
    try:
        for n, logits in cut.each(calls, past):
            got = logits[0].astype(np.float32, copy=False)  # (T, V)
            for lo in range(0, T, KL_ROWS):
                hits, div = score(ref.rows(n, lo, lo + KL_ROWS), got[lo:lo + KL_ROWS])
                agree, kl = agree + hits, kl + div
            del logits, got
    finally:
        cut.close()
    total = N * T
    return GateRow(precision, agree / total, kl / total, total, agree / total >= GATE_TOP1)

