"""Export's time and the decode speed of the graphs it writes, a git revision's exporter against the working tree's:
each exports the same model (`--shape small`: the preset's seeded random weights; `smollm2`: SmolLM2-135M-Instruct
imported from llama.cpp's Q4_1 file, README's walk-through) with `--precision` (default fp32,int4) into a
directory of its own, once, timed (wall and CPU); then the working tree's `gptport bench` (the runtime is the same
for both) measures batch-1 decode tok/s of each graph: the contract graph (model.onnx, --kv-cache concat) and the
static-cache graph of each precision. A change to how graphs are built (issue 58: op by op instead of traced)
should leave each within the rounds' noise. Variants are written `--no-gate` unless `--gate` (then gated on the
model's own samples, as the walk-through does).

Per round, each revision's graphs in turn (the order alternates), each `gptport bench` run a prompt of 64 tokens and
128 new ones, 5 times; the table gives the medians over the kept rounds and the working tree's change.

    python -m benchmarks.export.graph_speed --base 6bc2d4e [--shape small|smollm2] [--precision fp32,int8] [--gate]
        [--rounds 4] [--threads 2]
"""

from __future__ import annotations

import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.models import ROOT, WORK, random_weights
from benchmarks.harness.run import Round, Run, say
from benchmarks.serve.revisions import HEAD, archive

CACHES = ("concat", "static")


def gptport(tree: Path, *args: str) -> list[str]:
    """`gptport ARGS` run from the package in `tree`."""
    return ["env", f"PYTHONPATH={tree}", sys.executable, "-m", "gptport.cli.main", *args]


def exported(name: str, tree: Path, source: Path, options: list[str]) -> tuple[Path, dict[str, float]]:
    """The model at `source` exported by the exporter of `tree` with `options` into WORK/graph_speed/<name>, and
    the export's wall and CPU seconds."""
    d = WORK / "graph_speed" / name.replace(" ", "-")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(source, d, ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.ort"))
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(gptport(tree, "export", str(d), *options, "--force"), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return d, {"export_wall_s": round(time.perf_counter() - start, 1), "export_cpu_s": round(cpu, 1)}


def decode_tok_s(d: Path, precision: str, cache: str, threads: int) -> float:
    """The working tree's `gptport bench`: batch-1 decode tok/s of one graph of `d`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.json"
        subprocess.run(gptport(ROOT, "bench", str(d), "--precisions", precision, "--kv-cache", cache, "--batch", "1",
                               "--prompt-len", "64", "--gen-len", "128", "--repeat", "5", "--threads", str(threads),
                               "--no-torch-baseline", "--json", str(path)), check=True, stdout=subprocess.DEVNULL)
        rows = [r for r in json.loads(path.read_text())["rows"] if r.get("engine") == "onnx"]
    return float(rows[0]["decode_tok_s"])


def table(run: Run, names: list[str], graphs: list[str], timed: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """Per revision its export's time, then per graph and revision the median decode tok/s over the kept rounds, and
    the working tree's change."""
    rows: list[dict[str, Any]] = [{"graph": "export", "revision": name, **timed[name]} for name in names]
    for key in graphs:
        base = statistics.median(v[key] for v in run.values(names[0]))
        for name in names:
            value = statistics.median(v[key] for v in run.values(name))
            rows.append({"graph": key, "revision": name, "decode_tok_s": round(value, 1),
                         **({"change_pct": round(100.0 * (value / base - 1.0), 1)} if name != names[0] else {})})
    return rows


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--base", required=True, help="the git revision whose exporter the working tree's is compared with")
    ap.add_argument("--shape", default="small", choices=["small", "smollm2"])
    ap.add_argument("--precision", default="fp32,int4", help="export's --precision")
    ap.add_argument("--gate", action="store_true", help="gate the variants on the model's own samples")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    trees = {f"base {args.base}": archive(args.base), HEAD: ROOT}
    names = list(trees)
    if args.shape == "smollm2":
        from benchmarks.harness.smollm2 import imported

        source = imported()
    else:
        source = WORK / "graph_speed" / "source"
        if not (source / "config.json").is_file():
            random_weights(source, args.shape)
    precisions = [p for p in args.precision.split(",") if p]
    options = ["--precision", ",".join(precisions), *(["--gate-on-sampled-text"] if args.gate else ["--no-gate"])]
    say("exporting with each revision")
    made = {name: exported(name, tree, source, options) for name, tree in trees.items()}
    graphs = [f"{p} {c}" for p in precisions for c in CACHES]
    run = Run()

    def measure(name: str, rnd: Round) -> dict[str, Any]:
        say(f"   {name}")
        return {g: decode_tok_s(made[name][0], *g.split(), args.threads) for g in graphs}

    run.interleaved(args.rounds, names, measure, shape=args.shape)
    rows = table(run, names, graphs, {name: made[name][1] for name in names})
    settings = cli.settings(args, prompt_len=64, gen_len=128)
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings,
                                   label=f"builder-{args.shape}"), args.results)
    print(f"{'graph':<14} {'revision':<22} {'value':>12} {'change':>8}")
    for r in rows:
        change = f"{r['change_pct']:+.1f}%" if "change_pct" in r else "-"
        value = f"{r['export_wall_s']} s" if r["graph"] == "export" else f"{r['decode_tok_s']:.1f} tok/s"
        print(f"{r['graph']:<14} {r['revision']:<22} {value:>12} {change:>8}")


if __name__ == "__main__":
    main()
