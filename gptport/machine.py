"""What ran a measurement: the CPU's model name, its logical cores and the vector extensions that decide
which kernels run (AVX2, AVX-512, AMX, VNNI, FMA, F16C). Every results file records them, because the
machine class changes from run to run and int8 and float kernels rank differently across them. No torch."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path
from typing import Any

ISA = re.compile(r"^(avx2|avx512\w*|amx\w*|avx_vnni\w*|fma|f16c)$")


def describe(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """{"cpu": model name, "cores": logical cores, "isa": sorted vector-extension flags, "platform"}; where
    there is no /proc/cpuinfo (macOS, Windows) the cpu is platform's guess and the isa list is empty."""
    name, flags = "", []
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not name:
            name = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = sorted(f for f in value.split() if ISA.match(f))
    return {"cpu": name or platform.processor() or platform.machine(), "cores": os.cpu_count(), "isa": flags,
            "platform": platform.platform()}


def vector_class(isa: list[str]) -> str:
    """The widest vector extension among describe()'s isa flags, the part of a machine class a CPU's model
    name does not tell (one "AMD EPYC" name covers AVX2-only and AVX-512 machines): amx, avx512 or avx2."""
    for tag in ("amx", "avx512", "avx2"):
        if any(f.startswith(tag) for f in isa):
            return tag
    return "novec"


def slug(cpu: str) -> str:
    """The CPU's name as a file-name part: "AMD EPYC" -> "amd-epyc" (results files are per machine class)."""
    return re.sub(r"[^a-z0-9]+", "-", cpu.lower()).strip("-") or "unknown-cpu"
