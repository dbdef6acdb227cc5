"""`gptport export-web`: the bundle in a real headless Chromium (Debian's, driven by Playwright), with the
real onnxruntime-web and tokenizers.js from the lock file: greedy tokens equal `gptport generate`'s, the
JS tokenizer equals the Python one, a seed reproduces a sampled run, nothing is fetched from another
origin, no console error; the same on WebGPU where the browser offers an adapter (SwiftShader)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptport import tokenizer as bpe
from gptport.export.web import export_web
from gptport.export.web_graph import REFERENCE_PROMPTS, WEB_BATCH
from gptport.provenance import file_digest
from tests.support.chromium import CHROMIUM_ARGS, chromium_path
from tests.support.cli import assert_one_line_error, gptport
from tests.support.web_page import WEBGPU, Page, has_webgpu, opened

PROMPTS = ["To be or not", "ka to", "the ", "\n"]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("npm") is None, reason="no npm: export-web fetches onnxruntime-web "
                                 "with it (install Node.js)")]
needs_browser = pytest.mark.skipif(chromium_path() is None, reason="no Chromium: `apt-get install chromium` "
                                   "(Debian), or set GPTPORT_CHROMIUM")


@pytest.fixture(scope="session")
def bundle(trained_dir: Path, web_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("web") / "bundle"
    r = gptport("export-web", str(trained_dir), "--out", str(out))  # web_cache is in the environment
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="session")
def want(trained_dir: Path) -> dict[str, list[int]]:
    """`gptport generate`'s greedy tokens (its default graph on the CPU) for each prompt."""
    r = gptport("generate", str(trained_dir), *PROMPTS, "--max-new-tokens", "48", "--json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    return {p: row["token_ids"] for p, row in zip(PROMPTS, rows, strict=True)}


def test_bundle_files_manifest_and_layout(bundle: Path, trained_dir: Path) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    on_disk = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}
    assert on_disk == set(manifest["files"]) | {"manifest.json"}
    for name, entry in manifest["files"].items():
        assert (bundle / name).stat().st_size == entry["bytes"] and file_digest(bundle / name) == entry["sha256"]
    assert {"index.html", "gptport.js", "onnx/model.onnx", "tokenizer.json", "config.json"} <= on_disk
    assert any(n.endswith(".wasm") for n in on_disk) and any(n.startswith("runtime/tokenizers") for n in on_disk)
    assert manifest["versions"]["onnxruntime-web"] and manifest["tokenizer_sha256"] == bpe.load(trained_dir).sha256
    config = json.loads((bundle / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["n_layer"] == manifest["config"]["n_layer"]
    graph = onnx.load(str(bundle / "onnx/model.onnx"), load_external_data=False)
    assert graph.graph.input[0].type.tensor_type.shape.dim[0].dim_param == WEB_BATCH
    assert [r["prompt"] for r in manifest["reference"]] == list(REFERENCE_PROMPTS)
    assert not [p for p in bundle.parent.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_bundle_references_are_generates_tokens(bundle: Path, trained_dir: Path) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    prompts = [r["prompt"] for r in manifest["reference"]]
    out = gptport("generate", str(trained_dir), *[p or " " for p in prompts], "--max-new-tokens", "32", "--json")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    for ref, row, prompt in zip(manifest["reference"], rows, prompts, strict=True):
        if prompt:  # "" is the EOT start, which the CLI cannot be given
            assert ref["token_ids"] == row["token_ids"], prompt


def test_export_web_refuses_bad_input(trained_dir: Path, tokenizer_dir: Path, bundle: Path, tmp_path: Path) -> None:
    assert_one_line_error(gptport("export-web", str(tokenizer_dir), "--out", str(tmp_path / "w")), 1,
                           "model.onnx", "gptport export")
    assert_one_line_error(gptport("export-web", str(trained_dir), "--out", str(bundle)), 1, "--force")
    assert_one_line_error(gptport("export-web", str(trained_dir), "--out", str(trained_dir / "web")), 2,
                           "inside the model directory")
    assert_one_line_error(gptport("export-web", str(trained_dir), "--out", str(tmp_path / "w"), "--runtime-dir",
                                   str(tmp_path)), 1, "--runtime-dir", "onnxruntime-web")
    assert not (tmp_path / "w").exists()


def test_export_web_replaces_with_force(trained_dir: Path, bundle: Path, web_cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "again"
    export_web(trained_dir, out)
    (out / "stale.txt").write_text("from before")
    export_web(trained_dir, out, force=True)
    assert not (out / "stale.txt").exists() and (out / "manifest.json").is_file()


def _interruptible() -> None:
    """In the child: Ctrl-C's default, even where the test runner was started with SIGINT ignored (a
    background job of a non-interactive shell is), which Python would otherwise keep ignoring."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_serve_flag_sends_types_and_isolation_headers(bundle: Path, trained_dir: Path, web_cache: Path) -> None:
    """`export-web --serve` prints its URL and serves the bundle with COOP/COEP and wasm's MIME type."""
    proc = subprocess.Popen([sys.executable, "-m", "gptport", "export-web", str(trained_dir), "--out", str(bundle),
                             "--force", "--serve", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "XDG_CACHE_HOME": str(web_cache)},
                            preexec_fn=_interruptible)
    try:
        url = proc.stdout.readline().strip() if proc.stdout else ""
        assert url.startswith("http://127.0.0.1:"), (url, proc.stderr.read() if proc.poll() is not None else "")
        wasm = next(n for n in json.loads((bundle / "manifest.json").read_text())["files"] if n.endswith(".wasm"))
        with urllib.request.urlopen(url + wasm, timeout=30) as r:
            assert r.headers["Content-Type"] == "application/wasm"
            assert r.headers["Cross-Origin-Opener-Policy"] == "same-origin"
            assert r.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        with urllib.request.urlopen(url + "gptport.js", timeout=30) as r:
            assert r.headers["Content-Type"].startswith("text/javascript")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0


@pytest.fixture(scope="module")
def wasm_page(playwright: Any, bundle: Path) -> Iterator[Page]:
    yield from opened(playwright, bundle)


@needs_browser
def test_wasm_greedy_tokens_equal_generate(wasm_page: Page, want: dict[str, list[int]]) -> None:
    assert wasm_page.info["device"] == "wasm"
    for prompt, ids in want.items():
        got = wasm_page.generate(prompt, max_new_tokens=48)
        assert got["token_ids"] == ids, prompt
        assert got["decode_tok_s"] is None or got["decode_tok_s"] > 0
    wasm_page.check_clean()


@needs_browser
def test_wasm_page_checks_itself(wasm_page: Page) -> None:
    checks = wasm_page.page.evaluate("window.gptport.selfCheck()")
    assert checks and all(c["ok"] for c in checks), checks
    wasm_page.page.wait_for_function("document.getElementById('check').textContent.includes('match')")
    wasm_page.check_clean()


@needs_browser
def test_seeded_sampling_reproduces_and_seeds_differ(wasm_page: Page) -> None:
    opts = {"max_new_tokens": 40, "temperature": 0.9, "top_k": 40, "top_p": 0.95}
    a = wasm_page.generate("ka", seed=7, **opts)
    assert a["token_ids"] == wasm_page.generate("ka", seed=7, **opts)["token_ids"]
    others = [wasm_page.generate("ka", seed=s, **opts)["token_ids"] for s in (8, 9, 10)]
    assert any(o != a["token_ids"] for o in others)


@needs_browser
def test_stop_strings_and_length(wasm_page: Page, want: dict[str, list[int]], trained_dir: Path) -> None:
    tok = bpe.load(trained_dir)
    text = tok.decode(want["To be or not"])
    stop = text[len(text) // 2: len(text) // 2 + 2]
    got = wasm_page.generate("To be or not", max_new_tokens=48, stop=[stop])
    assert got["finish_reason"] == "stop" and stop not in got["text"] and text.startswith(got["text"])
    short = wasm_page.generate("To be or not", max_new_tokens=3)
    assert short["token_ids"] == want["To be or not"][:3] and short["finish_reason"] == "length"


@needs_browser
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=60) | st.sampled_from(["  double  spaces", "tab\tand\nnewline", "émoji 🚀 ünïcode",
                                                     "<|endoftext|>", "don't", "1234567"]))
def test_js_tokenizer_equals_python(wasm_page: Page, trained_dir: Path, text: str) -> None:
    tok = bpe.load(trained_dir)
    ids = wasm_page.page.evaluate("(t) => window.gptport.tokenize(t)", text)
    assert ids == tok.encode(text)
    assert wasm_page.page.evaluate("(i) => window.gptport.detokenize(i)", ids) == tok.decode(ids)


@needs_browser
def test_page_ui_streams_text(wasm_page: Page) -> None:
    from playwright.sync_api import expect

    page = wasm_page.page
    expect(page.locator("#generate")).to_be_enabled()
    page.fill("#prompt", "To be")
    page.fill("#temperature", "0")
    page.fill("#max_new_tokens", "12")
    page.click("#generate")
    expect(page.locator("#finish")).to_contain_text("finish:")
    assert page.locator("#output").text_content() and "tok/s" in (page.locator("#tps").text_content() or "")
    wasm_page.check_clean()


@needs_browser
def test_webgpu_greedy_tokens_equal_generate(playwright: Any, bundle: Path, want: dict[str, list[int]]) -> None:
    """WebGPU on Chromium's software Vulkan (SwiftShader): slow, but a GPU code path checked token for token."""
    args = CHROMIUM_ARGS + WEBGPU
    browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=args)
    try:
        if not has_webgpu(browser, bundle):
            pytest.skip("this Chromium offers no WebGPU adapter (SwiftShader Vulkan missing)")
        page = Page(browser, bundle, device="webgpu")
        try:
            assert page.info["device"] == "webgpu"
            for prompt in PROMPTS[:2]:
                assert page.generate(prompt, max_new_tokens=24)["token_ids"] == want[prompt][:24], prompt
            page.check_clean()
        finally:
            page.close()
    finally:
        browser.close()


def test_providers_lists_the_browser_targets(web_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gptport providers` names wasm and webgpu with whether a bundle can be built here, and why not."""
    from gptport.export import web

    r = gptport("providers")
    assert r.returncode == 0, r.stderr
    assert "gptport export-web" in r.stderr and "wasm" in r.stderr and "webgpu" in r.stderr
    monkeypatch.setattr(web, "cache_root", lambda: web_cache / "empty")
    monkeypatch.setattr(web.shutil, "which", lambda name: None)
    ok, why = web.can_bundle()
    assert not ok and "Node.js" in why
