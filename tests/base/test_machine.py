"""machine.describe: what every results file records about the CPU that ran it; machine.slug: the
results file name it gives."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from gptport.machine import describe, slug, vector_class

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma f16c bmi2 avx512f avx512_vnni avx_vnni amx_tile amx_int8 sha_ni

processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2
"""


def test_describe_reads_the_first_cpu_and_its_vector_extensions(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    got = describe(info)
    assert got["cpu"] == "AMD EPYC 7B13"
    assert got["isa"] == ["amx_int8", "amx_tile", "avx2", "avx512_vnni", "avx512f", "avx_vnni", "f16c", "fma"]
    assert got["cores"] == os.cpu_count() and got["platform"] == platform.platform()


def test_describe_without_cpuinfo_names_what_platform_knows(tmp_path: Path) -> None:
    got = describe(tmp_path / "missing")
    assert got["cpu"] == (platform.processor() or platform.machine()) and got["isa"] == []


def test_slug_names_a_results_file_per_machine_class() -> None:
    assert slug("AMD EPYC") == "amd-epyc"
    assert slug("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz") == "intel-r-xeon-r-platinum-8481c-cpu-2-70ghz"
    assert slug("  ") == "unknown-cpu"


def test_vector_class_tells_apart_machines_of_one_name() -> None:
    assert vector_class(["avx2", "f16c", "fma"]) == "avx2"
    assert vector_class(["avx2", "avx512_vnni", "avx512f", "fma"]) == "avx512"
    assert vector_class(["amx_bf16", "amx_tile", "avx2", "avx512f"]) == "amx"
    assert vector_class([]) == "novec"
