"""The variants' accuracy gate: the held-out text it scores (a file, the validation shard, or the model's own
samples) and top-1 agreement and KL of a variant against the torch model on it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gptport.errors import InputError, UsageError
from gptport.export.agreement import agrees
from gptport.paths import VAL_SHARD
from gptport.runtime.engine import positions
from gptport.runtime.onnx_engine import OnnxModel
from gptport.tokenizer import BPETokenizer
from gptport.training.model import GPT
from gptport.training.shards import DATA_DIR, read_shard, token_dtype

GATE_TOP1 = 0.98
SAMPLED_WINDOW = 128  # tokens per window of the model's own samples (--gate-on-sampled-text)
SAMPLED = "the model's own samples"  # Heldout.source when the gate scored them
MIN_HELDOUT_TOKENS = 64  # fewer held-out tokens than this make no gate (one miss in 50 is 98%)
GATE_WINDOW = 512  # the longest held-out window the gate scores at once
KL_ROWS = 64  # positions whose KL the gate computes at once


@dataclass(frozen=True)
class GateRow:
    precision: str
    top1: float
    mean_kl: float
    positions: int
    ok: bool
    scheme: str = ""  # the quantization scheme gated (variants.SCHEMES), "" for fp16


@dataclass(frozen=True)
class Heldout:
    """The text the variants' accuracy gate scores: (N, T) token windows, and where they came from."""

    windows: np.ndarray  # (N, T) int64
    source: str  # "data/val.bin", the --heldout file, or SAMPLED
    sampled: bool = False


def heldout(model_dir: Path, model: GPT, tok: BPETokenizer, path: Path | None = None, sampled: bool = False,
            count: int = 8) -> Heldout:
    """The gate's held-out text: the file `path` (tokenized) when given, else the validation shard
    data/val.bin, else, only when `sampled` is allowed, text the model samples itself. Without any of
    them it refuses (a model from import-hf has no validation shard): no silent substitute."""
    n = model.cfg.n_ctx
    if path is not None:
        ids = np.asarray(tok.encode(_read_text(path)), dtype=np.int64)
        if len(ids) < MIN_HELDOUT_TOKENS:
            raise InputError(f"{path}: {len(ids)} tokens of held-out text; the accuracy gate needs at least "
                             f"{MIN_HELDOUT_TOKENS}")
        return Heldout(_windows(ids, n, count), str(path))
    val = model_dir / DATA_DIR / VAL_SHARD
    if val.is_file():
        arr = read_shard(val, token_dtype(model.cfg.vocab_size), model.cfg.vocab_size)
        if len(arr) >= MIN_HELDOUT_TOKENS:
            return Heldout(_windows(arr, n, count), f"{DATA_DIR}/{VAL_SHARD}")
        why = f"{val} holds {len(arr)} tokens, fewer than the {MIN_HELDOUT_TOKENS} the gate needs"
    else:
        why = f"{val} is missing (a model from import-hf has none)"
    if not sampled:
        raise UsageError(f"no held-out text for the variants' accuracy gate: {why}; pass --heldout FILE (text the "
                         "model was not trained on), --gate-on-sampled-text (score the model's own samples), "
                         "or --no-gate (write the variants unchecked)")
    return Heldout(sampled_windows(model, count), SAMPLED, sampled=True)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"--heldout {path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"--heldout {path}: a directory, not a text file") from None
    except UnicodeDecodeError as e:
        raise InputError(f"--heldout {path}: not valid UTF-8 at byte offset {e.start}") from None


def _windows(ids: np.ndarray, n_ctx: int, count: int) -> np.ndarray:
    """Up to `count` evenly spaced windows of min(n_ctx, GATE_WINDOW, len(ids)) tokens: (N, T) int64."""
    width = min(n_ctx, GATE_WINDOW, len(ids))
    starts = np.unique(np.linspace(0, len(ids) - width, count).astype(int))
    return np.stack([np.asarray(ids[s:s + width], dtype=np.int64) for s in starts])


def sampled_windows(model: GPT, count: int = 8) -> np.ndarray:
    """(N, T) windows of text the model samples itself from random first tokens (T = min(n_ctx, 128)),
    seeded: what the gate scores under --gate-on-sampled-text."""
    n = model.cfg.n_ctx
    rng = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size, (count, 1), generator=rng)
    length = min(n, SAMPLED_WINDOW)
    with torch.no_grad():  # sample text from the model itself, through the KV cache
        logits, past = model(ids)
        while ids.shape[1] < length:
            nxt = torch.multinomial(torch.softmax(logits[:, -1].float(), -1), 1, generator=rng)  # (N, 1)
            ids = torch.cat([ids, nxt], dim=1)
            logits, past = model(nxt, attention_mask=torch.ones_like(ids), past=past)
    return ids.numpy()


def gate(model: GPT, variant: OnnxModel, windows: np.ndarray, precision: str) -> GateRow:
    """Top-1 agreement (a pick within agreement.TIE_NATS of torch's best agrees) and mean KL(torch fp32 ||
    variant) over every position of the windows."""
    step = variant.step()
    agree, kl, total = 0, 0.0, 0
    for row in windows:
        ids = row[None, :]  # (1, T)
        mask = np.ones_like(ids)
        with torch.no_grad():
            want = model(torch.from_numpy(ids))[0].float().numpy()[0]  # (T, V)
        past = variant.empty_past(1)
        got = step(ids, mask, positions(mask), past)[0].astype(np.float32)[0]  # (T, V)
        agree += int(agrees(want, got.argmax(-1)).sum())
        for lo in range(0, len(row), KL_ROWS):  # a few rows at a time: each temporary is (rows, V)
            log_p, log_q = _log_softmax(want[lo:lo + KL_ROWS]), _log_softmax(got[lo:lo + KL_ROWS])
            kl += float((np.exp(log_p) * (log_p - log_q)).sum())
        total += len(row)
    top1 = agree / total
    return GateRow(precision, top1, kl / total, total, top1 >= GATE_TOP1)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))
