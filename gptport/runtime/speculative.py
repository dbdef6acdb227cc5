"""Speculative decoding of one sequence over the static-cache graph. No torch here.

A drafter proposes K tokens; the target runs its pending token and the K drafts in one step (reading
its weights once for K + 1 positions) and keeps the longest prefix it agrees with, plus one token of
its own: the token that replaced the first rejected draft, or, when every draft stood, the token after
them. The rejected positions are rolled back by setting the slot's length back (slots.py): the next
step writes over them.

Greedy: a draft stands when it is the target's argmax, so the output is the plain decoder's token for
token. Sampled: a draft x drawn from the drafter's q stands with probability min(1, p(x)/q(x)) under the
target's p; a rejected one is replaced by a draw from max(p - q, 0), renormalized (Leviathan et al.
2023, Chen et al. 2023), so every token follows the target's distribution exactly. A drafter that
copies tokens (prompt lookup) has q a point mass on its draft.

Penalties: the verifying step judges the token at each position by the target's distribution as of that
position, the drafts before it counted as seen and generated (the repetition, frequency and presence
penalties), so the rule above holds with them too; a draft model drafts with them the same way.

Drafters: `ModelDrafter`, a small model with the target's tokenizer and a static cache of its own;
`LookupDrafter`, the continuation of the latest earlier occurrence of the sequence's last n-gram.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gptport.runtime.accept import Accepting, FinishReason
from gptport.runtime.engine import Capability, require
from gptport.runtime.generate import Overflow, RowResult
from gptport.runtime.sampling import Sampling, draw, penalized, probs
from gptport.runtime.slots import StaticSlots
from gptport.specials import as_ends

K_START, K_MAX = 4, 16  # the adaptive draft length: where it starts and its bound
# a draft model's session runs on this many threads unless told (--draft-threads): a tiny draft's
# operators are too small to split, and workers woken for each of its steps cost more than they do
# (a 2-layer draft's step: 0.136 ms on one thread, 0.32 ms on two, AMD EPYC, 2 cores)
DRAFT_THREADS = 1
LOOKUP_MIN = 2  # prompt lookup matches n-grams of LOOKUP_MIN..N tokens (one token matches too often to pay)
LOOKUP_SCAN = 16  # earlier occurrences of the last token compared one by one; more: with numpy

Drafts = tuple[list[int], list[np.ndarray | None]]  # the drafted tokens, and each one's draft distribution


@dataclass
class SpecStats:
    """What drafting did for one sequence."""

    steps: int = 0  # target steps (each verifies its drafts, or none)
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0  # tokens the target's steps produced

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    def add(self, other: SpecStats) -> None:
        self.steps += other.steps
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.tokens += other.tokens


class Drafter(Protocol):
    """Proposes tokens to follow a sequence."""

    def propose(self, seq: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator,
                counts: Counter[int] | None = None) -> Drafts:
        """Up to k tokens to follow seq (whose generated tokens' counts are `counts`, where the frequency or
        presence penalty is on), and each one's distribution (None: the draft is a point mass)."""
        ...


def static_model(engine: Any, what: str) -> Any:
    """The engine, which must declare Capability.DRAFT (the static-cache graph), or a UsageError naming
    `what`."""
    require(engine, Capability.DRAFT, what, "onnx engine, CPU provider, --kv-cache auto or static; `gptport export` "
            "writes it")
    return engine


def check_draft_threads(threads: int | None, draft: Path | None) -> None:
    """--draft-threads needs --draft and a count of 0 (the runtime's default) or more."""
    from gptport.errors import UsageError

    if threads is not None and draft is None:
        raise UsageError("--draft-threads needs --draft")
    if threads is not None and threads < 0:
        raise UsageError(f"--draft-threads must be 0 (onnxruntime's default) or more, not {threads}")


def draft_threads(threads: int | None) -> int:
    """The draft session's thread count: as given, or DRAFT_THREADS."""
    return DRAFT_THREADS if threads is None else threads


def check_tokenizers(target_dir: Path, target_sha256: str, draft_dir: Path, draft_sha256: str) -> None:
    """A draft must tokenize as its target does: refused otherwise, naming both tokenizers."""
    from gptport.errors import UsageError

    if target_sha256 != draft_sha256:
        raise UsageError(f"--draft {draft_dir}: its tokenizer (sha256 {draft_sha256}) is not {target_dir}'s "
                         f"(sha256 {target_sha256}); train the draft with `gptport train ... --tokenizer-from "
                         f"{target_dir}`")


class ModelDrafter:
    """Drafts from a small model (its static cache holds a window of the sequence: its own context may
    be shorter than the target's)."""

    def __init__(self, model: Any) -> None:
        model = static_model(model, "--draft")
        self.slots = StaticSlots(model.session, model.config, 1, model.kv_dtype)
        self.n_ctx = model.n_ctx
        self.start = 0  # where in the sequence the cached window starts
        self.ctx: list[int] = []  # the tokens the cache holds

    def propose(self, seq: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator,
                counts: Counter[int] | None = None) -> Drafts:
        k = min(k, self.n_ctx // 2)
        if len(seq) - self.start + k - 1 > self.n_ctx:  # the window is full: restart from the last half
            self.start, self.ctx = max(0, len(seq) - self.n_ctx // 2), []
            self.slots.free(0)
        window = list(seq[self.start:])
        lim = min(len(self.ctx), len(window) - 1)  # at least one token is fed, for its logits
        differ = np.flatnonzero(np.asarray(self.ctx[:lim]) != np.asarray(window[:lim]))
        common = int(differ[0]) if differ.size else lim
        self.slots.truncate(0, common)
        logits = self.slots.append(0, np.asarray(window[common:], dtype=np.int64))[-1]  # (V,)
        self.ctx = window
        seen = list(seq)
        counts = Counter(counts) if sampling.penalized else None  # a copy the drafts go into
        drafts: list[int] = []
        dists: list[np.ndarray | None] = []
        for i in range(k):
            if sampling.greedy:
                tok, q = int(penalized(logits, sampling, seen, counts).argmax()), None
            else:
                q = probs(logits, sampling, seen, counts)
                tok = draw(q, rng)
            drafts.append(tok)
            dists.append(q)
            seen.append(tok)
            if counts is not None:
                counts[tok] += 1
            if i + 1 < k:
                logits = self.slots.decode([0], np.array([tok], dtype=np.int64))[0]  # (V,)
                self.ctx.append(tok)
        return drafts, dists


class LookupDrafter:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's last n
    tokens (n from N down to LOOKUP_MIN), in the prompt or the output so far."""

    def __init__(self, n: int) -> None:
        self.n = n

    def propose(self, seq: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator,
                counts: Counter[int] | None = None) -> Drafts:
        seq = seq if isinstance(seq, list) else seq.tolist() if isinstance(seq, np.ndarray) else list(seq)
        L, last, found = len(seq), seq[-1], []
        # earlier positions of the last token, by list.index (a C loop): where it never occurred, the
        # usual case when nothing matches, that is all a step pays (~4 µs at 511 tokens instead of the
        # ~21 µs of converting the sequence to an array first)
        j = -1
        while len(found) <= LOOKUP_SCAN:
            try:
                j = seq.index(last, j + 1, L - 1)
            except ValueError:
                break
            found.append(j)
        if not found:
            return [], []
        if len(found) <= LOOKUP_SCAN:
            for size in range(min(self.n, L - 1), LOOKUP_MIN - 1, -1):
                for j in reversed(found):  # the latest occurrence first; its continuation starts after it
                    if j >= size - 1 and all(seq[j - i] == seq[L - 1 - i] for i in range(1, size)):
                        drafts = seq[j + 1:j + 1 + k]
                        return drafts, [None] * len(drafts)
            return [], []
        arr = np.asarray(seq, dtype=np.int64)  # a token seen often: the candidates compared at once
        ends = np.flatnonzero(arr[:-1] == arr[-1])  # (m,) earlier positions of the last token
        for size in range(min(self.n, L - 1), LOOKUP_MIN - 1, -1):
            cand = ends[ends >= size - 1]  # an n-gram ending at j: arr[j - size + 1 .. j] == the last `size`
            ok = np.ones(len(cand), dtype=bool)
            for i in range(1, size):
                ok &= arr[cand - i] == arr[L - 1 - i]
            hits = cand[ok]
            if hits.size:  # the latest occurrence; its continuation starts after it
                start = int(hits[-1]) + 1
                drafts = arr[start:start + k].tolist()
                return drafts, [None] * len(drafts)
        return [], []


def verify(logits: np.ndarray, drafts: Sequence[int], dists: Sequence[np.ndarray | None], sampling: Sampling,
           rng: np.random.Generator, seq: Sequence[int], counts: Counter[int] | None = None
           ) -> tuple[list[int], int]:
    """The drafts that stand and the target's own next token, from the target's logits (len(drafts) + 1,
    V): row j is the target's prediction for the position of drafts[j] (the last row, for the token
    after every draft). `seq` is the sequence so far and `counts` its generated tokens' counts (the
    frequency and presence penalties'; not changed): at row j, the drafts before it count as both."""
    if sampling.plain:  # one argmax over every row
        best = logits.argmax(axis=-1)  # (T,)
        m = 0
        while m < len(drafts) and best[m] == drafts[m]:
            m += 1
        return list(drafts[:m]), int(best[m])
    seen = list(seq)
    counts = Counter(counts) if sampling.penalized else None  # as of each position: a copy the drafts go into
    for j, d in enumerate(drafts):
        if sampling.greedy:
            tok = int(penalized(logits[j], sampling, seen, counts).argmax())
            if tok != d:
                return list(drafts[:j]), tok
        else:
            p, q = probs(logits[j], sampling, seen, counts), dists[j]
            if rng.random() * (1.0 if q is None else q[d]) >= p[d]:  # rejected: P(accept) = min(1, p/q)
                rest = p.copy()
                if q is None:
                    rest[d] = 0.0
                else:
                    np.maximum(p - q, 0.0, out=rest)
                if rest.sum() <= 0.0:  # rounding only: p and q agree to the last bit where p > 0
                    rest = p
                return list(drafts[:j]), draw(rest / rest.sum(), rng)
        seen.append(d)
        if counts is not None:
            counts[d] += 1
    last = logits[len(drafts)]
    if sampling.greedy:
        return list(drafts), int(penalized(last, sampling, seen, counts).argmax())
    return list(drafts), draw(probs(last, sampling, seen, counts), rng)


def speculate(target: Any, drafter: Drafter | None, prompt: Sequence[int], max_new_tokens: int, sampling: Sampling,
              eot_id: int | Collection[int], overflow: Overflow = "slide",
              on_token: Callable[[int, int], bool] | None = None, k: int | None = None,
              stats: SpecStats | None = None) -> RowResult:
    """Generate for one prompt with drafts (`drafter` None: the same loop without any, for comparison).
    Ends as generate() does: an end token (any of `eot_id`), `on_token` True (a stop string),
    max_new_tokens, or the context (`slide` re-prefills the last n_ctx // 2 tokens). `k`: drafts per
    step, fixed; None: adaptive (up while every draft stands, down after a rejection). A seeded run
    gives the same output each time."""
    model = static_model(target, "speculative decoding")
    slots, n_ctx = StaticSlots(model.session, model.config, 1, model.kv_dtype), model.n_ctx
    stats = stats if stats is not None else SpecStats()
    rng = np.random.default_rng(sampling.seed)
    row = RowResult(list(prompt))
    seq = list(prompt)
    stop = (lambda tok: on_token(0, tok)) if on_token is not None else None
    taker = Accepting(max_new_tokens, as_ends(eot_id), row.new_ids, Counter() if sampling.penalized else None, stop)
    counts = taker.counts  # the generated tokens' counts (the penalties'), which the drafts and verify read
    t0 = time.perf_counter()
    if len(seq) > 1:  # the cache holds every token but the last, whose logits come with the drafts'
        slots.append(0, np.asarray(seq[:-1], dtype=np.int64))
    row.prefill_ms = (time.perf_counter() - t0) * 1e3
    k_now = k if k is not None else K_START
    t_decode = time.perf_counter()
    while True:
        length = slots.length(0)
        if length >= n_ctx:  # full, and seq[-1] pending
            if overflow == "stop":
                row.finish_reason = FinishReason.CONTEXT
                break
            window = seq[-(n_ctx // 2):]
            slots.free(0)
            slots.append(0, np.asarray(window[:-1], dtype=np.int64))
            continue
        want = min(k_now, n_ctx - length - 1, max_new_tokens - len(row.new_ids) - 1)
        drafts, dists = (drafter.propose(seq, want, sampling, rng, counts) if drafter is not None and want > 0
                         else ([], []))
        if drafts:
            logits = slots.append(0, np.asarray([seq[-1], *drafts], dtype=np.int64), all_logits=True)  # (T, V)
        elif length > 0:
            logits = slots.decode([0], np.array([seq[-1]], dtype=np.int64))  # (1, V): a plain decode step
        else:
            logits = slots.append(0, np.asarray(seq[-1:], dtype=np.int64))  # (1, V)
        accepted, own = verify(logits, drafts, dists, sampling, rng, seq, counts)
        slots.truncate(0, length + 1 + len(accepted))
        stats.steps += 1
        stats.drafted += len(drafts)
        stats.accepted += len(accepted)
        stats.tokens += len(accepted) + 1
        if k is None and drafts:
            k_now = min(k_now + 2, K_MAX) if len(accepted) == want else max(1, k_now - 1)
        if _take(row, seq, taker, [*accepted, own]):
            break
    row.decode_s = time.perf_counter() - t_decode
    return row


def _take(row: RowResult, seq: list[int], taker: Accepting, tokens: Sequence[int]) -> bool:
    """Take tokens one by one as generate() does (accept.Accepting), each also onto `seq`; True when the
    sequence ended (its reason on the row)."""
    for tok in tokens:
        reason = taker.accept(tok)
        if reason is not FinishReason.END:
            seq.append(tok)
        if reason is not None:
            row.finish_reason = reason
            return True
    return False
