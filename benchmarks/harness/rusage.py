"""One command's wall time, CPU time and peak resident memory, measured from a small launcher process.

Why a launcher: on Linux a child's ru_maxrss starts at its parent's high-water mark (fork and vfork copy the
parent's memory map with its mark, and exec keeps the larger of the old map's mark and the new one's), so a
child of a benchmark process that once held 2 GB reports at least 2 GB, even for `python -c pass`. The
launcher, a fresh interpreter importing only the standard library, forks the command and reads its rusage
with os.wait4: the floor is the launcher's own few MB. ru_maxrss so read counts the command's children too
(the largest of them).

    python benchmarks/harness/rusage.py OUT.json COMMAND ARGS...     # what measure() runs
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GIB = 2**30


def launch(out: Path, args: list[str]) -> int:
    """Run `args` (its output where this process's goes), write its figures to `out` as JSON, return its exit."""
    start = time.perf_counter()
    child = subprocess.Popen(args)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    out.write_text(json.dumps({"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
                               "maxrss_kib": usage.ru_maxrss, "exit": code}), encoding="utf-8")
    return code


def measure(args: list[str], log: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `args` under the launcher, its output into `log`: wall and CPU seconds, peak resident set (GiB), exit
    status, and on a non-zero exit the log's last line as `error`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, open(log, "wb") as out:
        figures = Path(tmp) / "figures.json"
        subprocess.run([sys.executable, "-I", __file__, str(figures), *args], stdout=out, stderr=subprocess.STDOUT,
                       env=None if env is None else os.environ | env, check=False)
        got = json.loads(figures.read_text(encoding="utf-8")) if figures.is_file() else None
    if got is None:
        got = {"wall_s": 0.0, "cpu_s": 0.0, "maxrss_kib": 0, "exit": -1}
    fig: dict[str, Any] = {"wall_s": round(got["wall_s"], 1), "cpu_s": round(got["cpu_s"], 1),
                           "peak_rss_gib": round(got["maxrss_kib"] * 1024 / GIB, 3), "exit": got["exit"]}
    if got["exit"] != 0:
        lines = [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        fig["error"] = (lines[-1].strip() if lines else f"exit {got['exit']}")[:300]
    return fig


if __name__ == "__main__":
    sys.exit(launch(Path(sys.argv[1]), sys.argv[2:]))
