"""Prefix caching's choices for the scheduler (a StaticSlots engine): which free slot an arriving prompt
takes, and the choices of one prompt that copy another's prefill instead of running their own.

A freed slot keeps its cache (slots.py). An arriving prompt takes the free slot whose cache holds the
longest part of it, the lowest among equals, so that with nothing to reuse admission still takes the
lowest free slot and the decode span stays narrow; it prefills only the rest, at least its last token.
The choices of an `n` > 1 request share one list of prompt ids: the first prefills, the others copy its
rows (one memcpy per buffer) and start from its logits. A prompt admitted while an earlier one
(prefilling, or decoding) shares a longer prefix with it than any free slot holds takes the lowest free
slot and copies that prefix once the other holds it: prompts that arrive together with one system
prompt compute it once. No torch here.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from gptport.runtime.slots import SlotEngine
    from gptport.serve.engine.choice import Choice


def _shared(ids: list[int], other: list[int]) -> int:
    """How many first tokens two prompts share."""
    n = min(len(ids), len(other))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(ids[:n]) != np.asarray(other[:n]))
    return int(diff[0]) if diff.size else n


def admit(engine: SlotEngine, c: Choice, free: list[int], holding: Iterable[Choice], observer: Any) -> None:
    """Give choice c one of the `free` slots (a heap, changed in place) and set how much of its prompt is
    there already (c.cached, c.filled), or the choice it copies that much from once it holds it (c.twin,
    c.share): whichever gives the longer prefix, a kept cache on a tie (no copy)."""
    ids = c.prompt_ids
    order = sorted(free)
    held = engine.cached(order, ids)  # (F,)
    best = int(np.argmax(held))  # the first (lowest) slot among the longest
    source, share = None, 0
    for o in holding:  # the other choices of the same request first: they share the whole prompt
        m = len(ids) if o.prompt_ids is ids else min(_shared(ids, o.prompt_ids), len(ids) - 1)
        if m > share:
            source, share = o, m
    if source is None or share <= held[best]:
        c.slot = order[best]
        free.remove(c.slot)
        heapq.heapify(free)
        c.cached = c.filled = engine.reuse(c.slot, ids)
        if c.cached:
            observer.cached(c.cached)
        return
    c.slot = heapq.heappop(free)  # its kept cache, if any, is overwritten by the copy
    c.twin, c.share = source, share


def resolve(engine: SlotEngine, c: Choice, observer: Any) -> bool:
    """Copy the prefix choice c waits for once its source holds it (True), or let c prefill on its own
    when the source has left (True); False while c must still wait."""
    src = c.twin
    if src.slot < 0:
        c.twin = None
        return True
    if src.filled < c.share:
        return False
    engine.copy(src.slot, c.slot, c.share)
    c.cached = c.filled = c.share
    if c.share == len(c.prompt_ids):
        c.first_logits = src.first_logits  # the same prompt: its first token comes from the same logits
    observer.cached(c.share)
    c.twin = None
    return True
