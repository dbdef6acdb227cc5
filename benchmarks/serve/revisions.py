"""Decode and serving speed of two revisions of gptport in the same rounds: a git revision (the package as it
was, from `git archive`) against the working tree, to show that a change which should not change speed
(a refactor) did not. Each revision runs from its own copy of the package (PYTHONPATH), with this
environment's libraries, on the same model directory (the `small` shape's random weights).

Per round, each revision in turn (the order alternates): `gptport bench` batch-1 decode tok/s of the fp32
static graph (prompt 64, 128 new tokens, 5 runs), then `gptport serve` (16 slots, 2 threads) loaded by
`gptport bench-serve` at each concurrency (/v1/completions, streamed, 128 new tokens, temperature 0.8,
ignore_eos). The table gives the medians over the kept rounds and the change of the working tree against
the revision.

    python -m benchmarks.serve.revisions --base 246c13c [--rounds 4] [--concurrency 1,4]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.loads import MAX_TOKENS, bench_serve, median_of
from benchmarks.harness.models import ROOT, WORK, serve_model
from benchmarks.harness.run import Round, Run, say
from benchmarks.harness.servers import PORT, served

SHAPE = "small"
LOGS = WORK / "revisions"
HEAD = "working tree"


def archive(rev: str) -> Path:
    """The package of revision `rev` unpacked under benchmarks/work (made once per commit)."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", rev], check=True, text=True,
                            capture_output=True).stdout.strip()
    out = WORK / "revisions" / commit
    if not (out / "gptport" / "__init__.py").is_file():
        out.mkdir(parents=True, exist_ok=True)
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "gptport"], check=True,
                             capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=tar, check=True)
    return out


def gptport(tree: Path, *args: str) -> list[str]:
    """`gptport ARGS` run from the package in `tree`."""
    return ["env", f"PYTHONPATH={tree}", sys.executable, "-m", "gptport.cli.main", *args]


def decode_tok_s(tree: Path, d: Path, threads: int) -> float:
    """`gptport bench`'s batch-1 decode tok/s of the fp32 static graph."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.json"
        subprocess.run(gptport(tree, "bench", str(d), "--precisions", "fp32", "--kv-cache", "static", "--batch",
                               "1", "--prompt-len", "64", "--gen-len", str(MAX_TOKENS[SHAPE]), "--repeat", "5",
                               "--threads", str(threads), "--no-torch-baseline", "--json", str(path)),
                       check=True, stdout=subprocess.DEVNULL)
        rows = [r for r in json.loads(path.read_text())["rows"] if r.get("engine") == "onnx"]
    return float(rows[0]["decode_tok_s"])


def serving(tree: Path, d: Path, levels: list[int], threads: int, seed: int) -> list[dict[str, Any]]:
    """bench-serve's rows at each concurrency against `gptport serve` of `tree`."""
    cmd = gptport(tree, "serve", str(d), "--port", PORT, "--slots", "16", "--threads", str(threads))

    def load(url: str, _proc: Any) -> list[dict[str, Any]]:
        rows = []
        for c in levels:
            rows += bench_serve(url, "--concurrency", str(c), "--num-prompts", str(max(8, 4 * c)), "--prompt-len",
                                "64", "--max-tokens", str(MAX_TOKENS[SHAPE]), "--temperature", "0.8", "--seed",
                                str(seed))
        return rows

    LOGS.mkdir(parents=True, exist_ok=True)
    return served(cmd, LOGS / f"serve-{tree.name}.log", load)


def table(run: Run, names: list[str]) -> list[dict[str, Any]]:
    """Per revision: decode tok/s and, per concurrency, the serving medians; the working tree's change."""
    rows: list[dict[str, Any]] = []
    for name in names:
        decode = [v["decode_tok_s"] for v in run.values(name)]
        rows.append({"table": "decode", "revision": name, "decode_tok_s": statistics.median(decode),
                     "rounds": len(decode)})
        for level in zip(*[v["serve"] for v in run.values(name)], strict=True):
            rows.append({"table": "serve", "revision": name, "concurrency": level[0]["concurrency"],
                         **median_of(level), "failed": sum(r["failed"] for r in level)})
    base = {(r["table"], r.get("concurrency")): r for r in rows if r["revision"] == names[0]}
    for r in rows:
        ref = base[(r["table"], r.get("concurrency"))]
        key = "decode_tok_s" if r["table"] == "decode" else "output_throughput"
        if r["revision"] != names[0] and ref.get(key):
            r["change_pct"] = round(100.0 * (r[key] / ref[key] - 1.0), 1)
    return rows


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--base", required=True, help="the git revision to compare the working tree with")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    trees = {f"base {args.base}": archive(args.base), HEAD: ROOT}
    names = list(trees)
    d = serve_model(SHAPE)
    run = Run()

    def measure(name: str, rnd: Round) -> dict[str, Any]:
        say(f"   {name}")
        tree = trees[name]
        return {"decode_tok_s": decode_tok_s(tree, d, args.threads),
                "serve": serving(tree, d, levels, args.threads, seed=rnd.index)}

    run.interleaved(args.rounds, names, measure, shape=SHAPE)
    rows = table(run, names)
    settings = cli.settings(args, shape=SHAPE, prompt_len=64, max_tokens=MAX_TOKENS[SHAPE], temperature=0.8,
                            slots=16)
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label="revisions"),
                  args.results)
    print(f"{'revision':<22} {'what':<18} {'value':>10} {'change':>8}")
    for r in rows:
        what = "decode tok/s" if r["table"] == "decode" else f"serve c={r['concurrency']} out tok/s"
        value = r["decode_tok_s"] if r["table"] == "decode" else r["output_throughput"]
        change = f"{r['change_pct']:+.1f}%" if "change_pct" in r else "-"
        print(f"{r['revision']:<22} {what:<18} {value:>10.1f} {change:>8}")


if __name__ == "__main__":
    main()
