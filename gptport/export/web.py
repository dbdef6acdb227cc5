"""`gptport export-web`: a static bundle that runs the model in a browser with nothing else — the page,
its ES modules, one contract graph (fp32, or a quantized variant that passed export's accuracy gate:
web_graph.py), the tokenizer, onnxruntime-web and tokenizers.js (from the npm packages pinned by
webpage/package-lock.json, fetched once into a cache by `npm ci`), and a manifest with every file's sha256,
the graph it ships and reference greedy tokens that the page checks itself against. The layout is
transformers.js's: config.json, onnx/model.onnx (fp32), model_quantized.onnx (int8) or model_q4.onnx (int4)
with the batch dimension `batch_size`, and a large model's weights in external data beside the graph
(model.onnx_data: web_graph.py). No torch: the graph and the reference tokens come from the runtime."""

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
from gptport.errors import InputError, UsageError
from gptport.export import web_graph
from gptport.export.hf import gpt2_config, mismatches
from gptport.export.web_graph import GRAPHS
from gptport.page_style import styled
from gptport.provenance import file_digest

ASSETS = Path(__file__).with_name("webpage")  # the page's files, package.json, package-lock.json
PAGE_FILES = ("index.html", "gptport.js", "tokenizer.js")
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


def page_config(cfg: ModelConfig, tok: bpe.BPETokenizer) -> dict[str, Any]:
    """What the page needs of the model: the cache's shape (n_kv_head heads of head_dim), the context, the
    begin token it puts first (add_bos) and the tokens that end a sequence (end_ids, any of them)."""
    return {"n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_kv_head": cfg.n_kv_head, "head_dim": cfg.head_dim,
            "n_ctx": cfg.n_ctx, "vocab_size": cfg.vocab_size, "eot_id": tok.eot_id, "bos_id": cfg.bos_id,
            "add_bos": bool(specials.start_ids(cfg)), "end_ids": sorted(specials.end_ids(cfg, tok))}


def hf_config(cfg: ModelConfig, tok: bpe.BPETokenizer) -> dict[str, Any]:
    """config.json: a GPT-2's GPT2Config; for other layers, what transformers.js reads of a Llama-family model
    to run its graph (the cache's shape, the special tokens), in LlamaConfig's names, not a checkpoint's config."""
    if not mismatches(cfg):
        return gpt2_config(cfg, tok.eot_id)
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_kv_head, "head_dim": cfg.head_dim,
            "max_position_embeddings": cfg.n_ctx, "rms_norm_eps": cfg.ln_eps, "rope_theta": cfg.rope_theta,
            "tie_word_embeddings": cfg.tie_embeddings, "use_cache": True,
            "bos_token_id": cfg.bos_id, "eos_token_id": sorted(specials.end_ids(cfg, tok))}


def export_web(model_dir: Path, out: Path, force: bool = False, runtime_dir: Path | None = None,
               say: Callable[[str], None] = lambda m: None, precision: str = "auto") -> WebBundle:
    """Write the bundle to `out` (staged beside it and renamed into place), shipping the contract graph of
    `precision` (choose_precision)."""
    if out.exists() and not force:
        raise InputError(f"{out}: exists; pass --force to replace it")
    if out.resolve() == model_dir.resolve() or model_dir.resolve() in out.resolve().parents:
        raise UsageError(f"--out {out}: inside the model directory; choose a folder of its own")
    precision, graph, meta = web_graph.choose(model_dir, precision)
    if json.loads(meta.get(contract.META_CONFIG, "{}")).get("rope_scaling") == "longrope":
        raise UsageError(f"{model_dir}: LongRoPE: the page's decoding loop does not recompute its cache where the "
                         "long factors begin (generate does); no web bundle yet")
    tok = web_graph.checked_tokenizer(model_dir, graph, meta)
    modules = npm_modules(runtime_dir, say)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        say(f"writing the bundle ({graph.name})")
        for name in PAGE_FILES:
            text = (ASSETS / name).read_text(encoding="utf-8")
            (stage / name).write_text(styled(text) if name.endswith(".html") else text, encoding="utf-8")
        nbits, data = web_graph.write(graph, stage / GRAPHS[precision])
        say(f"greedy reference tokens of {GRAPHS[precision]} (onnxruntime, cpu)")
        references, engine = web_graph.reference_tokens(stage / GRAPHS[precision], tok)
        cfg = engine.config
        del engine  # its session holds the weights: not kept while the bundle is hashed
        for name in (bpe.TOKENIZER_FILE, bpe.HF_CONFIG_FILE):
            shutil.copyfile(model_dir / name, stage / name)
        (stage / "config.json").write_text(json.dumps(hf_config(cfg, tok), indent=2) + "\n")
        ends = sorted(specials.end_ids(cfg, tok))
        generation = {"bos_token_id": tok.eot_id if cfg.bos_id is None else cfg.bos_id,
                      "eos_token_id": ends[0] if len(ends) == 1 else ends, "max_length": cfg.n_ctx}
        (stage / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        for src, dst in RUNTIME_FILES.items():
            (stage / dst).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(modules / src, stage / dst)
        files = {p.relative_to(stage).as_posix(): p.stat().st_size for p in sorted(stage.rglob("*")) if p.is_file()}
        manifest = {
            "format": "gptport-web/1", "gptport": __version__, "model": model_dir.name,
            "graph": GRAPHS[precision], "precision": precision, "gated": True, "source_graph": graph.name,
            # a variant's quantized MatMuls, set to float compute (web_graph.py says why)
            **({"matmulnbits": {"nodes": nbits, "accuracy_level": web_graph.FLOAT_COMPUTE}} if nbits else {}),
            # the graph's external data (a model past 1 GiB), passed to onnxruntime-web's externalData by the page
            **({"external_data": [data.relative_to(stage).as_posix()]} if data is not None else {}),
            "source_graph_sha256": file_digest(graph), "tokenizer_sha256": tok.sha256,
            "config": page_config(cfg, tok), "versions": package_versions(modules), "reference": references,
            "files": {name: {"bytes": size, "sha256": file_digest(stage / name)} for name, size in files.items()},
        }
        (stage / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        files["manifest.json"] = (stage / "manifest.json").stat().st_size
        atomic.replace_dir(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return WebBundle(out, files, manifest)
