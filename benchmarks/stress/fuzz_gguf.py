"""The GGUF reader fuzzed: seeded mutations of a small valid GGUF file (tests/support/gguf_fuzz.py: bytes flipped,
the file cut short, header integers set to extremes, lengths of gigabytes), each read as import-gguf reads it
(header, every metadata value, the tensor types, every tensor dequantized). Every case must be read or refused in
one line naming the file; anything else is a crash, counted with its first example. The peak RSS of the run and
the slowest case go into the results file. (The safetensors readers': benchmarks.stress.fuzz_safetensors.)

    python -m benchmarks.stress.fuzz_gguf [--cases 10000] [--seed 0]
"""

from __future__ import annotations

import random
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.run import Run
from tests.support import gguf_fuzz

READERS = {"gguf": (gguf_fuzz.gguf_bytes, gguf_fuzz.mutate_gguf, gguf_fuzz.read_gguf, "fuzzed.gguf")}


def fuzz(kind: str, cases: int, seed: int) -> dict[str, Any]:
    """`cases` mutations of `kind`'s seed file, each read once: the outcomes, the first crash, the slowest case."""
    make, mutate, read, name = READERS[kind]
    original = make()
    counts = {"read": 0, "refused": 0, "crashed": 0}
    first_crash, slowest = None, (0.0, -1)
    with tempfile.TemporaryDirectory(prefix="gptport-fuzz-") as tmp:
        path = Path(tmp) / name
        for i in range(seed, seed + cases):
            path.write_bytes(mutate(original, random.Random(i)))
            t0 = time.perf_counter()
            status, message = gguf_fuzz.outcome(read, path)
            slowest = max(slowest, (time.perf_counter() - t0, i))
            counts[status] += 1
            if status == "crashed" and first_crash is None:
                first_crash = {"case": i, "error": message.replace(str(path), name)}
    return {"counts": counts, "first_crash": first_crash, "slowest_s": slowest[0], "slowest_case": slowest[1]}


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--cases", type=int, default=10_000, help="mutated files per reader")
    ap.add_argument("--seed", type=int, default=0, help="the first case's seed (case i uses seed + i)")
    args = ap.parse_args()
    run = Run()
    rows = []
    for kind in READERS:
        with run.round(reader=kind) as rnd:
            t0 = time.monotonic()
            found = fuzz(kind, args.cases, args.seed)
            found["seconds"] = time.monotonic() - t0
            rnd.data["fuzz"] = found
        rows.append({"reader": kind, "cases": args.cases, **found["counts"],
                     "tracebacks": found["counts"]["crashed"], "seconds": round(found["seconds"], 1),
                     "slowest_case_ms": round(found["slowest_s"] * 1e3, 2),
                     "first_crash": (found["first_crash"] or {}).get("error")})
        print(f"{kind}: {found['counts']} in {found['seconds']:.1f} s, slowest case {found['slowest_s'] * 1e3:.1f} ms")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of the run: {peak_mib:.0f} MiB")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, cli.settings(args),
                                   label=args.label, details={"peak_rss_mib": round(peak_mib)}), args.results)


if __name__ == "__main__":
    main()
