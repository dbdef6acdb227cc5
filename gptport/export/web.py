"""`gptport export-web`: a static bundle that runs the model in a browser with nothing else — the page,
its ES module, the fp32 graph, the tokenizer, onnxruntime-web and tokenizers.js (from the npm packages
pinned by webpage/package-lock.json, fetched once into a cache by `npm ci`), and a manifest with every
file's sha256 and reference greedy tokens that the page checks itself against. The layout also loads in
transformers.js: config.json of model_type gpt2, onnx/model.onnx with the batch dimension `batch_size`.
No torch: the graph and the reference tokens come from the runtime."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptport import __version__, atomic, contract, specials
from gptport import tokenizer as bpe
from gptport.config import ModelConfig, read_json
from gptport.errors import ArtifactError, InputError, UsageError
from gptport.export.hf import gpt2_config
from gptport.page_style import styled
from gptport.provenance import file_digest
from gptport.runtime.onnx_engine import OnnxModel

ASSETS = Path(__file__).with_name("webpage")  # index.html, gptport.js, package.json, package-lock.json
PAGE_FILES = ("index.html", "gptport.js")
GRAPH = "onnx/model.onnx"  # where transformers.js looks for the decoder
WEB_BATCH = "batch_size"  # transformers.js sizes its empty cache by a dimension of this name
# What the bundle needs of the npm packages: onnxruntime-web's WebAssembly build (the wasm device) and its
# WebGPU build (the webgpu device; its asyncify binary runs the wasm provider ~2x slower, so both ship),
# and tokenizers.js's browser module.
RUNTIME_FILES = {
    "onnxruntime-web/dist/ort.wasm.min.mjs": "runtime/ort.wasm.min.mjs",
    "onnxruntime-web/dist/ort-wasm-simd-threaded.mjs": "runtime/ort-wasm-simd-threaded.mjs",
    "onnxruntime-web/dist/ort-wasm-simd-threaded.wasm": "runtime/ort-wasm-simd-threaded.wasm",
    "onnxruntime-web/dist/ort.webgpu.min.mjs": "runtime/ort.webgpu.min.mjs",
    "onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.mjs": "runtime/ort-wasm-simd-threaded.asyncify.mjs",
    "onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.wasm": "runtime/ort-wasm-simd-threaded.asyncify.wasm",
    "@huggingface/tokenizers/dist/tokenizers.min.mjs": "runtime/tokenizers.min.mjs",
}
REFERENCE_PROMPTS = ("To be or not", "The ", "")  # "" starts from <|endoftext|>, as generate does
REFERENCE_TOKENS = 32


@dataclass
class WebBundle:
    """What export-web wrote."""

    out: Path
    files: dict[str, int] = field(default_factory=dict)  # relative path -> bytes
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())


def cache_root() -> Path:
    """Where the npm packages of the lock file are kept between exports ($XDG_CACHE_HOME/gptport)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gptport"


def lock_digest() -> str:
    return hashlib.sha256((ASSETS / "package-lock.json").read_bytes()).hexdigest()


def npm_modules(runtime_dir: Path | None = None, say: Callable[[str], None] = lambda m: None) -> Path:
    """The node_modules folder holding the lock file's packages: `runtime_dir` when given (checked), else a
    cache folder per lock digest, filled once by `npm ci --ignore-scripts` (a temporary folder renamed into
    place, so an interrupted install is never taken for a finished one)."""
    if runtime_dir is not None:
        modules = runtime_dir / "node_modules" if (runtime_dir / "node_modules").is_dir() else runtime_dir
        missing = [src for src in RUNTIME_FILES if not (modules / src).is_file()]
        if missing:
            raise InputError(f"--runtime-dir {runtime_dir}: lacks {missing[0]} (install webpage/package-lock.json "
                             "there with `npm ci --ignore-scripts`)")
        return modules
    root = cache_root() / f"web-runtime-{lock_digest()[:16]}"
    if (root / "node_modules").is_dir():
        return root / "node_modules"
    npm = shutil.which("npm")
    if npm is None:
        raise UsageError("export-web needs npm (Node.js) once, to fetch onnxruntime-web and tokenizers.js from the "
                         "lock file; install Node.js, or pass --runtime-dir with those packages installed")
    root.parent.mkdir(parents=True, exist_ok=True)
    say("fetching onnxruntime-web and tokenizers.js (npm ci, once per lock file)")
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=".npm-") as tmp:
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(ASSETS / name, Path(tmp) / name)
        r = subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
                           cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0:
            last = (r.stderr.strip() or r.stdout.strip() or "no output").splitlines()[-1]
            raise UsageError(f"export-web: `npm ci` of the web runtime failed: {last}")
        try:
            os.rename(tmp, root)
        except OSError:  # another export filled the cache meanwhile
            if not (root / "node_modules").is_dir():
                raise
        Path(tmp).mkdir(exist_ok=True)  # TemporaryDirectory removes what it made
    return root / "node_modules"


def can_bundle() -> tuple[bool, str]:
    """Whether export-web can write a bundle here (npm, or the lock file's packages already cached), and why."""
    cached = cache_root() / f"web-runtime-{lock_digest()[:16]}" / "node_modules"
    if cached.is_dir():
        versions = ", ".join(f"{k} {v}" for k, v in package_versions(cached).items())
        return True, f"runtime cached ({versions})"
    if shutil.which("npm"):
        return True, "npm found: the first export-web fetches onnxruntime-web and tokenizers.js from the lock file"
    return False, "no npm and no cached runtime: install Node.js once, or pass --runtime-dir to export-web"


def package_versions(modules: Path) -> dict[str, str]:
    return {name: read_json(modules / name / "package.json")["version"]
            for name in ("onnxruntime-web", "@huggingface/tokenizers")}


def web_graph(src: Path, dst: Path) -> None:
    """The fp32 contract graph with its batch dimension renamed for transformers.js (nothing else changes)."""
    import onnx

    model = onnx.load(str(src))
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == contract.BATCH:
                dim.dim_param = WEB_BATCH
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst))


def reference_tokens(model_dir: Path) -> tuple[list[dict[str, Any]], OnnxModel, bpe.BPETokenizer]:
    """Greedy tokens of the contract graph on onnxruntime's CPU provider — what the page must reproduce —
    with the graph (its recorded config sizes the page's cache) and the tokenizer, both checked."""
    from gptport.runtime.generate import generate
    from gptport.runtime.loader import open_model
    from gptport.runtime.sampling import Sampling

    opened = open_model(model_dir, cache=contract.CACHE_CONCAT)
    tok, out, cfg = opened.tok, [], opened.engine.config
    refuse_llama(cfg, model_dir / contract.onnx_file("fp32", contract.CACHE_CONCAT))
    for prompt in REFERENCE_PROMPTS:
        ids = specials.prompt_ids(cfg, tok, prompt)
        row = generate(opened.engine, [ids], REFERENCE_TOKENS, Sampling(), specials.end_ids(cfg, tok))[0]
        out.append({"prompt": prompt, "prompt_ids": ids, "token_ids": row.new_ids})
    return out, opened.engine, tok


def refuse_llama(cfg: ModelConfig, graph: Path) -> None:
    """A UsageError naming what the page and transformers.js's gpt2 config lack for this model: the Llama
    family's layers (the page's cache has n_head heads), a begin token, end tokens besides <|endoftext|>."""
    lacking = [*cfg.llama_choices(), *(["a begin token (add_bos)"] if cfg.add_bos else []),
               *([f"end tokens {list(cfg.eos_ids)}"] if cfg.eos_ids else [])]
    if lacking:
        raise UsageError(f"{graph}: export-web writes GPT-2-shaped models only; this one has {', '.join(lacking)}")


def export_web(model_dir: Path, out: Path, force: bool = False, runtime_dir: Path | None = None,
               say: Callable[[str], None] = lambda m: None) -> WebBundle:
    """Write the bundle to `out` (staged beside it and renamed into place)."""
    graph = model_dir / contract.onnx_file("fp32", contract.CACHE_CONCAT)
    if not graph.is_file():
        raise ArtifactError(f"{graph}: missing; run `gptport export {model_dir}` first")
    if out.exists() and not force:
        raise InputError(f"{out}: exists; pass --force to replace it")
    if out.resolve() == model_dir.resolve() or model_dir.resolve() in out.resolve().parents:
        raise UsageError(f"--out {out}: inside the model directory; choose a folder of its own")
    say("greedy reference tokens (onnxruntime, cpu)")
    references, engine, tok = reference_tokens(model_dir)
    cfg = engine.config
    modules = npm_modules(runtime_dir, say)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        say("writing the bundle")
        for name in PAGE_FILES:
            text = (ASSETS / name).read_text(encoding="utf-8")
            (stage / name).write_text(styled(text) if name.endswith(".html") else text, encoding="utf-8")
        web_graph(graph, stage / GRAPH)
        for name in (bpe.TOKENIZER_FILE, bpe.HF_CONFIG_FILE):
            shutil.copyfile(model_dir / name, stage / name)
        (stage / "config.json").write_text(json.dumps(gpt2_config(cfg, tok.eot_id), indent=2) + "\n")
        generation = {"bos_token_id": tok.eot_id, "eos_token_id": tok.eot_id, "max_length": cfg.n_ctx}
        (stage / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        for src, dst in RUNTIME_FILES.items():
            (stage / dst).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(modules / src, stage / dst)
        files = {p.relative_to(stage).as_posix(): p.stat().st_size for p in sorted(stage.rglob("*")) if p.is_file()}
        manifest = {
            "format": "gptport-web/1", "gptport": __version__, "model": model_dir.name,
            "graph": GRAPH, "source_graph_sha256": file_digest(graph), "tokenizer_sha256": tok.sha256,
            "config": {"n_layer": cfg.n_layer, "n_head": cfg.n_head, "head_dim": cfg.head_dim, "n_ctx": cfg.n_ctx,
                       "vocab_size": cfg.vocab_size, "eot_id": tok.eot_id},
            "versions": package_versions(modules), "reference": references,
            "files": {name: {"bytes": size, "sha256": file_digest(stage / name)} for name, size in files.items()},
        }
        (stage / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        files["manifest.json"] = (stage / "manifest.json").stat().st_size
        atomic.replace_dir(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return WebBundle(out, files, manifest)

