"""The safetensors readers fuzzed: seeded mutations of a small valid file (tests/support/safetensors_fuzz.py: the
header length set to extremes, the header's JSON rewritten — offsets, shapes and dtypes changed or swapped, a key
twice, an array, deep nesting, bytes that are no UTF-8 — bytes flipped, the file cut short or grown), each read by
the numpy reader (gptport/safetensors_file.py: export-hf's and export-gguf's read) and by import-hf's (headers,
then each tensor by its offsets). Every case must be read or refused in one line naming the file; anything else
is a crash, counted with its first example. Also counted: cases the header check passed that the safetensors
library then refused (the check looser than the library), and the peak RSS of the run and the slowest case.

    python -m benchmarks.stress.fuzz_safetensors [--cases 10000] [--seed 0]
"""

from __future__ import annotations

import random
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.run import Run
from gptport import safetensors_file
from gptport.errors import GptportError
from tests.support import safetensors_fuzz


def _import_hf(path: Path) -> object:
    from gptport.export.hf_files import read_weights

    return read_weights(path.parent)


READERS: dict[str, Callable[[Path], object]] = {"numpy": safetensors_file.read_numpy, "import-hf": _import_hf}


def _header_passed(path: Path) -> bool:
    try:
        safetensors_file.read_header(path)
    except GptportError:
        return False
    return True


def fuzz(cases: int, seed: int) -> dict[str, Any]:
    """`cases` mutated files, each read by every reader: outcomes per reader, the first crash, the slowest case."""
    original = safetensors_fuzz.seed_bytes()
    counts = {kind: {"read": 0, "refused": 0, "crashed": 0} for kind in READERS}
    first_crash: dict[str, Any] | None = None
    slowest = {kind: (0.0, -1) for kind in READERS}
    library_only = 0  # the header check passed, a reader then refused (the library's own check, or a dtype)
    with tempfile.TemporaryDirectory(prefix="gptport-fuzz-") as tmp:
        path = Path(tmp) / "model.safetensors"
        path.write_bytes(original)
        for read in READERS.values():  # the valid file, read once: imports are not a case's time
            read(path)
        for i in range(seed, seed + cases):
            path.write_bytes(safetensors_fuzz.mutate(original, random.Random(i)))
            passed = _header_passed(path)
            for kind, read in READERS.items():
                t0 = time.perf_counter()
                status, message = safetensors_fuzz.classify(read, path)
                slowest[kind] = max(slowest[kind], (time.perf_counter() - t0, i))
                counts[kind][status] += 1
                library_only += passed and status == "refused" and "unreadable" in message
                if status == "crashed" and first_crash is None:
                    first_crash = {"case": i, "reader": kind, "error": message.replace(str(path), path.name)}
    return {"counts": counts, "first_crash": first_crash, "library_only_refusals": library_only,
            "slowest": {kind: {"seconds": s, "case": case} for kind, (s, case) in slowest.items()}}


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--cases", type=int, default=10_000, help="mutated files (each read by every reader)")
    ap.add_argument("--seed", type=int, default=0, help="the first case's seed (case i uses seed + i)")
    args = ap.parse_args()
    run = Run()
    with run.round(cases=args.cases) as rnd:
        t0 = time.monotonic()
        found = fuzz(args.cases, args.seed)
        found["seconds"] = time.monotonic() - t0
        rnd.data["fuzz"] = found
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    crash = found["first_crash"] or {}
    rows = [{"reader": kind, "cases": args.cases, **c, "tracebacks": c["crashed"],
             "slowest_case_ms": round(found["slowest"][kind]["seconds"] * 1e3, 2),
             "slowest_case": found["slowest"][kind]["case"], "peak_rss_mib": round(peak_mib),
             "first_crash": crash.get("error") if crash.get("reader") == kind else None}
            for kind, c in found["counts"].items()]
    for row in rows:
        print(f"{row['reader']}: read {row['read']}, refused {row['refused']}, crashed {row['crashed']}, slowest case "
              f"{row['slowest_case']} {row['slowest_case_ms']} ms")
    print(f"{args.cases} cases in {found['seconds']:.1f} s; refused by the library after the header check passed: "
          f"{found['library_only_refusals']}; peak RSS of the run: {peak_mib:.0f} MiB")
    details = {"peak_rss_mib": round(peak_mib), "seconds": round(found["seconds"], 1),
               "library_only_refusals": found["library_only_refusals"]}
    results.write(results.document(results.benchmark_name(__spec__), run, rows, cli.settings(args),
                                   label=args.label, details=details), args.results)


if __name__ == "__main__":
    main()
