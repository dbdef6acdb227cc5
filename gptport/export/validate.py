"""Checks of an exported graph against the torch model it came from: logits and KV-cache parity on
fixed (batch, sequence, past) cases and greedy decoding (the variants' accuracy gate: accuracy_gate.py).

The cases run sequences of at most PARITY_SPAN tokens, whatever n_ctx: a model of n_ctx 8192 run whole
needs gigabytes for one case's float64 attention and logits. The end of the position range (learned rows,
RoPE's largest angles) is reached otherwise: the contract graph takes position_ids and its past explicitly,
so its last case's sequence is placed at positions n_ctx - PARITY_SPAN .. n_ctx - 1; the static-cache graph
rotates keys by their cache position, so its last case decodes after a cache filled to n_ctx - 2 with keys
and values torch computed (_far_static). Where n_ctx <= PARITY_SPAN the cases run the whole window from
position 0, as ever."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gptport import specials
from gptport.config import ModelConfig
from gptport.errors import ValidationError
from gptport.export.accuracy_gate import GATE_TOP1 as GATE_TOP1  # re-exported: the gate's callers name validate
from gptport.export.accuracy_gate import SAMPLED as SAMPLED
from gptport.export.accuracy_gate import SAMPLED_WINDOW as SAMPLED_WINDOW
from gptport.export.accuracy_gate import GateRow as GateRow
from gptport.export.accuracy_gate import Heldout as Heldout
from gptport.export.accuracy_gate import gate as gate
from gptport.export.accuracy_gate import heldout as heldout
from gptport.export.accuracy_gate import sampled_windows as sampled_windows
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
GREEDY_TOKENS = 32
FALLBACK_PROMPTS = ["The", "To be or not", "\n"]
PARITY_SPAN = 256  # the longest sequence (and past) of a parity case


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


def span(n_ctx: int) -> tuple[int, int]:
    """(L, far): the longest sequence a parity case runs, min(n_ctx, PARITY_SPAN), and the first position of
    the case that ends at n_ctx - 1 (0 where the whole window fits in L)."""
    length = min(n_ctx, PARITY_SPAN)
    return length, n_ctx - length


def far_name(far: int, n_ctx: int) -> str:
    """' at positions 7936..8191' for a case placed at the end of a long window; '' at position 0."""
    return f" at positions {far}..{n_ctx - 1}" if far else ""


def cases(model: GPT, rng: np.random.Generator) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, Past]]:
    """(name, ids, mask, pos, past) for (1,1,0), (1,L,0), (3,7,5) left-padded and (2,1,L-1) ending at position
    n_ctx-1, L = min(n_ctx, PARITY_SPAN) (span)."""
    cfg = model.cfg
    ref = torch_step(model)
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


def float64_copy(model: GPT) -> GPT:
    """`model` computed in float64 for the cost of one module's float64 weights at a time (a whole copy is twice
    the model's bytes: 1.1 GB for 135M parameters): its structure on the meta device, each module given its
    weights from `model`'s, widened, just before it runs, and dropped after. Buffers (RoPE's inverse
    frequencies) are widened once."""
    with torch.device("meta"):
        m64 = GPT(model.cfg).double()
    for name, buf in model.named_buffers():
        owner, _, attr = name.rpartition(".")
        setattr(m64.get_submodule(owner), attr, buf.detach().double())
    sources = dict(model.named_modules())
    for name, module in m64.named_modules():
        if next(module.parameters(recurse=False), None) is not None:
            module.register_forward_pre_hook(functools.partial(_widen, sources[name]))
            module.register_forward_hook(_drop)
    return m64.eval()


def _widen(source: torch.nn.Module, module: torch.nn.Module, args: object) -> None:
    """`module`'s parameters from `source`'s, in float64 (a forward pre-hook of float64_copy)."""
    for name, p in source.named_parameters(recurse=False):
        setattr(module, name, torch.nn.Parameter(p.detach().double(), requires_grad=False))


def _drop(module: torch.nn.Module, args: object, out: object) -> None:
    """`module`'s float64 parameters back to shapes on the meta device (a forward hook of float64_copy)."""
    for name, p in list(module.named_parameters(recurse=False)):
        setattr(module, name, torch.nn.Parameter(p.detach().to("meta"), requires_grad=False))


def exact_step(model: GPT) -> StepFn:
    """The torch model computed in float64 (float64_copy), outputs in float64: what the reference's own
    float32 rounding is measured against (tolerance.py). Export makes it once per job and hands it to each
    check."""
    m64 = float64_copy(model)
    device = next(model.parameters()).device

    @torch.no_grad()
    def step(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, past: Past) -> tuple[np.ndarray, Past]:
        # a float32 past is read as it is: each layer widens it as it joins the new keys (torch.cat promotes)
        kv = [(torch.from_numpy(np.asarray(past[i])).to(device), torch.from_numpy(np.asarray(past[i + 1])).to(device))
              for i in range(0, len(past), 2)]
        logits, present = m64(torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device),
                              torch.from_numpy(pos).to(device), kv)
        return logits.cpu().numpy(), [t.cpu().numpy() for pair in present for t in pair]

    return step


def parity(model: GPT, step: StepFn, tol: Tolerance, seed: int = 0, exact: StepFn | None = None) -> list[ParityRow]:
    """Torch against `step`, case by case: the logits and each layer's present keys and values, each
    within `tol` (of its own magnitude and of torch's own float32 error, measured against `exact`, by default
    a new exact_step), and the logits' top-1 agreement."""
    ref, exact = torch_step(model), exact or exact_step(model)
    rows = []
    for name, ids, mask, pos, past in cases(model, np.random.default_rng(seed)):
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
        got, got_past = step(ids, mask, pos, engine.empty_past(B))
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
                  for q, g, w, e in zip(cache_quantities(cfg.n_layer), static_cache.cache_arrays(got_past), want_past,
                                        exact_past, strict=True)]
        rows.append(ParityRow(name, (merge(logits, tol), *caches), agree / total))
    if far:
        rows.append(_far_static(model, engine, tol, exact, rng))
    return rows


def _far_static(model: GPT, engine: OnnxModel, tol: Tolerance, exact: StepFn, rng: np.random.Generator
                ) -> ParityRow:
    """Decoding at the end of a long window on the static-cache graph, which rotates a key by its cache
    position (so a short sequence cannot be placed far): one row's cache filled to n_ctx - 2 with torch's keys
    and values of a PARITY_SPAN-token prefill, repeated (the graph and torch read the same cache; what fills it
    need not be one sequence), then two steps at positions n_ctx - 2 and n_ctx - 1, the last filling the cache.
    Their logits and the cache's last two positions against torch given the same cache."""
    cfg, ref, step = model.cfg, torch_step(model), engine.step()
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
    logits, agree = [], 0
    for t in (filled, filled + 1):  # the new token's position, and its place in the cache
        ids = rng.integers(0, cfg.vocab_size, size=(1, 1), dtype=np.int64)
        mask, pos = np.ones((1, t + 1), dtype=np.int64), np.array([[t]], dtype=np.int64)
        exact_logits, exact_present = exact(ids, mask, pos, past)
        exact_tail = [p[:, :, filled:].copy() for p in exact_present]  # (1, Hkv, t + 1 - filled, hd)
        del exact_present  # float64, the whole cache: twice torch's
        want, past = ref(ids, mask, pos, past)
        got, got_past = step(ids, mask, pos, got_past)
        logits.append(compare(LOGITS, got, want, tol, exact_logits))
        agree += int((got.argmax(-1) == want.argmax(-1)).sum())
    caches = [compare(q, value.numpy()[:, :, filled:n], w[:, :, filled:], tol, e)
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


def greedy_match(model: GPT, engine: Engine, prompt_ids: list[list[int]]) -> int:
    """Greedy-decode the prompts as one left-padded batch in torch and on `engine`; the tokens must
    be identical. Returns how many tokens were compared."""
    n_new = min(GREEDY_TOKENS, model.cfg.n_ctx - max(len(p) for p in prompt_ids))
    want = generate(TorchEngine(model), prompt_ids, n_new, Sampling(), eot_id=-1)
    got = generate(engine, prompt_ids, n_new, Sampling(), eot_id=-1)
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        if w.new_ids != g.new_ids:
            first = next(j for j, (a, b) in enumerate(zip(w.new_ids, g.new_ids, strict=True)) if a != b)
            raise ValidationError(f"export: greedy decoding differs from torch for prompt {i} at new token {first}")
    return n_new * len(prompt_ids)


def check_again(model: GPT, engine: OnnxModel, tol: Tolerance, label: str, exact: StepFn | None = None) -> None:
    """Parity and greedy decoding for a rewritten graph (the optimized one)."""
    refuse(f"{label} parity", parity(model, engine.step(), tol, exact=exact))
    greedy_match(model, engine, [[1, 2, 3], [4], [5, 6]])


def refuse(what: str, rows: list[ParityRow]) -> None:
    """Raise ValidationError naming the first failing case, its quantity, difference, magnitude and bound."""
    bad = [r for r in rows if not r.ok]
    if bad:
        raise ValidationError(bad[0].failure(what))

