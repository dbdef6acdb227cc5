"""`gptport serve --ray`: the same API on Ray Serve, on a local Ray cluster (loopback only) that the command
starts itself. One cluster for the module (Ray's own start costs most of its time on 2 cores): 2 replicas x 1
thread; tests run in file order and the last one stops it with Ctrl-C. The options that need no cluster are in
test_serve_ray_options.py."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.ray_cluster import (
    Cluster,
    completed,
    needs_ray,
    ray_env,
    replica_metrics,
    replica_names,
    spread,
    stream,
)
from tests.support.serving import (
    Raw,
    Served,
    assert_error,
    cli_generate,
    free_port,
    listening_sockets,
    sample,
    session_processes,
    stop,
)

N_CTX = 2048  # long enough that a stream outlasts a kill on a busy 2-core runner (1024 ran out: "too late")
LONG = {"max_tokens": 10_000, "ignore_eos": True, "temperature": 0}
# A driver of its own connects to the cluster, looks up the actors of the replicas named on its first stdin line,
# and kills the one named on the second line when it comes (the kill is then one call: it lands while the load runs).
KILLER = """
import sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
print("ready", flush=True)
actors = {name: ray.get_actor("SERVE_REPLICA::" + name.split("@")[0], namespace="serve")
          for name in sys.stdin.readline().split()}
print("armed", flush=True)
ray.kill(actors[sys.stdin.readline().strip()], no_restart=False)
print("killed", time.monotonic(), flush=True)
"""


@pytest.fixture(scope="module")
def ray_model(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    """An initialised (untrained) tiny model with a long context, exported to fp32."""
    from gptport.export import exporter
    from tests.conftest import build_model_dir

    out = build_model_dir(tmp_path_factory.mktemp("ray") / "m", tokenizer_dir, corpus_file, steps=0, n_ctx=N_CTX,
                          d_model=128, n_layer=4)
    exporter.export(out, ["fp32"])
    return out


@pytest.fixture(scope="module")
def cluster(ray_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """`gptport serve --ray --replicas 2 --threads 1` in a session of its own; stopped (SIGINT, then SIGKILL of
    the session) if a test has not stopped it."""
    tmp = tmp_path_factory.mktemp("ray_serve")
    (tmp / "home").mkdir()
    ray_tmp = tempfile.mkdtemp(prefix="gptport-ray-")  # short: Ray's unix sockets live under it
    env = ray_env(tmp / "home", ray_tmp)
    port, log = free_port(), tmp / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gptport.cli.main", "serve", str(ray_model), "--ray",
                                 "--replicas", "2", "--threads", "1", "--slots", "16", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not re.search(r"Ray cluster (\S+)", log.read_text(errors="replace")):
            assert proc.poll() is None, f"gptport serve --ray exited with {proc.returncode}: {log.read_text()}"
            assert time.monotonic() < deadline, f"gptport serve --ray did not come up: {log.read_text()}"
            time.sleep(0.2)
        gcs = re.search(r"Ray cluster (\S+)", log.read_text())[1]  # type: ignore[index]
        served = Served(proc, f"http://127.0.0.1:{port}", log)
        assert served.get("/health") == (200, {"status": "ok"})
        yield Cluster(proc, served, gcs, env)
    finally:
        stop(proc, signal.SIGINT, 60, lambda: os.killpg(proc.pid, signal.SIGKILL))
        shutil.rmtree(ray_tmp, ignore_errors=True)


# ---- on the cluster (file order: the last test stops it) ------------------------------------------------------------


@needs_ray
@pytest.mark.slow
def test_ray_two_replicas_serve_32_streams(cluster: Cluster) -> None:
    """32 concurrent streams over 2 replicas x 1 thread: none fails, both take a share (x-gptport-replica), and each
    replica's /metrics counts exactly the requests whose header names it."""
    url = cluster.served.url
    names = replica_names(url)
    count = lambda text: sample(text, "gptport_requests_total", route="/v1/completions", status="200") or 0  # noqa: E731
    before = {n: count(replica_metrics(url, n)) for n in names}

    async def load() -> list[tuple[int, str | None, list[Any]]]:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as client:
            return await asyncio.gather(*(stream(client, url, {"prompt": f"ka {i}", "max_tokens": 24,
                                                                "temperature": 0.8, "seed": i}) for i in range(32)))

    results = asyncio.run(load())
    assert all(status == 200 and completed(ev) for status, _, ev in results), \
        [(s, ev[-2:]) for s, _, ev in results if s != 200 or not completed(ev)]
    served_by = [name for _, name, _ in results]
    assert set(served_by) == names, served_by  # both replicas took a share
    for n in names:
        text = replica_metrics(url, n)
        assert count(text) - before[n] == served_by.count(n), (n, served_by.count(n))
        assert sample(text, "gptport_requests_total", replica=n) and not sample(
            text, "gptport_requests_total", replica=next(iter(names - {n})))  # a replica counts only its own
        assert sample(text, "gptport_info", threads="1") == 1  # its onnxruntime session runs its one CPU


@needs_ray
@pytest.mark.slow
def test_ray_greedy_output_equals_generate(cluster: Cluster, ray_model: Path) -> None:
    url, n = cluster.served.url, 24
    for prompt in ("ka", "the quick"):
        want = cli_generate(ray_model, prompt, n)
        r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": n, "temperature": 0},
                       timeout=60)
        assert r.status_code == 200 and r.headers["x-gptport-replica"], r.text
        assert r.json()["choices"][0]["text"] == want
        status, name, events = asyncio.run(_one_stream(url, {"prompt": prompt, "max_tokens": n, "temperature": 0}))
        assert status == 200 and name and completed(events)
        assert "".join(c["text"] for e in events[:-1] for c in e["choices"]) == want


async def _one_stream(url: str, body: dict[str, Any]) -> tuple[int, str | None, list[Any]]:
    async with httpx.AsyncClient(timeout=60) as client:
        return await stream(client, url, body)


@needs_ray
@pytest.mark.slow
def test_ray_disconnect_cancels_on_the_replica(cluster: Cluster) -> None:
    """A client that leaves a stream after two chunks: the replica that served it frees the slot, having decoded
    fewer tokens than the request would have run to (it was cancelled, not finished)."""
    url = cluster.served.url

    def tokens(text: str) -> float:
        return sample(text, "gptport_time_per_output_token_seconds_count") or 0.0

    cut_short = []
    for _ in range(3):
        names = replica_names(url)
        before = {n: tokens(replica_metrics(url, n)) for n in names}
        raw = Raw(cluster.served, "/v1/completions", {"prompt": "ka", "stream": True, **LONG})
        status, headers = raw.head()
        assert status == 200
        raw.until(b"data: ", 2)
        raw.close()
        name = headers["x-gptport-replica"]
        deadline = time.monotonic() + 10
        while sample(text := replica_metrics(url, name), "gptport_slots_busy") != 0:
            assert time.monotonic() < deadline, f"{name} still holds a slot 10 s after the client left:\n{text}"
            time.sleep(0.05)
        cut_short.append(tokens(text) - before[name] < N_CTX - 2)
        if cut_short[-1]:
            break
    assert any(cut_short), "every stream whose client left ran to n_ctx on its replica"


@needs_ray
@pytest.mark.slow
def test_ray_replica_killed_mid_load(cluster: Cluster) -> None:
    """ray.kill on one replica's actor while 16 long requests run: Ray restarts it; the requests in flight on it end
    with OpenAI's error shape (a 5xx, or an error event in a stream that had started), the others complete, none
    hangs (a 60 s read timeout bounds each); every request sent once the new replica serves succeeds."""
    url = cluster.served.url
    killer = subprocess.Popen([sys.executable, "-c", KILLER, cluster.gcs], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**cluster.env,
                                                                                      "RAY_AUTH_MODE": "token"})
    try:
        assert killer.stdout is not None and killer.stdin is not None
        assert killer.stdout.readline().strip() == b"ready"
        old = replica_names(url)
        killer.stdin.write(" ".join(sorted(old)).encode() + b"\n")
        killer.stdin.flush()
        assert killer.stdout.readline().strip() == b"armed"

        async def run() -> tuple[list[Any], float, str]:
            async with httpx.AsyncClient(timeout=httpx.Timeout(60), limits=httpx.Limits(max_connections=64)) as c:
                loop = asyncio.get_running_loop()
                started: list[asyncio.Future[str]] = [loop.create_future() for _ in range(8)]
                streams = [asyncio.create_task(stream(c, url, {"prompt": f"ka {i}", **LONG}, started[i]))
                           for i in range(8)]
                plain = [asyncio.create_task(c.post(url + "/v1/completions", json={"prompt": f"ka {i}", **LONG}))
                         for i in range(8)]
                serving = await asyncio.wait_for(asyncio.gather(*started), 60)  # every stream decoding, there
                assert all(serving), f"a stream failed before the kill: {serving}"
                # the victim: a replica with streams in flight (Ray's router may have sent them all to one)
                victim = min(serving)
                killer.stdin.write(victim.encode() + b"\n")  # type: ignore[union-attr]
                killer.stdin.flush()  # type: ignore[union-attr]
                t_kill = float((await asyncio.to_thread(killer.stdout.readline)).split()[1])  # type: ignore[union-attr]
                outcomes = await asyncio.gather(*streams, *plain, return_exceptions=True)
                return list(outcomes), t_kill, victim

        outcomes, t_kill, victim = asyncio.run(run())
        failures: list[str] = []
        for o in outcomes:
            assert not isinstance(o, BaseException), repr(o)  # no hang (timeout) and no dropped connection
            if isinstance(o, httpx.Response):
                if o.status_code != 200:
                    assert o.status_code >= 500, o.text
                    err = assert_error(o.status_code, o.json(), o.status_code)
                    failures.append(f"{o.status_code} {err['code']}")
                continue
            status, name, events = o
            if completed(events):
                continue
            assert status == 200 and events[-1] == "[DONE]", events[-3:]
            err = events[-2]
            assert set(err) == {"error"} and err["error"]["type"] == "server_error", err
            failures.append(f"stream: error event {err['error']['code']}")
        assert failures, "no request in flight on the killed replica failed: the kill came too late"

        # degraded until the replacement serves: probe every 0.2 s (the survivor answers meanwhile)
        probes: list[int] = []
        deadline = time.monotonic() + 120
        while True:
            r = httpx.post(url + "/v1/completions", json={"prompt": "ka", "max_tokens": 2}, timeout=60)
            probes.append(r.status_code)
            new = {r.headers["x-gptport-replica"] for r in spread(url, "/health", bool, 1)} - old
            if new:
                break
            assert time.monotonic() < deadline, "no new replica served within 120 s of the kill"
            time.sleep(0.2)
        degraded = time.monotonic() - t_kill
        assert len(replica_names(url)) == 2
        after = [httpx.post(url + "/v1/completions", json={"prompt": f"ka {i}", "max_tokens": 4}, timeout=60)
                 for i in range(16)]
        assert all(r.status_code == 200 for r in after), [r.text for r in after if r.status_code != 200]
        assert all(r.headers["x-gptport-replica"] != victim for r in after)
        cluster.results["degraded_s"] = degraded
        print(f"\nreplica killed: {len(failures)}/16 in-flight requests failed ({sorted(set(failures))}); serving "
              f"degraded for {degraded:.1f} s until the new replica answered; probes meanwhile: "
              f"{probes.count(200)}/{len(probes)} ok")
    finally:
        if killer.stdin:
            killer.stdin.close()
        try:
            killer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            killer.kill()
            killer.wait()


@needs_ray
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc")
def test_ray_cluster_listens_on_loopback_only(cluster: Cluster) -> None:
    """Every socket that a process of the command's session (the driver, GCS, raylet, the agents, the Serve
    controller, proxy and replicas, a replica restarted after the kill above included) listens on, TCP or UDP,
    IPv4 or IPv6, is on a loopback address: Ray Serve's own replicas bind their gRPC server on [::] unless
    ray_cluster's worker setup hook moves it to the node's address."""
    listening = listening_sockets(set(session_processes(cluster.proc.pid)))
    assert len({pid for pid, *_ in listening}) >= 5, listening  # GCS, raylet, agents, proxy, replicas at least
    ports = {port for _, _, _, port in listening}
    http_port = int(cluster.served.url.rsplit(":", 1)[1])
    assert {http_port, int(cluster.gcs.rsplit(":", 1)[1])} <= ports, listening
    outside = [f"pid {pid} ({session_processes(cluster.proc.pid).get(pid, '?')[:80]}) {proto} {ip}:{port}"
               for pid, proto, ip, port in listening if not ip.is_loopback]
    assert not outside, "listening beyond the loopback address:\n" + "\n".join(outside)


@needs_ray
@pytest.mark.slow
def test_ray_ctrl_c_leaves_no_ray_processes(cluster: Cluster) -> None:
    """Ctrl-C (SIGINT) of `gptport serve --ray`: it exits 0 and no process of its session (raylet, GCS, workers,
    the Serve proxy and replicas) is left."""
    sid = cluster.proc.pid
    before = session_processes(sid)
    assert len(before) > 3, before  # the command, and the cluster it started
    cluster.proc.send_signal(signal.SIGINT)
    assert cluster.proc.wait(timeout=60) == 0, cluster.served.log.read_text()
    deadline = time.monotonic() + 20
    while (left := session_processes(sid)) or any(_alive(pid) for pid in before):
        assert time.monotonic() < deadline, f"left running: {left}"
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


@needs_ray
@pytest.mark.slow
def test_ray_replica_that_cannot_load_is_one_line(ray_model: Path, tmp_path: Path) -> None:
    """A graph that onnxruntime refuses (it passes the checks made before Ray starts): the replica fails with the
    loader's message, the command says it in one line naming the file, exits 1, and leaves no process."""
    bad = tmp_path / "bad"
    shutil.copytree(ray_model, bad)
    (bad / "model.static.onnx").write_bytes((ray_model / "model.static.onnx").read_bytes()[:1000])
    (tmp_path / "home").mkdir()
    ray_tmp = tempfile.mkdtemp(prefix="gptport-ray-")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "gptport.cli.main", "serve", str(bad), "--ray", "--port",
                                 str(free_port())], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=ray_env(tmp_path / "home", ray_tmp), start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=180)
        finally:
            stop(proc, signal.SIGINT, 30, lambda: os.killpg(proc.pid, signal.SIGKILL))
        assert proc.returncode == 1, out
        errors = [line for line in out.splitlines() if line.startswith("gptport: error:")]
        assert len(errors) == 1 and "model.static.onnx" in errors[0] and "Traceback" not in out, out
        deadline = time.monotonic() + 20
        while left := session_processes(proc.pid):
            assert time.monotonic() < deadline, f"left running: {left}"
            time.sleep(0.2)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
