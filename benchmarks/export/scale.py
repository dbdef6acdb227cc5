"""Import and export at the sizes people run, beside onnxruntime-genai's model builder on the same directory:
wall time, CPU time (user + system), peak resident memory (each command's ru_maxrss, read by a small launcher,
benchmarks/harness/rusage.py, so this process's memory puts no floor under it; it counts the command's own
children) and the bytes written, per step and precision.

The Hugging Face directories are random-weight models of real shapes made here, no hub (benchmarks/harness/
hf_shapes.py: config.json written by hand, bf16 safetensors shards written tensor by tensor with numpy, a
byte-level BPE of the shape's vocabulary): `qwen2.5-0.5b`, `llama-3.2-1b`, `llama-3.1-8b` and `tiny` (2
layers of d 64: the script end to end in a minute). Each is made once under benchmarks/work/scale/<shape>/hf
(the disk's room checked first; its making measured like the rest, in the round that makes it) and kept.

- gptport: `gptport import-hf DIR --out M --force`, then `gptport export M --precision P --no-gate --force`,
  P every --precisions at once (default) or one export per precision (--per-precision; gptport writes fp32
  with each). Written: the files of M import made, then those each export made or changed. With
  --also-no-static, the same again with `export --no-static` ("gptport --no-static"): the contract graphs alone,
  the three graphs genai writes (gptport's default adds the static-cache graphs and the append graph).
- onnxruntime-genai's builder, in a venv of its own (benchmarks/work/venv-genai-builder, made when missing:
  onnxruntime-genai 0.18 with the CPU onnxruntime, torch, transformers, and onnx and onnx_ir, which the
  builder imports without asking for them): `python -m onnxruntime_genai.models.builder -i DIR -o OUT -p P -e cpu
  -c CACHE`, one call per precision. Written: OUT (its cache, apart).

Each command's output goes to benchmarks/work/scale/<shape>/logs/; what a tool wrote is removed after it is
measured (--keep keeps it).

Each round runs both tools on a shape, who goes first alternating; every round is probed (memory bandwidth,
steal: benchmarks/harness/probe.py). Figures: the median wall and CPU time of the kept rounds, the largest
peak. Goals (issue 58, on 2 cores): Qwen2.5-0.5B's import-hf + export fp32,int8,int4 within 2 minutes and 3 GiB,
and within genai's time and peak for the same precisions; Llama-3.2-1B's exports within 4 GiB; Llama-3.1-8B's
import-hf + export int4 within 20 minutes and 6 GiB.

    python -m benchmarks.export.scale --shapes qwen2.5-0.5b,llama-3.2-1b [--precisions fp32,int8,int4]
        [--rounds 1] [--per-precision] [--also-no-static] [--no-genai] [--no-gptport] [--make-only] [--keep]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, hf_shapes, results, tables
from benchmarks.harness.models import WORK
from benchmarks.harness.run import Run, say
from benchmarks.harness.rusage import GIB, measure

GENAI_VENV = WORK / "venv-genai-builder"
NO_STATIC = "gptport --no-static"  # the tool's name in the results: export without the static-cache graphs
GENAI_PACKAGES = ("onnxruntime-genai==0.18.*", "onnxruntime", "torch==2.13.*", "transformers", "onnx", "onnx_ir")
GENAI_PRECISIONS = ("fp32", "fp16", "int8", "int4")  # the builder's -p choices that gptport has too
PRECISIONS = ("fp32", "fp16", "int8", "int4")
GOALS: dict[str, dict[str, float]] = {"qwen2.5-0.5b": {"wall_s": 120, "peak_rss_gib": 3.0},
                                      "llama-3.2-1b": {"peak_rss_gib": 4.0},
                                      "llama-3.1-8b": {"wall_s": 1200, "peak_rss_gib": 6.0}}
CHILD_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"}


def measured(args: list[str], log: Path) -> dict[str, Any]:
    """`args` measured (rusage.measure), offline (no hub), its output in `log`; a failure said in one line."""
    fig = measure(args, log, CHILD_ENV)
    if "error" in fig:
        say(f"  failed: {' '.join(Path(a).name for a in args[:4])} ...: {fig['error']} (log: {log})")
    return fig


def files(d: Path) -> dict[str, tuple[int, int]]:
    """Every file under `d` by relative path: (size, mtime_ns)."""
    if not d.is_dir():
        return {}
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob("*") if p.is_file()}


def written(before: dict[str, tuple[int, int]], d: Path) -> dict[str, int]:
    """The files of `d` that are new or changed since `before`, by size."""
    return {name: st[0] for name, st in sorted(files(d).items()) if before.get(name) != st}


def with_disk(fig: dict[str, Any], made: dict[str, int]) -> dict[str, Any]:
    return fig | {"disk_gib": round(sum(made.values()) / GIB, 3), "files": made}


def gptport(*args: str) -> list[str]:
    return [sys.executable, "-m", "gptport", *args]


def make_shape(shape: str, work: Path) -> tuple[Path, dict[str, Any] | None]:
    """The shape's Hugging Face directory, and the figures of its making when this call made it (a child:
    `--make`, so its peak is the maker's alone)."""
    hf = work / shape / "hf"
    if (hf / hf_shapes.INDEX).is_file():
        return hf, None
    say(f"making {hf} ({hf_shapes.parameters(shape) / 1e9:.2f}B parameters, {hf_shapes.size_of(shape) / 1e9:.1f} GB)")
    fig = measured([sys.executable, "-m", "benchmarks.export.scale", "--make", shape, "--work", str(work)],
                   work / shape / "logs" / "make.log")
    if "error" in fig:
        raise SystemExit(f"making {shape}: {fig['error']}")
    return hf, with_disk(fig, written({}, hf))


def run_gptport(hf: Path, out: Path, precisions: list[str], per_precision: bool, keep: bool,
                extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """import-hf, then the export(s) with `extra` options, each measured; the model directory removed afterwards
    unless `keep`."""
    m, logs, tag = out / "gptport", out / "logs", "".join(f"-{x.lstrip('-')}" for x in extra)
    shutil.rmtree(m, ignore_errors=True)
    steps = {"import-hf": with_disk(measured(gptport("import-hf", str(hf), "--out", str(m), "--force"),
                                             logs / f"gptport{tag}-import.log"), written({}, m))}
    imported = files(m)
    for p in (precisions if per_precision else [",".join(precisions)]):
        if "error" in steps["import-hf"]:
            break
        for name in set(files(m)) - set(imported):  # the previous export's files
            (m / name).unlink()
        before = files(m)
        fig = measured(gptport("export", str(m), "--precision", p, "--no-gate", "--force", *extra),
                       logs / f"gptport{tag}-export-{p.replace(',', '-')}.log")
        steps[f"export {p}"] = with_disk(fig, written(before, m))
    if not keep:
        shutil.rmtree(m, ignore_errors=True)
    return steps


def genai_venv(path: Path) -> Path:
    """The builder's venv's python, made when missing (a venv without its `.made` mark is made anew)."""
    python = path / "bin" / "python"
    if not (path / ".made").is_file():
        say(f"making {path}: pip install {' '.join(GENAI_PACKAGES)}")
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *GENAI_PACKAGES], check=True)
        (path / ".made").write_text("\n".join(GENAI_PACKAGES) + "\n", encoding="utf-8")
    return python


def genai_versions(python: Path) -> dict[str, str]:
    code = ("from importlib import metadata as m\nfor d in ('onnxruntime-genai', 'onnxruntime', 'torch', "
            "'transformers'): print(d, m.version(d))")
    out = subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout
    return {f"genai-builder {line.split()[0]}": line.split()[1] for line in out.splitlines()}


def run_genai(python: Path, hf: Path, out: Path, precisions: list[str], keep: bool) -> dict[str, Any]:
    """The builder once per precision, each into its own folder (removed afterwards unless `keep`)."""
    steps = {}
    for p in precisions:
        if p not in GENAI_PRECISIONS:
            continue
        dest, cache = out / f"genai-{p}", out / f"genai-cache-{p}"
        for d in (dest, cache):
            shutil.rmtree(d, ignore_errors=True)
        fig = measured([str(python), "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(dest),
                        "-p", p, "-e", "cpu", "-c", str(cache)], out / "logs" / f"genai-{p}.log")
        steps[f"build {p}"] = with_disk(fig, written({}, dest)) | {"cache_gib": round(
            sum(s for s, _ in files(cache).values()) / GIB, 3)}
        if not keep:
            for d in (dest, cache):
                shutil.rmtree(d, ignore_errors=True)
    return steps


def summary(run: Run, shape: str, tool: str) -> list[dict[str, Any]]:
    """One row per step of `tool` on `shape`: the kept rounds' median times, largest peak, last disk."""
    kept = [r.data[tool] for r in run.kept(shape=shape) if tool in r.data]
    rows = []
    for step in dict.fromkeys(s for k in kept for s in k):
        figs = [k[step] for k in kept if step in k]
        ok = [f for f in figs if "error" not in f] or figs
        rows.append({"table": "steps", "shape": shape, "tool": tool, "step": step,
                     "wall_s": statistics.median(f["wall_s"] for f in ok),
                     "cpu_s": statistics.median(f["cpu_s"] for f in ok),
                     "peak_rss_gib": max(f["peak_rss_gib"] for f in ok), "disk_gib": ok[-1]["disk_gib"],
                     "files": len(ok[-1]["files"]), "rounds": len(figs),
                     "error": next((f["error"] for f in figs if "error" in f), None)})
    return rows


def goal_row(shape: str, rows: list[dict[str, Any]], tool: str = "gptport") -> dict[str, Any] | None:
    """gptport's import + exports (`tool`: with --no-static too) against issue 58's goal for `shape` and genai's
    builds of the same run."""
    mine = [r for r in rows if r["shape"] == shape and r["tool"] == tool]
    theirs = [r for r in rows if r["shape"] == shape and r["tool"] == "genai"]
    goal = GOALS.get(shape)
    if not mine or goal is None:
        return None
    failed = any(r["error"] for r in mine)
    genai_failed = any(r["error"] for r in theirs)  # (killed for memory, say): nothing to compare against
    wall, peak = sum(r["wall_s"] for r in mine), max(r["peak_rss_gib"] for r in mine)
    met = not failed and wall <= goal.get("wall_s", wall) and peak <= goal["peak_rss_gib"]
    return {"table": "goals (issue 58)", "shape": shape, "tool": tool, "gptport_wall_s": wall,
            "gptport_peak_rss_gib": peak, "goal_wall_s": goal.get("wall_s"), "goal_peak_rss_gib": goal["peak_rss_gib"],
            "genai_wall_s": sum(r["wall_s"] for r in theirs) if theirs else None,
            "genai_peak_rss_gib": max((r["peak_rss_gib"] for r in theirs), default=None),
            "within_goal": met, "within_genai": None if not theirs or failed or genai_failed else (
                wall <= sum(r["wall_s"] for r in theirs) and peak <= max(r["peak_rss_gib"] for r in theirs)),
            "gptport_failed": failed, "genai_failed": genai_failed}


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="qwen2.5-0.5b", help=f"comma-separated, of {', '.join(hf_shapes.SHAPES)}")
    ap.add_argument("--precisions", default="fp32,int8,int4", help=f"comma-separated, of {', '.join(PRECISIONS)}")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of both tools on each shape")
    ap.add_argument("--per-precision", action="store_true", help="gptport: one export per precision")
    ap.add_argument("--no-genai", action="store_true", help="leave onnxruntime-genai's builder out")
    ap.add_argument("--no-gptport", action="store_true", help="leave gptport out (the builder's figures alone)")
    ap.add_argument("--also-no-static", action="store_true",
                    help=f"gptport a second time with export --no-static ({NO_STATIC!r}): the contract graphs alone, "
                         "the three graphs genai writes")
    ap.add_argument("--make-only", action="store_true", help="make the shapes' directories, measure nothing else")
    ap.add_argument("--keep", action="store_true", help="keep what each tool wrote (removed after it by default)")
    ap.add_argument("--work", type=Path, default=WORK / "scale", help="where directories and outputs go")
    ap.add_argument("--genai-venv", type=Path, default=GENAI_VENV, help="onnxruntime-genai's builder's venv")
    ap.add_argument("--make", metavar="SHAPE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.make:
        hf_shapes.make(args.make, args.work / args.make / "hf")
        return
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    bad = [s for s in shapes if s not in hf_shapes.SHAPES] + [p for p in precisions if p not in PRECISIONS]
    if bad or not shapes or not precisions:
        raise SystemExit(f"--shapes {args.shapes!r} / --precisions {args.precisions!r}: {', '.join(bad) or 'empty'}"
                         f" is none of {', '.join(hf_shapes.SHAPES)} / {', '.join(PRECISIONS)}")
    tools = [t for t, off in (("gptport", args.no_gptport), (NO_STATIC, args.no_gptport or not args.also_no_static),
                              ("genai", args.no_genai)) if not off]
    python = genai_venv(args.genai_venv) if "genai" in tools and not args.make_only else None
    run = Run()
    for shape in shapes:
        for rnd in run.series(1 if args.make_only else args.rounds, shape=shape):
            hf, made = make_shape(shape, args.work)
            if made is not None:
                rnd.data["maker"] = {"make": made}
                say(f"{shape} made: peak {made['peak_rss_gib']:.2f} GiB, {made['wall_s']:.0f} s")
            for tool in ([] if args.make_only else rnd.order(tools)):
                say(f"{shape}: {tool}")
                out = args.work / shape
                if tool in ("gptport", NO_STATIC):
                    rnd.data[tool] = run_gptport(hf, out, precisions, args.per_precision, args.keep,
                                                 ("--no-static",) if tool == NO_STATIC else ())
                elif python is not None:
                    rnd.data[tool] = run_genai(python, hf, out, precisions, args.keep)
    rows = [r for shape in shapes for tool in ("maker", *tools) for r in summary(run, shape, tool)]
    rows += [g for shape in shapes for tool in ("gptport", NO_STATIC) if (g := goal_row(shape, rows, tool)) is not None]
    print("\n".join(tables.tables(rows)))
    if args.make_only:
        return
    settings = cli.settings(args, work=args.work.name, genai_venv=args.genai_venv.name)
    settings = {k: v for k, v in settings.items() if k != "make"}
    doc = results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label,
                           extra_versions=genai_versions(python) if python else None,
                           notes=["peak_rss_gib: the child's ru_maxrss (GiB = 2^30 bytes); cpu_s: its user + system "
                                  "time; disk_gib: the files it wrote (genai: its output folder, its cache apart)"])
    results.write(doc, args.results)


if __name__ == "__main__":
    main()
