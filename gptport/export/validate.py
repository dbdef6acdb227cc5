"""Checks of an exported graph against the torch model it came from: logits and KV-cache parity on
fixed (batch, sequence, past) cases, greedy decoding, and the accuracy gate of the variants.

The cases run sequences of at most PARITY_SPAN tokens, whatever n_ctx: a model of n_ctx 8192 run whole
needs gigabytes for one case's float64 attention and logits. The end of the position range (learned rows,
RoPE's largest angles) is reached otherwise: the contract graph takes position_ids and its past explicitly,
so its last case's sequence is placed at positions n_ctx - PARITY_SPAN .. n_ctx - 1; the static-cache graph
rotates keys by their cache position, so its last case decodes after a cache filled to n_ctx - 2 with keys
and values torch computed (_far_static). Where n_ctx <= PARITY_SPAN the cases run the whole window from
position 0, as ever."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from gptport import specials
from gptport.config import ModelConfig
from gptport.errors import InputError, UsageError, ValidationError
from gptport.export.agreement import score
from gptport.export.float64_reference import exact_step as exact_step  # re-exported: checks name validate
from gptport.export.float64_reference import float64_copy as float64_copy
from gptport.export.tolerance import Check, Tolerance, cache_quantities, compare, merge, worst
from gptport.paths import VAL_SHARD
from gptport.runtime import static_cache
from gptport.runtime.engine import Engine, Past, StepFn, empty_past, positions
from gptport.runtime.generate import generate
from gptport.runtime.onnx_engine import OnnxModel
from gptport.runtime.sampling import Sampling
from gptport.tokenizer import BPETokenizer
from gptport.training.model import GPT
from gptport.training.shards import DATA_DIR, read_shard, token_dtype
from gptport.training.torch_engine import TorchEngine, torch_step

LOGITS = "logits"  # the quantity name of the logits' check (tolerance.cache_quantities names the caches)
GATE_TOP1 = 0.98
GREEDY_TOKENS = 32
FALLBACK_PROMPTS = ["The", "To be or not", "\n"]
SAMPLED_WINDOW = 128  # tokens per window of the model's own samples (--gate-on-sampled-text)
SAMPLED = "the model's own samples"  # Heldout.source when the gate scored them
MIN_HELDOUT_TOKENS = 64  # fewer held-out tokens than this make no gate (one miss in 50 is 98%)
PARITY_SPAN = 256  # the longest sequence (and past) of a parity case
GATE_WINDOW = 512  # the longest held-out window the gate scores at once


@dataclass(frozen=True)
class ParityRow:
    """One parity case: each quantity compared (tolerance.Check: the logits, then each layer's keys and
    values) and the top-1 agreement of the logits."""

    case: str
    checks: tuple[Check, ...]
    top1: float

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def max_logits(self) -> float:
        return max((c.diff for c in self.checks if c.quantity == LOGITS), default=0.0)

    @property
    def max_present(self) -> float:
        return max((c.diff for c in self.checks if c.quantity != LOGITS), default=0.0)

    @property
    def worst(self) -> Check:
        """The failing check furthest past its bound, else the one nearest it."""
        return worst(self.checks)

    def failure(self, what: str) -> str:
        """'export: fp32 parity failed on case (1, 256, 0): layer 3 values: max |Δ| ... (magnitude ...)'."""
        return f"export: {what} failed on case {self.case}: {self.worst.describe()}"


@dataclass(frozen=True)
class GateRow:
    precision: str
    top1: float
    mean_kl: float
    positions: int
    ok: bool
    scheme: str = ""  # the quantization scheme gated (variants.SCHEMES), "" for fp16


def span(n_ctx: int) -> tuple[int, int]:
    """(L, far): the longest sequence a parity case runs, min(n_ctx, PARITY_SPAN), and the first position of
    the case that ends at n_ctx - 1 (0 where the whole window fits in L)."""
    length = min(n_ctx, PARITY_SPAN)
    return length, n_ctx - length


def far_name(far: int, n_ctx: int) -> str:
    """' at positions 7936..8191' for a case placed at the end of a long window; '' at position 0."""
    return f" at positions {far}..{n_ctx - 1}" if far else ""


def cases(model: GPT, rng: np.random.Generator, ref: StepFn | None = None
          ) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, Past]]:
    """(name, ids, mask, pos, past) for (1,1,0), (1,L,0), (3,7,5) left-padded and (2,1,L-1) ending at position
    n_ctx-1, L = min(n_ctx, PARITY_SPAN) (span); the pasts from `ref` (by default torch_step(model))."""
    cfg = model.cfg
    ref = ref or torch_step(model)
    V, n = cfg.vocab_size, cfg.n_ctx
    length, far = span(n)

    def ids(b: int, t: int) -> np.ndarray:
        return rng.integers(0, V, size=(b, t), dtype=np.int64)

    def empty(b: int) -> Past:
        return empty_past(b, cfg.n_layer, cfg.n_kv_head, cfg.head_dim)

    out = []
    for b, t in ((1, 1), (1, length)):
        mask = np.ones((b, t), dtype=np.int64)
        out.append((f"({b}, {t}, 0)", ids(b, t), mask, positions(mask), empty(b)))
    if n >= 12:  # (3, 7, 5): a 5-token past in which row 1 is left-padded by 2
        mask = np.ones((3, 5), dtype=np.int64)
        mask[1, :2] = 0
        _, past = ref(ids(3, 5), mask, positions(mask), empty(3))
        full = np.concatenate([mask, np.ones((3, 7), dtype=np.int64)], axis=1)
        out.append(("(3, 7, 5) padded", ids(3, 7), full, positions(full)[:, 5:], past))
    mask = np.ones((2, length - 1), dtype=np.int64)
    _, past = ref(ids(2, length - 1), mask, positions(mask) + far, empty(2))
    full = np.ones((2, length), dtype=np.int64)
    out.append((f"(2, 1, {length - 1}){far_name(far, n)}", ids(2, 1), full, positions(full)[:, -1:] + far, past))
    return out


def parity(model: GPT, step: StepFn, tol: Tolerance, seed: int = 0, exact: StepFn | None = None,
           ref: StepFn | None = None) -> list[ParityRow]:
    """Torch against `step`, case by case: the logits and each layer's present keys and values, each
    within `tol` (of its own magnitude and of torch's own float32 error, measured against `exact`, by default
    a new exact_step), and the logits' top-1 agreement. `ref`: torch's step (by default torch_step(model); a
    Memo where two graphs are checked on the same cases)."""
    ref, exact = ref or torch_step(model), exact or exact_step(model)
    rows = []
    for name, ids, mask, pos, past in cases(model, np.random.default_rng(seed), ref):
        want_logits, want_present = ref(ids, mask, pos, past)
        exact_logits, exact_present = exact(ids, mask, pos, past)
        got_logits, got_present = step(ids, mask, pos, [p.astype(np.float32) for p in past])
        # on CUDA and TensorRT the present caches stay on the GPU (OrtValues): copy them down to compare
        host = [g.numpy() if hasattr(g, "numpy") else g for g in got_present]
        checks = [compare(LOGITS, got_logits, want_logits, tol, exact_logits)]
        checks += [compare(q, g, w, tol, e) for q, g, w, e in zip(cache_quantities(model.cfg.n_layer), host,
                                                                  want_present, exact_present, strict=True)]
        real = mask[:, -ids.shape[1]:].astype(bool)  # (B, T): positions that are not padding
        top1 = float((got_logits.argmax(-1) == want_logits.argmax(-1))[real].mean())
        rows.append(ParityRow(name, tuple(checks), top1))
    return rows


def static_parity(model: GPT, engine: OnnxModel, tol: Tolerance, seed: int = 0, exact: StepFn | None = None
                  ) -> list[ParityRow]:
    """The static-cache graph against torch: a prefill of L = min(n_ctx, PARITY_SPAN) tokens; a left-padded
    batch (lengths 7, 5 and 2) prefilled then stepped 3 times; the end of the cache: where n_ctx <= PARITY_SPAN
    a prefill of n_ctx - 1 then one step that fills the cache, else _far_static's two steps after a cache filled
    to n_ctx - 2. Logits at every real position of every call, and at the end each row's cached keys and values,
    each quantity within `tol` of its own magnitude (`exact` as in parity)."""
    ref, exact, step, cfg = torch_step(model), exact or exact_step(model), engine.step(), model.cfg
    rng = np.random.default_rng(seed)
    n = cfg.n_ctx
    length, far = span(n)
    cases = [(f"(1, {length}) + 0 steps", np.ones((1, length), dtype=np.int64), 0)]
    if n >= 12:
        padded = np.ones((3, 7), dtype=np.int64)
        padded[1, :2] = padded[2, :5] = 0
        cases.append(("(3, 7) padded + 3 steps", padded, 3))
    if not far:
        cases.append((f"(2, {n - 1}) + 1 step", np.ones((2, n - 1), dtype=np.int64), 1))
    rows = []
    for name, mask, steps in cases:
        B = mask.shape[0]
        ids, pos = rng.integers(0, cfg.vocab_size, size=mask.shape, dtype=np.int64), positions(mask)
        empty = empty_past(B, cfg.n_layer, cfg.n_kv_head, cfg.head_dim)
        want, want_past = ref(ids, mask, pos, empty)
        exact_logits, exact_past = exact(ids, mask, pos, empty)
        # buffers of the case's own (a prefill writes all n_ctx positions of each row): freed with the case
        got, got_past = step(ids, mask, pos, static_cache.Buffers(cfg, engine.kv_dtype).fresh(B))
        real = mask.astype(bool)  # (B, T)
        logits = [compare(LOGITS, got[real], want[real], tol, exact_logits[real])]
        agree, total = int((got.argmax(-1) == want.argmax(-1))[real].sum()), int(real.sum())
        for _ in range(steps):
            ids = rng.integers(0, cfg.vocab_size, size=(B, 1), dtype=np.int64)
            mask, pos = np.concatenate([mask, np.ones((B, 1), dtype=np.int64)], axis=1), pos[:, -1:] + 1
            want, want_past = ref(ids, mask, pos, want_past)
            exact_logits, exact_past = exact(ids, mask, pos, exact_past)
            got, got_past = step(ids, mask, pos, got_past)
            logits.append(compare(LOGITS, got, want, tol, exact_logits))
            agree, total = agree + int((got.argmax(-1) == want.argmax(-1)).sum()), total + B
        lengths, P = got_past.lengths, mask.shape[1]  # each row's cache: its first `length` positions
        caches = [merge([compare(q, g[b, :, :lengths[b]], w[b, :, P - lengths[b]:], tol, e[b, :, P - lengths[b]:])
                         for b in range(B)], tol)
                  for q, g, w, e in zip(cache_quantities(cfg.n_layer), map(_host, got_past), want_past, exact_past,
                                        strict=True)]
        del got_past  # the case's buffers
        rows.append(ParityRow(name, (merge(logits, tol), *caches), agree / total))
    if far:
        rows.append(_far_static(model, engine, tol, rng))
    return rows


def _far_static(model: GPT, engine: OnnxModel, tol: Tolerance, rng: np.random.Generator) -> ParityRow:
    """Decoding at the end of a long window on the static-cache graph, which rotates a key by its cache
    position (so a short sequence cannot be placed far): one row's cache filled to n_ctx - 2 with torch's keys
    and values of a PARITY_SPAN-token prefill, repeated (the graph and torch read the same cache; what fills it
    need not be one sequence), then two steps at positions n_ctx - 2 and n_ctx - 1, the last filling the cache.
    Their logits and the cache's last two positions against torch given the same cache (the float64 reference
    keeping only the new positions of each layer's cache: exact_step's tail)."""
    cfg, ref, step, exact = model.cfg, torch_step(model), engine.step(), exact_step(model, tail=1)
    n, (length, _) = cfg.n_ctx, span(cfg.n_ctx)
    filled = n - 2
    mask = np.ones((1, length), dtype=np.int64)
    ids = rng.integers(0, cfg.vocab_size, size=(1, length), dtype=np.int64)
    _, short = ref(ids, mask, positions(mask), empty_past(1, cfg.n_layer, cfg.n_kv_head, cfg.head_dim))
    reps = -(-filled // length)
    past = [np.ascontiguousarray(np.tile(c, (1, 1, reps, 1))[:, :, :filled]) for c in short]  # (1, Hkv, P, hd)
    del short
    got_past = static_cache.Buffers(cfg, engine.kv_dtype).fresh(1)
    for value, cache in zip(got_past, past, strict=True):  # the graph's buffers hold the same keys and values
        whole = np.zeros(value.shape(), dtype=engine.kv_dtype)  # (1, Hkv, n_ctx, hd)
        whole[:, :, :filled] = cache
        value.update_inplace(whole)
    got_past.lengths = np.array([filled], dtype=np.int64)
    logits, agree, tails = [], 0, []
    for t in (filled, filled + 1):  # the new token's position, and its place in the cache
        ids = rng.integers(0, cfg.vocab_size, size=(1, 1), dtype=np.int64)
        mask, pos = np.ones((1, t + 1), dtype=np.int64), np.array([[t]], dtype=np.int64)
        exact_logits, tail = exact(ids, mask, pos, past)  # each layer's new position only: (1, Hkv, 1, hd)
        tails.append(tail)
        want, past = ref(ids, mask, pos, past)
        got, got_past = step(ids, mask, pos, got_past)
        logits.append(compare(LOGITS, got, want, tol, exact_logits))
        agree += int((got.argmax(-1) == want.argmax(-1)).sum())
    exact_tail = [np.concatenate(pair, axis=2) for pair in zip(*tails, strict=True)]  # (1, Hkv, 2, hd)
    caches = [compare(q, _host(value)[:, :, filled:n], w[:, :, filled:], tol, e)
              for q, value, w, e in zip(cache_quantities(cfg.n_layer), got_past, past, exact_tail, strict=True)]
    return ParityRow(f"(1, {filled}) cached + 2 steps to position {n - 1}", (merge(logits, tol), *caches), agree / 2)


def prompts(model_dir: Path, tok: BPETokenizer, n_ctx: int, count: int = 3,
            config: ModelConfig | None = None) -> list[list[int]]:
    """Prompts for the greedy check: snippets of the validation shard, else fixed strings; each after the
    begin token of the model of `config` where its tokenizer adds one (specials.start_ids)."""
    val = model_dir / DATA_DIR / VAL_SHARD
    start = [] if config is None else specials.start_ids(config)
    width = max(1, min(16, n_ctx - GREEDY_TOKENS) - len(start))
    if val.is_file():
        arr = read_shard(val, token_dtype(tok.vocab_size), tok.vocab_size)
        if len(arr) > 3 * width:
            starts = np.linspace(0, len(arr) - width - 1, count).astype(int)
            return [[*start, *(int(t) for t in arr[s:s + width - i * (width // 4)])] for i, s in enumerate(starts)]
    return [[*start, *tok.encode(p)[:width]] or [tok.eot_id] for p in FALLBACK_PROMPTS[:count]]


def torch_greedy(model: GPT, prompt_ids: list[list[int]]) -> list[list[int]]:
    """Torch's greedy tokens after each prompt (one left-padded batch): what greedy_match compares with."""
    n_new = min(GREEDY_TOKENS, model.cfg.n_ctx - max(len(p) for p in prompt_ids))
    return [r.new_ids for r in generate(TorchEngine(model), prompt_ids, n_new, Sampling(), eot_id=-1)]


def greedy_match(model: GPT, engine: Engine, prompt_ids: list[list[int]], want: list[list[int]] | None = None
                 ) -> int:
    """Greedy-decode the prompts as one left-padded batch in torch (or take `want`, torch_greedy's tokens of
    the same prompts) and on `engine`; the tokens must be identical. Returns how many tokens were compared."""
    want = want or torch_greedy(model, prompt_ids)
    n_new = len(want[0])
    got = generate(engine, prompt_ids, n_new, Sampling(), eot_id=-1)
    for i, (w, g) in enumerate(zip(want, (r.new_ids for r in got), strict=True)):
        if w != g:
            first = next(j for j, (a, b) in enumerate(zip(w, g, strict=True)) if a != b)
            raise ValidationError(f"export: greedy decoding differs from torch for prompt {i} at new token {first}")
    return n_new * len(prompt_ids)


def check_again(model: GPT, engine: OnnxModel, tol: Tolerance, label: str, exact: StepFn | None = None,
                ref: StepFn | None = None) -> None:
    """Parity and greedy decoding for a rewritten graph (the optimized one); `exact` and `ref` as parity's."""
    refuse(f"{label} parity", parity(model, engine.step(), tol, exact=exact, ref=ref))
    greedy_match(model, engine, [[1, 2, 3], [4], [5, 6]])


def refuse(what: str, rows: list[ParityRow]) -> None:
    """Raise ValidationError naming the first failing case, its quantity, difference, magnitude and bound."""
    bad = [r for r in rows if not r.ok]
    if bad:
        raise ValidationError(bad[0].failure(what))


@dataclass(frozen=True)
class Heldout:
    """The text the variants' accuracy gate scores: (N, T) token windows, and where they came from."""

    windows: np.ndarray  # (N, T) int64
    source: str  # "data/val.bin", the --heldout file, or SAMPLED
    sampled: bool = False


def heldout(model_dir: Path, model: GPT | None, tok: BPETokenizer, path: Path | None = None, sampled: bool = False,
            count: int = 8, cfg: ModelConfig | None = None) -> Heldout:
    """The gate's held-out text: the file `path` (tokenized) when given, else the validation shard
    data/val.bin, else, only when `sampled` is allowed, text the model samples itself. Without any of
    them it refuses (a model from import-hf has no validation shard): no silent substitute. `model` None (a
    model checked layer by layer, whose config is `cfg`) cannot sample."""
    if cfg is None:
        assert model is not None
        cfg = model.cfg
    n = cfg.n_ctx
    if path is not None:
        ids = np.asarray(tok.encode(_read_text(path)), dtype=np.int64)
        if len(ids) < MIN_HELDOUT_TOKENS:
            raise InputError(f"{path}: {len(ids)} tokens of held-out text; the accuracy gate needs at least "
                             f"{MIN_HELDOUT_TOKENS}")
        return Heldout(_windows(ids, n, count), str(path))
    val = model_dir / DATA_DIR / VAL_SHARD
    if val.is_file():
        arr = read_shard(val, token_dtype(cfg.vocab_size), cfg.vocab_size)
        if len(arr) >= MIN_HELDOUT_TOKENS:
            return Heldout(_windows(arr, n, count), f"{DATA_DIR}/{VAL_SHARD}")
        why = f"{val} holds {len(arr)} tokens, fewer than the {MIN_HELDOUT_TOKENS} the gate needs"
    else:
        why = f"{val} is missing (a model from import-hf has none)"
    if not sampled or model is None:
        own = "--gate-on-sampled-text (score the model's own samples), " if model is not None else ""
        raise UsageError(f"no held-out text for the variants' accuracy gate: {why}; pass --heldout FILE (text the "
                         f"model was not trained on), {own}or --no-gate (write the variants unchecked)")
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
        hits, div = score(want, got)
        agree, kl, total = agree + hits, kl + div, total + len(row)
    top1 = agree / total
    return GateRow(precision, top1, kl / total, total, top1 >= GATE_TOP1)


def _host(value: ort.OrtValue) -> np.ndarray:
    """One layer's static-cache buffer as numpy (a copy): a layer at a time, not the whole cache at once."""
    return value.numpy()
