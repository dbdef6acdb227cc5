"""Which slots a served engine gets (`open_slots`): the static cache's StaticSlots, the device slots of a
static-cache graph on CUDA, or ConcatSlots over any other engine. Apart from slots.py, so that slots.py
(SlotEngine, StaticSlots) and concat_slots.py (a SlotEngine) do not import each other."""

from __future__ import annotations

import dataclasses
from typing import Any

from gptport.errors import UsageError
from gptport.runtime.concat_slots import ConcatSlots
from gptport.runtime.engine import Capability
from gptport.runtime.slots import SlotEngine, StaticSlots


def open_slots(engine: Any, slots: int, appender: Any = None, n_ctx: int | None = None) -> SlotEngine:
    """StaticSlots for a static-cache onnxruntime graph (with `appender`, a session of the multi-row append
    graph of the same weights: append_many), the device slots of a static-cache graph on CUDA
    (cuda_engine.DeviceModel: its own appender), ConcatSlots for any other engine; `n_ctx` positions a slot
    (None: the model's; more is refused, naming serve's --n-ctx)."""
    if n_ctx is not None and not 2 <= n_ctx <= engine.config.n_ctx:
        raise UsageError(f"--n-ctx {n_ctx}: give 2 to the model's n_ctx, {engine.config.n_ctx}")
    config = engine.config if n_ctx is None else dataclasses.replace(engine.config, n_ctx=n_ctx)
    caps = engine.capabilities
    if Capability.DEVICE_SLOTS in caps:
        return engine.device_slots(slots, config)  # type: ignore[no-any-return]  # cuda_engine.DeviceModel
    if Capability.STATIC_SLOTS in caps:  # held from the start where it fits (serve's)
        return StaticSlots(engine.session, config, slots, engine.kv_dtype, appender, hold=True)
    return ConcatSlots(engine, slots, config.n_ctx)
