"""Prefix caching's choices for the scheduler (a StaticSlots engine): which free slot an arriving prompt
takes, and the choices of one prompt that copy another's prefill instead of running their own.

A freed slot keeps its cache (slots.py). An arriving prompt takes the free slot whose cache holds the
longest part of it, the lowest among equals, so that with nothing to reuse admission still takes the
lowest free slot and the decode span stays narrow; it prefills only the rest, at least its last token.
The choices of an `n` > 1 request share one list of prompt ids: the first prefills, the others copy its
rows (one memcpy per layer) and start from its logits. No torch here.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

import numpy as np


def admit(engine: Any, c: Any, free: list[int], holding: Iterable[Any], observer: Any) -> None:
    """Give choice c one of the `free` slots (a heap, changed in place) and set how much of its prompt is
    there already (c.cached, c.filled), or the twin whose prefill it will copy (c._twin)."""
    twin = next((o for o in holding if o.prompt_ids is c.prompt_ids and o._twin is None), None)
    if twin is not None and twin.filled < len(twin.prompt_ids):  # being prefilled: copy it when done
        c._twin, c.slot = twin, heapq.heappop(free)
        return
    if twin is not None:  # prefilled already: its first positions are this prompt's, all but the last
        c.slot = heapq.heappop(free)
        c.cached = c.filled = len(c.prompt_ids) - 1
        if c.cached:
            engine.copy(twin.slot, c.slot, c.cached)
            observer.cached(c.cached)
        return
    order = sorted(free)
    held = engine.cached(order, c.prompt_ids)  # (F,)
    c.slot = order[int(np.argmax(held))]  # the first (lowest) slot among the longest
    free.remove(c.slot)
    heapq.heapify(free)
    c.cached = c.filled = engine.reuse(c.slot, c.prompt_ids)
    if c.cached:
        observer.cached(c.cached)


def copy_twins(engine: Any, filling: list[Any], done: list[tuple[Any, np.ndarray]], observer: Any) -> None:
    """Choices waiting on a twin's prefill: where the twin is among `done` (choice, its logits (1, V)), copy
    its rows and join `done` with its logits; where the twin left (cancelled, failed), prefill alone."""
    ready = {id(c): logits for c, logits in done}
    for c in filling:
        twin = c._twin
        if twin is None:
            continue
        if id(twin) in ready:
            engine.copy(twin.slot, c.slot, len(c.prompt_ids))
            c.cached = c.filled = len(c.prompt_ids)
            observer.cached(c.cached)
            c._twin = None
            done.append((c, ready[id(twin)]))
        elif twin.slot < 0:
            c._twin = None
