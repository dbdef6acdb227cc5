"""schemathesis's full run against `gptport serve`: every phase (examples, coverage, fuzzing, stateful), every
route of GET /openapi.json, positive and negative data, and every check that holds the server to its document
(benchmarks/harness/api_fuzz.py says which). Its test cases, time, 5xx answers and failures go into the results
file. Run alone, it starts a server on the preset's random weights (the serving benchmarks'), or uses --url.

    python -m benchmarks.stress.fuzz_api [--preset tiny] [--max-examples 100] [--max-time 600] [--seed 1]
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.api_fuzz import CHECKS, PHASES, Fuzzed, fuzz
from benchmarks.harness.models import WORK, serve_model
from benchmarks.harness.run import Run
from benchmarks.harness.servers import gptport_serve, served


def rows(found: Fuzzed) -> list[dict[str, Any]]:
    """The run's row, then one row per kind of failure found."""
    out: list[dict[str, Any]] = [{
        "table": "run", "test_cases": found.cases, "seconds": round(found.seconds, 1),
        "server_errors": found.server_errors, "failures": sum(int(f.get("count", 0)) for f in found.failures),
        "phases": ", ".join(f"{k} {v}" for k, v in found.phases.items()),
        "operations": found.report.get("operations", {}).get("tested"), "exit_code": found.code}]
    for f in found.failures:
        out.append({"table": "failures", "code": f.get("code"), "title": f.get("title"), "count": f.get("count"),
                    "operations": ", ".join(f.get("operations", []))})
    return out


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--url", help="an already running server (else one is started on the preset's random weights)")
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--max-examples", type=int, default=100, help="test cases per operation and phase")
    ap.add_argument("--max-time", type=float, default=600.0, help="seconds for the whole run")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    run = Run()
    with run.round() as rnd:
        def go(url: str, _proc: Any = None) -> Fuzzed:
            return fuzz(url, args.max_examples, args.max_time, args.seed)

        if args.url:
            found = go(args.url.rstrip("/"))
        else:
            cmd = gptport_serve(serve_model(args.preset), "--slots", str(args.slots))
            found = served(cmd, WORK / "serve" / f"fuzz-api-{args.preset}.log", go)
        rnd.data["fuzz"] = {"cases": found.cases, "seconds": found.seconds, "phases": found.phases,
                            "failures": found.failures}
    print(found.summary())
    if found.code != 0:
        print(found.output)
    results.write(results.document(results.benchmark_name(__spec__), run, rows(found),
                                   cli.settings(args, phases=list(PHASES), checks=list(CHECKS)),
                                   label=args.label, extra_versions={"schemathesis": version("schemathesis")}),
                  args.results)


if __name__ == "__main__":
    main()
