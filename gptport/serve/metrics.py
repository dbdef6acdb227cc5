"""The server's Prometheus metrics (prometheus-client), in a registry of their own per app. The
scheduler reports through the Observer methods; gauges are read from the scheduler when scraped."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gptport.serve.engine.events import Observer

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5,
                   5.0, 10.0, 30.0)


class Metrics(Observer):
    """Counters and histograms the routes and the scheduler update; gauges read at scrape time."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("gptport_requests", "Requests answered, by route, HTTP status and the replica "
                                "that answered (x-gptport-replica)", ["route", "status", "replica"], registry=r)
        self.prompt_tokens = Counter("gptport_prompt_tokens", "Prompt tokens prefilled (computed)", registry=r)
        self.cached_tokens = Counter("gptport_prompt_tokens_cached", "Prompt tokens taken from a kept cache "
                                     "(prefix caching) instead of prefilled", registry=r)
        self.generated_tokens = Counter("gptport_generation_tokens", "Tokens generated", registry=r)
        self.queue_time = Histogram("gptport_queue_time_seconds", "From a choice's arrival to the slot it takes "
                                    "(the wait part of the time to first token; observed at admission, so a choice "
                                    "cancelled while waiting is not counted)", buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("gptport_time_to_first_token_seconds", "From a choice's arrival to its first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("gptport_time_per_output_token_seconds", "Between a choice's consecutive tokens",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.phases = Counter("gptport_scheduler_seconds", "Scheduler time by phase: prefill, decode (the model), "
                              "sample, emit (detokenize and hand over)", ["phase"], registry=r)
        self._phases: dict[str, Any] = {}
        self.drafted = Counter("gptport_draft_tokens", "Tokens drafted (serve --draft / --prompt-lookup)", registry=r)
        self.accepted = Counter("gptport_draft_accepted_tokens", "Drafted tokens the model kept", registry=r)
        self.queue = Gauge("gptport_queue_depth", "Choices waiting for a slot", registry=r)
        self.busy = Gauge("gptport_slots_busy", "Slots holding a request", registry=r)
        self.slots = Gauge("gptport_slots", "Slots (rows of the KV cache)", registry=r)
        self.positions = Gauge("gptport_kv_cache_positions_used", "KV-cache positions held by busy slots",
                               registry=r)
        self.kv_bytes = Gauge("gptport_kv_cache_bytes_per_slot", "Bytes of one slot's KV cache (n_ctx positions, "
                              "keys and values of every layer), by the cache's element type", ["dtype"],
                              registry=r)
        self.capacity = Gauge("gptport_kv_cache_positions", "KV-cache positions in all (slots x n_ctx)", registry=r)
        self.info = Gauge("gptport_info", "The model this server runs (labels; threads: onnxruntime's intra-op "
                          "threads, auto = one per core), value 1", ["model", "graph", "provider", "threads"],
                          registry=r)

    def admitted(self, seconds: float) -> None:
        self.queue_time.observe(seconds)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def next_token(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def tokens(self, prompt: int, generated: int) -> None:
        if prompt:
            self.prompt_tokens.inc(prompt)
        if generated:
            self.generated_tokens.inc(generated)

    def cached(self, prompt: int) -> None:
        self.cached_tokens.inc(prompt)

    def phase(self, name: str, seconds: float) -> None:
        child = self._phases.get(name)
        if child is None:
            child = self._phases[name] = self.phases.labels(name)
        child.inc(seconds)

    def drafts(self, drafted: int, accepted: int) -> None:
        self.drafted.inc(drafted)
        self.accepted.inc(accepted)

    def render(self, scheduler: Any) -> bytes:
        """The exposition text, with the gauges read from the scheduler now."""
        if scheduler is not None:
            self.queue.set(scheduler.waiting)
            self.busy.set(scheduler.busy)
            self.positions.set(scheduler.positions_in_use)
        return generate_latest(self.registry)
