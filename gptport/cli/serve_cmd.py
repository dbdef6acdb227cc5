"""`gptport serve`: an OpenAI-compatible HTTP server with continuous batching (no torch)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from gptport.cli import options as opt
from gptport.cli.common import ModelDir, err

EXAMPLES = """Examples:

  gptport serve models/mymodel                                   # http://127.0.0.1:8000, 16 slots

  gptport serve models/mymodel --precision int8 --slots 8 --port 9000 --api-key s3cret

  curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
       -d '{"prompt": "To be or not", "max_tokens": 32, "temperature": 0}'

  Open http://127.0.0.1:8000/ in a browser for a prompt box that streams the reply.

  gptport serve models/mymodel --draft models/draft             # a lone request decodes several tokens per step

  gptport serve models/mymodel --ray --replicas 2 --threads 1    # Ray Serve: 2 engines behind Ray's proxy

  gptport serve models/mymodel --ray --autoscale 1:4 --ray-address auto   # join the cluster of `ray start`
"""


def serve(
    model_dir: ModelDir,
    host: Annotated[str, typer.Option(help="Address to bind (0.0.0.0 to serve other machines).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", min=1, max=65535)] = 8000,
    precision: opt.Precision = "fp32",
    provider: opt.Provider = "cpu",
    kv_cache: opt.ServeKvCache = "auto",
    kv_dtype: opt.KvDtype = "float32",
    slots: Annotated[int, typer.Option(help="Requests decoded together: rows of the KV cache, n_ctx positions "
                                       "each.")] = 16,
    n_ctx: Annotated[int | None, typer.Option(help="Positions per slot, prompt and answer together (default: the "
                                              "model's n_ctx): a shorter context holds less KV cache.",
                                              show_default=False)] = None,
    max_queue: Annotated[int, typer.Option(help="Choices that may wait for a slot; past that, 429.")] = 64,
    threads: opt.Threads = 0,
    api_key: Annotated[str | None, typer.Option(envvar="GPTPORT_API_KEY", help="Require 'Authorization: Bearer "
                                                "KEY' on every route but /health and the page.")] = None,
    model_name: Annotated[list[str] | None, typer.Option(
        "--served-model-name", "--model-name", help="The model's id in the API (default: the directory's name); "
        "repeated or comma-separated, several names the server answers to, each listed by /v1/models, the first "
        "its primary name.")] = None,
    prefill_chunk: Annotated[int, typer.Option(help="Prompt tokens prefilled per scheduler iteration: decoding "
                                               "requests wait at most this long a prefill.")] = 512,
    prefix_cache: Annotated[bool, typer.Option("--prefix-cache/--no-prefix-cache", help="A finished request's "
                                               "slot keeps its KV cache; a prompt that starts with the same "
                                               "tokens prefills only the rest (static-cache graphs).")] = True,
    multi_row_append: Annotated[bool, typer.Option("--multi-row-append/--no-multi-row-append", help="Append an "
                                                   "iteration's prompt chunks of several rows in one step with "
                                                   "model.append.onnx (fp32 static cache on the CPU; a second "
                                                   "session: its weights once more in memory).")] = True,
    shutdown_timeout: Annotated[float, typer.Option(help="On SIGTERM/Ctrl-C, seconds running requests get to "
                                                    "finish.")] = 30.0,
    spin: opt.Spin = "step",
    max_connections: Annotated[int, typer.Option(help="Open connections, idle ones too, past which a request is "
                                                 "answered 503 at once (0: no limit; raises the open-file limit "
                                                 "to fit).")] = 1024,
    header_timeout: Annotated[float, typer.Option(help="Seconds a connection has to send a request's headers, from "
                                                  "opening or from its previous response; then it is closed (408 "
                                                  "when some had come).")] = 10.0,
    body_timeout: Annotated[float, typer.Option(help="Seconds a request's body has to arrive; then 408 and the "
                                                "connection is closed.")] = 30.0,
    keep_alive: Annotated[int, typer.Option(help="Seconds an idle keep-alive connection stays open.")] = 5,
    draft: opt.ServeDraft = None,
    draft_tokens: opt.DraftTokens = None,
    prompt_lookup: Annotated[int | None, typer.Option("--prompt-lookup", help="Speculative decoding without a "
                                                      "draft model: drafts copied from the latest earlier match of "
                                                      "the last N tokens.")] = None,
    draft_precision: opt.ServeDraftPrecision = None,
    draft_threads: opt.DraftThreads = None,
    allowed_origins: Annotated[list[str] | None, typer.Option(
        "--allowed-origins", metavar="ORIGIN", help="Pages on these origins (scheme://host[:port], or * "
        "for any) may call the API from a browser (CORS); repeated or comma-separated. The API key is still "
        "required. Default: none.")] = None,
    access_log: Annotated[bool, typer.Option("--access-log", help="One line per request on stderr when its "
                                             "response ends: client, method, path, status, milliseconds (costs "
                                             "CPU under load).")] = False,
    ray: Annotated[bool, typer.Option("--ray", help="Serve on Ray Serve (pip install 'gptport[ray]'): replicas, "
                                      "each with its own slots and --threads CPUs, behind Ray's proxy.")] = False,
    replicas: Annotated[int, typer.Option(help="With --ray: replicas of the engine.", min=1)] = 1,
    autoscale: Annotated[str | None, typer.Option(help="With --ray: MIN:MAX replicas, scaled on busy slots.")
                         ] = None,
    ray_address: Annotated[str | None, typer.Option(help="With --ray: join this cluster (auto, HOST:PORT or "
                                                    "ray://HOST:PORT) instead of starting one here.")] = None,
) -> None:
    """Serve the model over HTTP with OpenAI's API: /v1/completions, /v1/chat/completions, /v1/models,
    /health, /metrics, and a page at /."""
    from gptport.errors import UsageError
    from gptport.serve.http.connections import Limits
    from gptport.serve.http.cors import parse_origins
    from gptport.serve.http.server import run
    from gptport.serve.names import served_names
    from gptport.serve.settings import Settings

    primary, *aliases = served_names(model_name, model_dir.resolve().name)
    settings = Settings(model_dir, precision, provider, kv_cache, slots, max_queue, threads, api_key or None,
                        primary, prefill_chunk, aliases=tuple(aliases), spin=spin, body_timeout=body_timeout,
                        draft=draft, draft_tokens=draft_tokens, prompt_lookup=prompt_lookup,
                        draft_precision=draft_precision, draft_threads=draft_threads, prefix_cache=prefix_cache,
                        kv_dtype=kv_dtype, allowed_origins=parse_origins(allowed_origins), access_log=access_log,
                        multi_row_append=multi_row_append, n_ctx=n_ctx)
    limits = Limits(max_connections, header_timeout, keep_alive)
    say = lambda line: err.print(line, markup=False)  # noqa: E731
    if ray:
        if any(v is not None for v in (draft, prompt_lookup, draft_precision, draft_threads)):
            raise UsageError("--draft, --draft-precision, --draft-threads and --prompt-lookup serve from gptport's "
                             "own server, not Ray Serve's replicas")
        if limits != Limits():
            raise UsageError("--max-connections, --header-timeout and --keep-alive bound gptport's own HTTP server, "
                             "not Ray's proxy")
        if access_log:
            raise UsageError("--access-log logs gptport's own HTTP server; Ray Serve logs each request in its "
                             "replicas' logs")
        from gptport.serve.ray import ray_cluster

        settings.threads = settings.threads or 1  # a replica's CPUs
        sys.exit(ray_cluster.run(settings, host, port, say, replicas, autoscale, ray_address))
    if replicas != 1 or autoscale or ray_address:
        raise UsageError("--replicas, --autoscale and --ray-address go with --ray")
    sys.exit(run(settings, host, port, say, shutdown_timeout, limits))
