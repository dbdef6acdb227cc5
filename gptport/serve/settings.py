"""What `gptport serve` was asked for (`Settings`): the model and how to run it, the HTTP surface's limits
and names, and the callbacks that tell the CLI when the model is ready or failed. No torch here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from gptport.runtime.choice import GraphChoice, RunOptions


@dataclass
class Settings:
    """What `gptport serve` was asked for."""

    model_dir: Path
    precision: str = "fp32"
    provider: str = "cpu"
    kv_cache: str = "auto"
    slots: int = 16
    max_queue: int = 64
    threads: int = 0
    api_key: str | None = None
    model_name: str = ""  # the primary name (serve/names.py)
    prefill_chunk: int = 512
    max_body: int = 1 << 20
    body_timeout: float = 30.0  # seconds a request's body may take to arrive (then 408): a slow sender holds no task
    draft: Path | None = None  # speculative decoding of a lone row: the draft model's directory
    draft_tokens: int | None = None  # drafts per step (None: adaptive)
    draft_precision: str | None = None  # the draft's exported variant (None: the model's precision)
    draft_threads: int | None = None  # the draft session's threads (None: speculative.DRAFT_THREADS)
    prompt_lookup: int | None = None  # speculative decoding by prompt lookup: the n-gram length
    prefix_cache: bool = True  # freed slots keep their cache for prompts that start the same way
    multi_row_append: bool = True  # prompt chunks of several rows appended in one step (model.append.onnx)
    kv_dtype: str = "float32"  # int8: the static graph with an int8 KV cache (export --kv-dtype int8)
    spin: str = "step"  # onnxruntime's workers spin during a step and sleep between: the HTTP side needs the cores
    aliases: tuple[str, ...] = ()  # other names the server answers to, each listed by /v1/models
    url: str = ""
    replica: str = ""  # this server's name in x-gptport-replica and /metrics (default: hostname:pid)
    allowed_origins: tuple[str, ...] = ()  # pages on these origins may call the API (CORS; "*": any): http/cors.py
    access_log: bool = False  # one line per request, when its response ends (serve/http/access_log.py)
    n_ctx: int | None = None  # positions per slot (None: the model's n_ctx)
    on_ready: Callable[[str], None] = field(default=lambda line: None)
    on_failure: Callable[[str], None] = field(default=lambda message: None)

    @cached_property
    def graph(self) -> GraphChoice:
        """The model's graph (precision, kv_cache, kv_dtype), parsed once when first asked (http/server.check
        asks first: a bad word is refused before the port is bound)."""
        return GraphChoice.parse(self.precision, self.kv_cache, self.kv_dtype)

    @cached_property
    def run(self) -> RunOptions:
        """How to run it (provider, threads, spin), parsed once when first asked."""
        return RunOptions.parse(self.provider, self.threads, self.spin)
