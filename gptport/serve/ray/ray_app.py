"""gptport's OpenAI-compatible app as a Ray Serve application. Each replica runs `create_app(Settings)`,
the app `gptport serve` runs (same routes, scheduler, errors and metrics): one continuous-batching
scheduler with its own slots and onnxruntime session, its threads from the replica's `num_cpus`.
Ray Serve's proxy routes requests among the replicas. No torch here.

For Ray's own tooling (the builder takes the options as key=value strings):

    serve run gptport.serve.ray.ray_app:app model_dir=models/mymodel replicas=2 threads=1
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application

from gptport.errors import UsageError
from gptport.serve.http.app import create_app
from gptport.serve.settings import Settings

log = logging.getLogger("gptport.serve")
APP_NAME = "gptport"
DEPLOYMENT = "gptport"
SPARE_REQUESTS = 8  # beyond slots + queue, what a busy replica still takes: /health and /metrics stay answered


def replica_name() -> str:
    """This replica's name in x-gptport-replica: its Ray actor's name less the SERVE_REPLICA:: prefix
    (app#deployment#id), then @hostname:pid."""
    rid = serve.get_replica_context().replica_id
    return f"{rid.deployment_id.app_name}#{rid.deployment_id.name}#{rid.unique_id}@{socket.gethostname()}:{os.getpid()}"


@serve.ingress()
class GptportReplica:
    """One replica: the app is built on the replica (`__serve_build_asgi_app__`) and its model loaded there
    before Ray routes requests to it; a model that does not load fails the replica with its message."""

    def __init__(self, settings: dict[str, Any]) -> None:
        import ray

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 0.0)
        known = {f.name for f in fields(Settings)} - {"on_ready", "on_failure"}
        self.settings = Settings(**{k: v for k, v in settings.items() if k in known})
        self.settings.model_dir = Path(self.settings.model_dir)
        self.settings.threads = max(1, round(cpus)) if cpus else self.settings.threads
        self.settings.replica = replica_name()
        self.settings.url = f"Ray Serve replica {self.settings.replica}"
        self.settings.on_ready = lambda line: log.warning("gptport serve: %s", line)

    async def __serve_build_asgi_app__(self) -> Any:
        import asyncio

        self.gptport_app = create_app(self.settings)
        state = self.gptport_app.state.gptport
        await asyncio.to_thread(state.load, asyncio.get_running_loop())  # on the loop that serves requests
        if state.error is not None:
            raise RuntimeError(state.error)
        return self.gptport_app

    def check_health(self) -> None:
        """Ray's periodic health check: the scheduler's thread must be alive."""
        app = getattr(self, "gptport_app", None)
        scheduler = app.state.gptport.scheduler if app is not None else None
        if scheduler is None or not scheduler.alive:
            raise RuntimeError("the scheduler thread is not running")


def settings_dict(settings: Settings) -> dict[str, Any]:
    """What a replica is built from (plain values: it travels to other processes and machines; the model
    directory as an absolute path, which every machine must have)."""
    out = {k: v for k, v in asdict(settings).items() if k not in ("on_ready", "on_failure")}
    out["model_dir"] = str(Path(settings.model_dir).resolve())
    return out


def deployment_options(settings: Settings, replicas: int = 1, autoscale: tuple[int, int] | None = None
                       ) -> dict[str, Any]:
    """Ray Serve deployment options: replicas (or autoscaling bounds), CPUs per replica (= threads, at
    least 1), and how many requests a replica takes at once (its slots and queue, plus spare)."""
    if replicas < 1:
        raise UsageError(f"--replicas must be at least 1, not {replicas}")
    cpus = max(1, settings.threads)
    opts: dict[str, Any] = {
        "name": DEPLOYMENT,
        "ray_actor_options": {"num_cpus": cpus},
        "max_ongoing_requests": settings.slots + settings.max_queue + SPARE_REQUESTS,
        "max_constructor_retry_count": 1,
        "health_check_period_s": 2.0,
        "graceful_shutdown_timeout_s": 10.0,
    }
    if autoscale is not None:
        low, high = autoscale
        # a replica is busy when its slots are: scale up when the ongoing requests per replica reach them
        opts["autoscaling_config"] = {"min_replicas": low, "max_replicas": high, "initial_replicas": low,
                                      "target_ongoing_requests": settings.slots}
    else:
        opts["num_replicas"] = replicas
    return opts


def build_app(settings: Settings, replicas: int = 1, autoscale: tuple[int, int] | None = None) -> Application:
    """The Serve application: the deployment with its options, bound to the settings."""
    deployment = serve.deployment(GptportReplica).options(**deployment_options(settings, replicas, autoscale))
    return deployment.bind(settings_dict(settings))


def parse_autoscale(text: str) -> tuple[int, int]:
    """"MIN:MAX" (1 <= MIN <= MAX)."""
    low, sep, high = text.partition(":")
    if not (sep and low.strip().isdigit() and high.strip().isdigit()) or not 1 <= int(low) <= int(high):
        raise UsageError(f"--autoscale {text!r}: expected MIN:MAX with 1 <= MIN <= MAX, e.g. 1:4")
    return int(low), int(high)


def app(args: dict[str, str]) -> Application:
    """The application builder for `serve run gptport.serve.ray.ray_app:app model_dir=DIR [replicas=N |
    autoscale=MIN:MAX] [threads=N slots=N n_ctx=N max_queue=N precision=... kv_cache=... model_name=A[,B...] api_key=...
    spin=step|always|never allowed_origins=ORIGIN[,ORIGIN...]]`."""
    from gptport.serve.http.cors import parse_origins
    from gptport.serve.http.server import check
    from gptport.serve.names import served_names

    args = dict(args)
    if "model_dir" not in args:
        raise UsageError("model_dir=DIR is required (the model directory, present on every node)")
    model_dir = Path(args.pop("model_dir"))
    replicas = int(args.pop("replicas", "1"))
    autoscale = parse_autoscale(args.pop("autoscale")) if "autoscale" in args else None
    given = args.pop("model_name", "")
    primary, *aliases = served_names([given] if given else None, model_dir.resolve().name)
    origins = parse_origins([args.pop("allowed_origins")] if "allowed_origins" in args else None, "allowed_origins")
    settings = Settings(model_dir, model_name=primary, aliases=tuple(aliases), threads=int(args.pop("threads", "1")),
                        allowed_origins=origins)
    for name, kind in (("precision", str), ("provider", str), ("kv_cache", str), ("slots", int), ("n_ctx", int),
                       ("max_queue", int), ("prefill_chunk", int), ("api_key", str), ("spin", str)):
        if name in args:
            setattr(settings, name, kind(args.pop(name)))
    if args:
        raise UsageError(f"unknown option(s) {', '.join(sorted(args))}; see gptport.serve.ray.ray_app.app")
    check(settings)
    return build_app(settings, replicas, autoscale)
