"""`gptport serve --ray`: start a local Ray cluster (loopback, no dashboard) or join one, deploy the app of
ray_app.py on Ray Serve, and on SIGTERM or Ctrl-C take down what was started here: the whole cluster
when it was started here, else only the application. No torch here."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gptport.errors import GptportError, UsageError

if TYPE_CHECKING:
    from gptport.serve.settings import Settings

PROXY_CALLBACK = "gptport.serve.ray.proxy_errors:proxy_middlewares"
INSTALL = "--ray needs Ray Serve, which is not installed: pip install 'gptport[ray]' (or pip install 'ray[serve]')"


def _import_ray() -> None:
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError:
        raise UsageError(INSTALL) from None


def run(settings: Settings, host: str, port: int, say: Callable[[str], None], replicas: int = 1,
        autoscale: str | None = None, address: str | None = None) -> int:
    """Deploy and serve until SIGTERM/SIGINT; the exit code."""
    # Set before Ray is imported (it reads them then), and inherited by the processes of a cluster started
    # here (a joined cluster must have been started with them, see docs/guide/ray-serve.md): the proxy turns its own
    # errors (a replica died, a timeout) into OpenAI's error shape; and a cluster of one machine takes the
    # loopback address as its node's, so that its servers listen there only.
    os.environ.setdefault("RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH", PROXY_CALLBACK)
    if address is None:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    _import_ray()
    from gptport.serve.http.server import bind, check
    from gptport.serve.ray import ray_app

    bounds = ray_app.parse_autoscale(autoscale) if autoscale else None
    ray_app.deployment_options(settings, replicas, bounds)  # refuses bad numbers before anything starts
    check(settings)
    if address is None:
        bind(host, port).close()  # a taken port is a one-line error before a cluster starts
    import ray
    from ray import serve

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    t0 = time.perf_counter()
    started_here = address is None
    try:
        if started_here:
            ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                     configure_logging=False, runtime_env={"worker_process_setup_hook": LOOPBACK_HOOK})
        else:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING, configure_logging=False)
        logging.getLogger("ray.serve").setLevel(logging.WARNING)  # the driver's own notes of what it deploys
        try:
            serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": "WARNING"})
            try:
                serve.run(ray_app.build_app(settings, replicas, bounds), name=ray_app.APP_NAME, route_prefix="/",
                          blocking=False)
            except RuntimeError as e:  # Ray's message names no cause; the deployment's status does
                app = serve.status().applications.get(ray_app.APP_NAME)
                detail = "\n".join(d.message for d in app.deployments.values()) if app is not None else ""
                raise RuntimeError(f"{e}\n{detail}") from None
            cluster = ray.get_runtime_context().gcs_address
            scale = f"autoscaling {bounds[0]}-{bounds[1]} replicas" if bounds else f"{replicas} replica(s)"
            say(f"gptport serve: http://{host}:{port} · Ray Serve · {scale} × {max(1, settings.threads)} thread(s), "
                f"{settings.slots} slots each · model {settings.model_name!r} · Ray cluster {cluster} "
                f"({'started here' if started_here else 'joined'}) · ready in {time.perf_counter() - t0:.1f} s")
            while not stop.wait(0.5):
                pass
            say("gptport serve: stopping")
        finally:
            if started_here:
                serve.shutdown()
            else:
                serve.delete(ray_app.APP_NAME)
    except GptportError:
        raise
    except Exception as e:  # noqa: BLE001 - Ray's failures (a replica that cannot load, say) end in one line
        say(f"gptport: error: Ray Serve: {_why(e)}")
        return 1
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


LOOPBACK_HOOK = f"{__name__}.grpc_on_the_node_address"


def grpc_on_the_node_address() -> None:
    """Ray's worker_process_setup_hook in the cluster `run` starts (this module is imported in every worker of it,
    so it imports nothing heavy at the top). Ray Serve 2.60 starts each replica's gRPC server for calls between
    deployments on "[::]:0", every interface, whatever address the node has (serve/_private/replica.py,
    `_on_initialized`); every other server of the cluster listens on the node's address, the loopback one
    here. This makes Ray's helper that adds a server's port put such a wildcard address on the node's instead,
    before the replica's module takes its own reference to it. Ray's other servers pass it concrete addresses."""
    import ray
    from ray._common import tls_utils

    add = tls_utils.add_port_to_grpc_server
    if add.__module__ == __name__:  # this process has it already: the helper is on_node below
        return

    def on_node(server: Any, address: str) -> Any:
        host, sep, port = address.rpartition(":")
        if sep and host in ("[::]", "0.0.0.0", ""):
            ip = ray.util.get_node_ip_address()
            address = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
        return add(server, address)

    tls_utils.add_port_to_grpc_server = on_node
    replica = sys.modules.get("ray.serve._private.replica")  # imported already: its own reference too
    if replica is not None:
        replica.add_port_to_grpc_server = on_node  # type: ignore[attr-defined]


def _why(e: Exception) -> str:
    """One line: the replica's own error when Ray's names one (a model that did not load), else Ray's."""
    text = str(e)
    for line in reversed(text.splitlines()):
        if "RuntimeError: " in line:
            return line.split("RuntimeError: ", 1)[1].strip()
    return f"{type(e).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}"
