"""Running the app on uvicorn: checks that fail before a port is bound, the startup line, and a clean
exit on SIGTERM or Ctrl-C (stop accepting, let running requests finish within a bound, exit 0).
No torch here."""

from __future__ import annotations

import logging
import signal
import socket
from collections.abc import Callable

from gptport import tokenizer as bpe
from gptport.errors import InputError, UsageError
from gptport.model_card import read_card
from gptport.paths import CONFIG
from gptport.runtime import loader
from gptport.runtime.choice import GraphChoice
from gptport.runtime.onnx_engine import check_spin
from gptport.runtime.providers import TRT_MAX_BATCH
from gptport.serve.http import access_log, cors
from gptport.serve.http.app import create_app
from gptport.serve.http.connections import Limits, fit_open_files
from gptport.serve.settings import Settings


def check(settings: Settings, limits: Limits | None = None) -> None:
    """What can be refused before the server starts: options, the graph file, the tokenizer."""
    if settings.slots < 1:
        raise UsageError(f"--slots must be at least 1, not {settings.slots}")
    if settings.max_queue < 0:
        raise UsageError(f"--max-queue must be >= 0, not {settings.max_queue}")
    if settings.prefill_chunk < 1:
        raise UsageError(f"--prefill-chunk must be at least 1, not {settings.prefill_chunk}")
    if not 0 < settings.body_timeout <= 3600:
        raise UsageError(f"--body-timeout must be > 0 and <= 3600 seconds, not {settings.body_timeout:g}")
    if limits is not None:
        limits.check()
        if limits.max_connections and limits.max_connections <= settings.slots + settings.max_queue:
            raise UsageError(f"--max-connections {limits.max_connections} must be more than --slots + --max-queue "
                             f"({settings.slots + settings.max_queue}): a full queue answers 429 before connections "
                             "run out")
    cors.parse_origins(settings.allowed_origins)
    check_drafting(settings)
    check_spin(settings.spin)
    if settings.provider == "tensorrt" and settings.slots > TRT_MAX_BATCH:
        raise UsageError(f"--slots {settings.slots}: the TensorRT engine's profiles go up to batch {TRT_MAX_BATCH}")
    loader.graph_path(settings.model_dir, settings.graph, settings.provider)
    bpe.load(settings.model_dir)
    if settings.n_ctx is not None and settings.n_ctx < 2:
        raise UsageError(f"--n-ctx {settings.n_ctx}: give at least 2 positions a slot")
    if settings.n_ctx is not None and (settings.model_dir / CONFIG).is_file():  # else the load refuses it
        most = read_card(settings.model_dir).model.n_ctx
        if settings.n_ctx > most:
            raise UsageError(f"--n-ctx {settings.n_ctx}: give 2 to the model's n_ctx, {most}")


def check_drafting(settings: Settings) -> None:
    """--draft, --draft-tokens, --draft-threads and --prompt-lookup, before anything loads."""
    from gptport.runtime.speculative import LOOKUP_MIN, check_draft_threads

    if settings.draft is not None and settings.prompt_lookup is not None:
        raise UsageError("--draft and --prompt-lookup: one way of drafting at a time")
    if settings.draft is None and settings.prompt_lookup is None and settings.draft_tokens is not None:
        raise UsageError("--draft-tokens needs --draft or --prompt-lookup")
    if settings.draft_tokens is not None and settings.draft_tokens < 1:
        raise UsageError(f"--draft-tokens must be at least 1, not {settings.draft_tokens}")
    if settings.prompt_lookup is not None and settings.prompt_lookup < LOOKUP_MIN:
        raise UsageError(f"--prompt-lookup must be at least {LOOKUP_MIN} (tokens matched), not "
                         f"{settings.prompt_lookup}")
    if settings.draft_precision is not None and settings.draft is None:
        raise UsageError("--draft-precision needs --draft")
    check_draft_threads(settings.draft_threads, settings.draft)
    if settings.draft is not None:  # exported, at this precision
        loader.graph_path(settings.draft, GraphChoice.parse(settings.draft_precision or settings.precision),
                          settings.provider)
        bpe.load(settings.draft)


def run(settings: Settings, host: str, port: int, say: Callable[[str], None], shutdown_timeout: float = 30.0,
        limits: Limits | None = None) -> int:
    """Serve until SIGTERM/SIGINT; the exit code (1 when the model could not be loaded). With
    settings.access_log, one line per request on stderr (serve/http/access_log.py: uvicorn's own stays off)."""
    import uvicorn

    limits = limits or Limits()
    check(settings, limits)
    lowered = fit_open_files(limits)
    if lowered:
        say(f"gptport serve: {lowered}")
    settings.url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
    failed: list[str] = []
    server: uvicorn.Server | None = None

    def on_failure(message: str) -> None:
        failed.append(message)
        if server is not None:
            server.should_exit = True

    settings.on_ready = lambda line: say(f"gptport serve: {line}")
    settings.on_failure = on_failure
    logging.getLogger("gptport.serve").setLevel(logging.INFO)
    if settings.access_log:
        access_log.to_stderr()
    config = uvicorn.Config(create_app(settings), host=host, port=port, log_level="warning",
                            access_log=False, timeout_graceful_shutdown=int(shutdown_timeout),
                            lifespan="on", server_header=False, **limits.uvicorn_options())
    listener = bind(host, port)
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then raises the signal again through the handler it
    # found installed; a no-op handler there lets a clean shutdown end in exit code 0.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[listener])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed:
        say(f"gptport: error: {failed[0]}")
        return 1
    if not server.started:
        return 1  # uvicorn said why (the port is taken, say)
    return 0


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that a taken port is a one-line error before anything loads."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise InputError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})") from None
    return sock
