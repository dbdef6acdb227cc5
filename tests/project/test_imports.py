"""The torch boundary is a folder: every module outside gptport/training and gptport/export imports
without loading torch, and the shared base without onnxruntime either; no import runs upward between
the layers (tests/support/layout.py). Modules are found on disk, so a new one is checked the day it lands."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support import layout

FRAMEWORKS = ("torch", "onnxruntime")


def loaded_after_import(modules: list[str]) -> dict[str, list[str]]:
    """For each module, imported alone in a fresh interpreter: which of torch and onnxruntime it loaded
    (or why the import failed)."""
    probe = ("import importlib, sys; importlib.import_module(sys.argv[1]); "
             f"print([m for m in {FRAMEWORKS!r} if m in sys.modules])")

    def one(module: str) -> list[str]:
        r = subprocess.run([sys.executable, "-c", probe, module], capture_output=True, text=True)
        return ast.literal_eval(r.stdout.strip()) if r.returncode == 0 else [f"import failed: {r.stderr[-300:]}"]

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(modules, pool.map(one, modules), strict=True))


def torch_free_modules() -> list[str]:
    # ray_app needs the ray extra (tested below where Ray is installed); importing __main__ runs the CLI
    # (its one import, gptport.cli.main, is probed)
    skip = {"gptport.serve.ray.ray_app", "gptport.__main__"}
    return [m for m in layout.modules() if layout.layer(m) not in layout.TORCH_SIDE and m not in skip]


@pytest.fixture(scope="module")
def loaded() -> dict[str, list[str]]:
    return loaded_after_import(torch_free_modules())


def test_the_layers_cover_the_package() -> None:
    """Each side of the boundary holds what it should: the check below walks real modules."""
    found = {layout.layer(m) for m in layout.modules()}
    assert found == set(layout.BELOW), found
    assert {"gptport.runtime.onnx_engine", "gptport.serve.engine.scheduler", "gptport.cli.generate_cmd",
            "gptport.tokenizer"} <= set(torch_free_modules())
    assert "gptport.training.model" not in torch_free_modules()


def test_torch_free_modules_load_no_torch(loaded: dict[str, list[str]]) -> None:
    """Every module outside training/ and export/ (the CLI's included: commands import their stage
    lazily) imports in a fresh interpreter without loading torch."""
    bad = {m: found for m, found in loaded.items() if "torch" in found or any("failed" in f for f in found)}
    assert not bad, f"torch loaded (or the import failed) by: {bad}"


def test_base_loads_no_framework(loaded: dict[str, list[str]]) -> None:
    """`import gptport`, the shared base and the CLI's entry (`gptport --help` stays quick) load neither
    torch nor onnxruntime."""
    base = [m for m in loaded if layout.layer(m) == "base"]
    assert "gptport" in base and len(base) >= 10
    bad = {m: loaded[m] for m in [*base, "gptport.cli.main"] if loaded[m]}
    assert not bad, f"a framework loaded by the shared base: {bad}"


def test_no_import_runs_upward() -> None:
    """A module imports its own layer and those below it (tests/support/layout.py's BELOW), lazy imports included."""
    bad = [f"{u.module}:{u.line} imports {u.target} ({layout.layer(u.module)} -> {layout.layer(u.target)})"
           for m in layout.modules() for u in layout.upward(m)]
    assert not bad, "imports that run upward or sideways between the layers:\n" + "\n".join(bad)


def test_the_rules_keep_each_layer_in_its_place() -> None:
    """The rules themselves, over the modules on disk: the batching engine importing any module of serve/
    (the request side, the model host, the HTTP app) runs upward, as do the request side importing the
    model host or the HTTP app, the model host importing the HTTP app, serve/ importing the Ray deployment
    and the load tools importing anything of the server; the Ray deployment may import the HTTP app, the
    HTTP app the model host, the request side and the engine, and the request side the engine."""
    by_layer: dict[str, list[str]] = {}
    for m in layout.modules():
        by_layer.setdefault(layout.layer(m), []).append(m)
    engine, api, responses, host, http, ray, load = (by_layer[name] for name in (
        "serve/engine", "serve/api", "serve/api/responses", "serve", "serve/http", "serve/ray", "load"))
    assert "gptport.serve.http.app" in http and "gptport.serve.engine.scheduler" in engine
    assert "gptport.serve.api.protocol" in api and "gptport.serve.model_host" in host

    def crossing(sources: list[str], targets: list[str]) -> set[bool]:
        return {layout.crosses(layout.Import(s, t, 1)) for s in sources for t in targets}

    assert crossing(engine, [*api, *responses, *host, *http]) == {True}
    assert crossing(api, [*responses, *host, *http]) == {True}
    assert crossing(host, [*responses, *http]) == {True}
    assert crossing([*api, *host, *http], ray) == {True}
    assert crossing(load, [*engine, *api, *host, *http, *ray]) == {True}
    assert crossing(ray, [*http, *host, *api, *engine]) == {False}
    assert crossing(http, [*host, *responses, *api, *engine]) == {False}
    assert crossing([*api, *responses], engine) == {False}


def test_no_import_cycle() -> None:
    """No gptport module reaches itself through the modules it imports (lazy imports and those under
    TYPE_CHECKING included: a circle a function-level import hides is still one concern split in two)."""
    graph = {m: {i.target for i in layout.imports(m)} - {m} for m in layout.modules()}
    cycles = layout.cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join([*c, c[0]]) for c in cycles)


def test_ray_app_loads_no_torch() -> None:
    """The Ray Serve application (Ray imported with it) keeps serving torch-free."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray Serve is not installed: pip install -e '.[ray]'")
    assert "torch" not in loaded_after_import(["gptport.serve.ray.ray_app"])["gptport.serve.ray.ray_app"]


def test_serve_answers_with_torch_unimportable(tmp_path: Path, trained_dir: Path) -> None:
    """`gptport serve` loads, answers a completion and a stream, with `import torch` made to fail."""
    from tests.support.serving import serve

    blocker = tmp_path / "blocker" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text('raise ImportError("torch is blocked in this test")\n')
    env = {"PYTHONPATH": os.pathsep.join([str(blocker.parent), os.environ.get("PYTHONPATH", "")])}
    with serve(trained_dir, tmp_path / "serve.log", env=env) as served:
        status, body = served.post("/v1/completions", {"prompt": "ka to", "max_tokens": 5, "temperature": 0})
        assert status == 200 and body["usage"]["completion_tokens"] >= 1
        status, text = served.post("/v1/completions", {"prompt": "ka", "max_tokens": 3, "stream": True})
        assert status == 200 and text.rstrip().endswith("data: [DONE]")
    assert "blocked" not in (tmp_path / "serve.log").read_text()
