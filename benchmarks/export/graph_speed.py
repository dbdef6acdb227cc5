"""Decode speed of the graphs export writes, a git revision's exporter against the working tree's: each exports the
same model (the `small` shape's seeded random weights, `--precision fp32,int4 --no-gate`) into a directory of its
own, then the working tree's `gptport bench` (the runtime is the same for both) measures batch-1 decode tok/s of
each graph: the contract graph (model.onnx, --kv-cache concat) and the static-cache graph, fp32 and int4. A change
to how graphs are built (issue 58: op by op instead of traced) should leave each within the rounds' noise.

Per round, each revision's graphs in turn (the order alternates), each `gptport bench` run a prompt of 64 tokens and
128 new ones, 5 times; the table gives the medians over the kept rounds and the working tree's change.

    python -m benchmarks.export.graph_speed --base 6bc2d4e [--rounds 4] [--threads 2]
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.models import ROOT, WORK, random_weights
from benchmarks.harness.run import Round, Run, say
from benchmarks.serve.revisions import HEAD, archive

SHAPE = "small"
GRAPHS = [("fp32", "concat"), ("fp32", "static"), ("int4", "concat"), ("int4", "static")]


def gptport(tree: Path, *args: str) -> list[str]:
    """`gptport ARGS` run from the package in `tree`."""
    return ["env", f"PYTHONPATH={tree}", sys.executable, "-m", "gptport.cli.main", *args]


def exported(name: str, tree: Path, source: Path) -> Path:
    """The model at `source` exported by the exporter of `tree` into WORK/graph_speed/<name> (made once per run)."""
    d = WORK / "graph_speed" / name.replace(" ", "-")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(source, d, ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.ort"))
    subprocess.run(gptport(tree, "export", str(d), "--precision", "fp32,int4", "--no-gate", "--force"), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return d


def decode_tok_s(d: Path, precision: str, cache: str, threads: int) -> float:
    """The working tree's `gptport bench`: batch-1 decode tok/s of one graph of `d`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.json"
        subprocess.run(gptport(ROOT, "bench", str(d), "--precisions", precision, "--kv-cache", cache, "--batch", "1",
                               "--prompt-len", "64", "--gen-len", "128", "--repeat", "5", "--threads", str(threads),
                               "--no-torch-baseline", "--json", str(path)), check=True, stdout=subprocess.DEVNULL)
        rows = [r for r in json.loads(path.read_text())["rows"] if r.get("engine") == "onnx"]
    return float(rows[0]["decode_tok_s"])


def table(run: Run, names: list[str]) -> list[dict[str, Any]]:
    """Per graph and revision: the median decode tok/s over the kept rounds, and the working tree's change."""
    rows = []
    for precision, cache in GRAPHS:
        key = f"{precision} {cache}"
        base = statistics.median(v[key] for v in run.values(names[0]))
        for name in names:
            value = statistics.median(v[key] for v in run.values(name))
            rows.append({"graph": key, "revision": name, "decode_tok_s": round(value, 1),
                         **({"change_pct": round(100.0 * (value / base - 1.0), 1)} if name != names[0] else {})})
    return rows


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--base", required=True, help="the git revision whose exporter the working tree's is compared with")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    trees = {f"base {args.base}": archive(args.base), HEAD: ROOT}
    names = list(trees)
    source = WORK / "graph_speed" / "source"
    if not (source / "config.json").is_file():
        random_weights(source, SHAPE)
    say("exporting with each revision")
    dirs = {name: exported(name, tree, source) for name, tree in trees.items()}
    run = Run()

    def measure(name: str, rnd: Round) -> dict[str, Any]:
        say(f"   {name}")
        return {f"{p} {c}": decode_tok_s(dirs[name], p, c, args.threads) for p, c in GRAPHS}

    run.interleaved(args.rounds, names, measure, shape=SHAPE)
    rows = table(run, names)
    settings = cli.settings(args, shape=SHAPE, prompt_len=64, gen_len=128)
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label="builder"),
                  args.results)
    print(f"{'graph':<14} {'revision':<22} {'decode tok/s':>12} {'change':>8}")
    for r in rows:
        change = f"{r['change_pct']:+.1f}%" if "change_pct" in r else "-"
        print(f"{r['graph']:<14} {r['revision']:<22} {r['decode_tok_s']:>12.1f} {change:>8}")


if __name__ == "__main__":
    main()
