"""Constrained decoding with llguidance: a JSON schema, a regex, a Lark or GBNF grammar, or a list of
choices becomes a matcher per sequence, which gives the allowed-token mask for the next step and
consumes each sampled token. Masked logits are -inf before sampling; a matcher that reaches its end
finishes the sequence. llguidance reads the model directory's tokenizer.json itself. No torch here.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import llguidance as llg
import llguidance.numpy as llg_np
import numpy as np

from gptport.errors import UsageError

Kind = Literal["json_schema", "json_object", "regex", "grammar", "lark", "choice"]
KINDS: tuple[str, ...] = ("json_schema", "json_object", "regex", "grammar", "lark", "choice")
# JSON as compact as a small model can write it: ", " and ": " between items, no other whitespace
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False}
TEMPLATES = 64  # grammars whose fresh matcher is kept to copy (a request's matcher: 0.55 ms to build, 4 µs to copy)


class ConstraintError(UsageError):
    """A schema, regex or grammar that does not compile; its message names where it came from."""


@dataclass(frozen=True)
class Spec:
    """What a sequence must match: `kind`, its source text or value, and where it came from (a request
    field or a CLI option, for messages)."""

    kind: Kind
    source: Any
    origin: str

    @property
    def json_like(self) -> bool:
        """Mostly JSON: a schema, or a Lark grammar around %json (a tool call)."""
        return self.kind in ("json_schema", "json_object") or (self.kind == "lark" and "%json" in str(self.source))


class Grammars:
    """Compiles constraints for one tokenizer and makes their matchers. Thread-safe."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_id: int) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = llg.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos_id)
        # JSON's own partition of the vocabulary for the mask search: 16 rows of a 6-field schema at a
        # 4,096-token vocabulary take 0.27 ms instead of 0.40 ms with the general slices
        self.json_tokenizer = self.tokenizer.with_slices(llg.LLTokenizer.json_slices())
        self._templates: OrderedDict[Any, Any] = OrderedDict()  # (grammar, json) -> a matcher never advanced
        self._compiled: OrderedDict[Any, Any] = OrderedDict()  # (kind, source as JSON) -> grammar
        self._lock = threading.Lock()

    def _kept(self, cache: OrderedDict[Any, Any], key: Any) -> Any:
        """A kept value (the most recently used now), or None."""
        with self._lock:
            value = cache.get(key)
            if value is not None:
                cache.move_to_end(key)
            return value

    def _keep(self, cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        """Keep a value; the least recently used goes beyond TEMPLATES."""
        with self._lock:
            cache[key] = value
            if len(cache) > TEMPLATES:
                cache.popitem(last=False)

    def compile(self, spec: Spec) -> str:
        """The llguidance grammar of `spec`, checked: a ConstraintError naming spec.origin and the
        parser's message when it does not compile. A constraint compiled before is not checked again."""
        try:
            key: Any = (spec.kind, json.dumps(spec.source, sort_keys=True))
        except (TypeError, ValueError):
            key = None  # not JSON (the request parser never gives such a source): compiled every time
        if key is not None and (kept := self._kept(self._compiled, key)) is not None:
            return kept  # type: ignore[no-any-return]
        try:
            grammar = _grammar(spec)
        except (ValueError, TypeError) as e:
            raise ConstraintError(f"{spec.origin}: {_first_line(str(e))}") from e
        failed, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if failed:
            raise ConstraintError(f"{spec.origin}: {_first_line(messages[0] if messages else 'does not compile')}")
        if key is not None:
            self._keep(self._compiled, key, grammar)
        return grammar

    def matcher(self, grammar: str, json: bool = False) -> Matcher:
        """A fresh matcher at the grammar's start (the grammar from `compile`); `json`: the grammar is
        mostly JSON (a schema, or a tool call), whose mask search has slices of its own. Requests that
        repeat a grammar (a server's usual load) copy a kept fresh matcher instead of building one."""
        key = (grammar, json)
        template = self._kept(self._templates, key)
        if template is not None:
            with self._lock:  # a template is shared: copies are made one at a time
                return Matcher(template.deep_copy())
        m = llg.LLMatcher(self.json_tokenizer if json else self.tokenizer, grammar, log_level=0)
        if m.is_error():
            raise ConstraintError(_first_line(m.get_error()))
        self._keep(self._templates, key, m.deep_copy())
        return Matcher(m)


class Matcher:
    """One sequence's position in its grammar."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.mask: np.ndarray | None = None  # (W,) int32 bits: allowed tokens of the current state
        self.bias: np.ndarray | None = None  # (V,) float32: +inf where allowed, -inf elsewhere (set with mask)

    def consume(self, token: int) -> bool:
        """Advance by the sampled token; False if the grammar refuses it (the mask was not applied)."""
        self.mask = self.bias = None
        return bool(self.inner.consume_token(token))

    @property
    def finished(self) -> bool:
        """The grammar can go no further (only the end of text is left)."""
        return bool(self.inner.is_stopped())

    @property
    def error(self) -> str:
        return str(self.inner.get_error()) if self.inner.is_error() else ""


class Masks:
    """Computes matchers' next-token masks on one thread of its own, in the background: `start` before
    the model's step (onnxruntime and llguidance both release the GIL), `apply` after it. One thread,
    one mask after another: llguidance's parallel executor (a rayon pool) competed with onnxruntime's
    threads for the cores and slowed the step more than its masks cost (ARCHITECTURE.md)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.words = llg_np.get_bitmask_shape(1, vocab_size)[1]
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gptport-masks")
        self._lock = threading.Lock()

    def start(self, matchers: Sequence[Matcher]) -> Future[None] | None:
        """Fill the mask of every matcher that has none; None when all have one."""
        todo = [m for m in matchers if m.mask is None]
        if not todo:
            return None
        return self._pool.submit(self._fill, todo)

    def fill(self, matchers: Sequence[Matcher]) -> None:
        """As `start`, in this thread."""
        todo = [m for m in matchers if m.mask is None]
        if todo:
            self._fill(todo)

    def _fill(self, todo: Sequence[Matcher]) -> None:
        out = np.full((len(todo), self.words), -1, dtype=np.int32)  # (k, W)
        with self._lock:
            for i, m in enumerate(todo):
                llg_np.fill_next_token_bitmask(m.inner, out, i)
        self.set_masks(todo, out)

    def set_masks(self, todo: Sequence[Matcher], out: np.ndarray) -> None:
        """Give todo[i] the mask out[i] (bits, (k, W) int32) and its row of bounds."""
        # the mask as a row of bounds, made here (in the background) so that applying it is one np.fmin
        # per row: np.putmask of -inf cost 32 µs for 16 rows at a 4,096-token vocabulary, fmin ~13.
        # fmin(x, +inf) is x, fmin(anything, -inf) is -inf, a NaN or +inf logit included.
        allowed = np.unpackbits(out.view(np.uint8), axis=1, bitorder="little")[:, :self.vocab_size].view(bool)
        for m, row, ok in zip(todo, out, allowed, strict=True):
            m.bias = np.where(ok, np.float32(np.inf), np.float32(-np.inf))  # (V,), its own memory
            m.mask = row

    def apply(self, logits: np.ndarray, rows: Sequence[int], matchers: Sequence[Matcher]) -> None:
        """Set the disallowed tokens of logits[rows[i]] to -inf, by matchers[i]'s mask (logits (k, V), in
        place; `rows` ascending)."""
        for i, m in zip(rows, matchers, strict=True):
            np.fmin(logits[i], m.bias, out=logits[i])  # type: ignore[arg-type]

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def allowed_ids(matcher: Matcher, vocab_size: int) -> np.ndarray:
    """The token ids matcher's current mask allows (for tests and messages)."""
    assert matcher.mask is not None
    bits = np.unpackbits(matcher.mask.view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits)


def _grammar(spec: Spec) -> str:
    kind, src = spec.kind, spec.source
    if kind == "json_object":
        return llg.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS)
    if kind == "json_schema":
        if isinstance(src, str):
            src = json.loads(src)
        if not isinstance(src, dict):
            raise ValueError(f"a JSON schema must be an object, not {type(src).__name__}")
        return llg.LLMatcher.grammar_from_json_schema(src, overrides=JSON_OPTIONS)
    if kind == "regex":
        return llg.LLMatcher.grammar_from_regex(src)
    if kind == "lark":
        return llg.LLMatcher.grammar_from_lark(src)
    if kind == "grammar":  # Lark, or GBNF (llama.cpp's), converted to Lark
        return llg.grammar_from("gbnf", src)
    if kind == "choice":
        if not isinstance(src, list) or not src or not all(isinstance(s, str) and s for s in src):
            raise ValueError("expected a non-empty list of non-empty strings")
        return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(s) for s in src))
    raise ValueError(f"unknown constraint kind {kind!r}")


def _first_line(message: str) -> str:
    """llguidance's messages point into the grammar over several lines: keep the line that says where
    and the ones that say what is wrong, on one line."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return message
    said = [lines[0], *(line for line in lines[1:] if line.lower().startswith("error"))]
    return " ".join(said)
