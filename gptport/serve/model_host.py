"""The loaded model behind the HTTP surface (`State`): the model, its slots and the scheduler opened in a
loading thread (/health answers 503 meanwhile), and the startup line once they run. No torch here."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from gptport.errors import GptportError
from gptport.serve import companions, startup
from gptport.serve.api.api_error import ApiError
from gptport.serve.engine.scheduler import Scheduler, SchedulerSettings
from gptport.serve.metrics import Metrics
from gptport.serve.settings import Settings

log = logging.getLogger("gptport.serve")


class State:
    """The loaded model and its scheduler, once the loading thread is done."""

    def __init__(self, settings: Settings) -> None:
        self.settings, self.metrics = settings, Metrics()
        self.scheduler: Scheduler | None = None
        self.tok: Any = None
        self.n_ctx = 0
        self.render: Any = None
        self.start: list[int] = []  # what a text prompt starts with: the model's begin token where it adds one
        self.grammars: Any = None  # runtime.constraint.Grammars: compiles the requests' constraints
        self.error: str | None = None
        self.created = int(time.time())

    def load(self, loop: asyncio.AbstractEventLoop) -> None:
        """Open the model and start the scheduler (in a thread: /health answers 503 meanwhile)."""
        from gptport.runtime.constraint import Grammars, Masks
        from gptport.runtime.loader import open_model
        from gptport.runtime.slot_layout import open_slots
        from gptport.serve.api.chat_template import renderer
        from gptport.specials import end_ids, start_ids

        s = self.settings
        try:
            opened = open_model(s.model_dir, s.graph, s.run)
            appender = companions.appender(s, opened.engine)
            slots = open_slots(opened.engine, s.slots, appender.session if appender is not None else None, s.n_ctx)
            self.render, template = renderer(s.model_dir)
            vocab = opened.engine.config.vocab_size
            self.grammars = Grammars(opened.tok.json, vocab, opened.tok.eot_id)
            drafting, drafts_from = companions.drafting(s, opened)
            knobs = SchedulerSettings(max_queue=s.max_queue, prefill_chunk=s.prefill_chunk, prefix_cache=s.prefix_cache)
            scheduler = Scheduler(slots, opened.tok, lambda events: loop.call_soon_threadsafe(_dispatch, events),
                                  knobs, observer=self.metrics, masks=Masks(vocab), drafting=drafting,
                                  end_ids=end_ids(opened.engine.config, opened.tok))
        except Exception as e:  # noqa: BLE001 - whatever stops the load stops the server, with its message
            self.error = str(e) if isinstance(e, GptportError) else f"loading the model failed: {type(e).__name__}: {e}"
            log.debug("load failed", exc_info=True)
            s.on_failure(self.error)
            return
        self.tok, self.n_ctx = opened.tok, slots.n_ctx
        self.start = start_ids(opened.engine.config)
        self.metrics.slots.set(s.slots)
        self.metrics.capacity.set(s.slots * self.n_ctx)
        engine: Any = opened.engine  # an OnnxModel: serve opens onnx engines only
        kv_type = "int8" if engine.kv_dtype.itemsize == 1 else str(engine.kv_dtype)
        graph = f"{opened.precision} {opened.cache} cache" + (" (int8)" if kv_type == "int8" else "")
        threads = engine.session.get_session_options().intra_op_num_threads
        self.metrics.info.labels(s.model_name, graph, opened.provider, str(threads or "auto")).set(1)
        scheduler.start()
        per_slot = 2 * engine.config.n_layer * engine.config.kv_width * self.n_ctx * engine.kv_dtype.itemsize
        kv = per_slot * s.slots
        self.metrics.kv_bytes.labels(kv_type).set(per_slot)
        s.on_ready(f"{s.url} · model {s.model_name!r} · {graph} on {opened.provider} · {s.slots} slots × "
                   f"n_ctx {self.n_ctx} (KV cache {kv / 2**20:,.0f} MiB{startup.residency(slots)}) · "
                   f"queue {s.max_queue} · "
                   f"prefix cache {startup.prefix_cache(s, scheduler)} · "
                   f"{'multi-row append' if slots.supports_append_many else 'one-row appends'} · "
                   f"chat template: {template}{drafts_from}"
                   f"{startup.int8_hint(s, opened)}")
        self.scheduler = scheduler  # published last: /health answers 200 only once the startup line is out

    def ready(self) -> Scheduler:
        if self.scheduler is None:
            raise ApiError(503, self.error or "the model is still loading", None, "not_ready")
        return self.scheduler


def _dispatch(events: list[tuple[Any, Any]]) -> None:
    """On the event loop: each (queue, index) handle gets its (index, event)."""
    for (queue, index), event in events:
        queue.put_nowait((index, event))
