"""schemathesis's command line against a running server's GET /openapi.json, as a hostile client would run it:
every phase it has (examples, coverage, fuzzing, stateful), every route, positive and negative data, and the
checks that hold gptport to its document (no 5xx; each answer's status, content type, headers and body as
documented; a request the document refuses is refused; a method a route lacks answered 405 with Allow). Bounded
in examples per operation and in time; its JSON report read back. Used by tests/serve/test_fuzz.py (a bounded
slice in CI) and benchmarks/stress/fuzz_api.py (the full run)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PHASES = ("examples", "coverage", "fuzzing", "stateful")
# every check of schemathesis but two: positive_data_acceptance (a generated model name is a documented 404, a
# long prompt a documented 400) and ignored_auth (the fuzzed server has no API key)
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_headers_conformance", "response_schema_conformance", "negative_data_rejection",
          "missing_required_header", "unsupported_method", "use_after_free", "ensure_resource_availability")


@dataclass(frozen=True)
class Fuzzed:
    """What one run found: schemathesis's exit code, its JSON report, the tail of its output, seconds taken."""

    code: int
    report: dict[str, Any]
    output: str
    seconds: float

    @property
    def cases(self) -> int:
        return int(self.report.get("test_cases", {}).get("generated", 0))

    @property
    def failures(self) -> list[dict[str, Any]]:
        return list(self.report.get("failures", []))

    @property
    def server_errors(self) -> int:
        """Test cases answered with a 5xx."""
        return sum(int(f.get("count", 0)) for f in self.failures if f.get("code") == "ST101")

    @property
    def phases(self) -> dict[str, str]:
        return {name: str(p.get("status")) for name, p in self.report.get("phases", {}).items()}

    def summary(self) -> str:
        return (f"schemathesis: exit {self.code}, {self.cases} test cases in {self.seconds:.0f} s, phases "
                f"{self.phases}, failures {[(f.get('code'), f.get('operations')) for f in self.failures]}")


def fuzz(url: str, max_examples: int, max_time: float, seed: int = 1, workers: int = 1) -> Fuzzed:
    """Run schemathesis against `url` (the server's base URL) and read its report."""
    with tempfile.TemporaryDirectory(prefix="gptport-fuzz-") as tmp:
        path = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json", "--phases", ",".join(PHASES),
               "--checks", ",".join(CHECKS), "--max-examples", str(max_examples), "--max-time", f"{max_time:g}",
               "--seed", str(seed), "--workers", str(workers), "--request-timeout", "30", "--no-color",
               "--generation-database", "none", "--report", "json", "--report-json-path", str(path)]
        t0 = time.monotonic()
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=max_time + 300, cwd=tmp)
        seconds = time.monotonic() - t0
        report = json.loads(path.read_text()) if path.is_file() else {}
    return Fuzzed(run.returncode, report, (run.stdout + run.stderr)[-6000:], seconds)
