"""The one layout of every results file, and its writer.

    {"benchmark": "<group>.<name>",        the script: python -m benchmarks.<group>.<name>
     "machine": {"cpu", "vector_class", "cores", "isa", "platform", "gpu"?},
     "versions": {"gptport", "onnxruntime", "torch"?, "python", ...},
     "commit": git commit of the tree that ran ("-dirty": gptport/ or benchmarks/ had changes), or null,
     "date": "YYYY-MM-DD",
     "settings": {...},                    what the run was asked for
     "rounds": [{"index", <tags>, "probe": {...} | null, "kept", "discarded", "data"}],
     "rows": [{...}],                      the table the pages show; a row's "table" names its table
     "label"?: "...", "notes"?: ["..."], "details"?: {...}}

The file is named `<benchmark>-<machine slug>-<YYYYMMDD>[-<label>].json` (lower case, - between words:
`decode-kv-cache-amd-epyc-avx512-20261124.json`), the machine slug being the GPU's name where one ran, else
the CPU's name and its vector class (`amd-epyc-avx512`)."""

from __future__ import annotations

import datetime
import json
import platform
import re
import subprocess
import sys
from importlib import metadata
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

from benchmarks.harness.run import Run
from gptport import __version__
from gptport.atomic import write_text
from gptport.machine import describe, slug, vector_class

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
REQUIRED: dict[str, type | tuple[type, ...]] = {
    "benchmark": str, "machine": dict, "versions": dict, "commit": (str, type(None)), "date": str, "settings": dict,
    "rounds": list, "rows": list}
OPTIONAL: dict[str, type | tuple[type, ...]] = {"label": str, "notes": list, "details": dict}
MACHINE = ("cpu", "vector_class", "cores")
VERSIONS = ("gptport", "onnxruntime", "python")
UNKNOWN = "not recorded"


def benchmark_name(spec: ModuleSpec | None) -> str:
    """`serve.throughput` for the module benchmarks.serve.throughput (its __spec__)."""
    if spec is None or not spec.name.startswith("benchmarks.") or spec.name.count(".") != 2:
        raise SystemExit("run a benchmark as a module from the repository's root: python -m benchmarks.<group>.<name>")
    return spec.name.removeprefix("benchmarks.")


def machine(gpu: str | None = None) -> dict[str, Any]:
    """The CPU's name, its vector class (avx2, avx512, amx), cores and extensions; the GPU's name if one ran."""
    host = describe()
    out = {"cpu": host["cpu"], "vector_class": vector_class(host["isa"]), "cores": host["cores"], "isa": host["isa"],
           "platform": host["platform"]}
    return out | ({"gpu": gpu} if gpu else {})


def _version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def versions(**extra: str) -> dict[str, str]:
    """gptport's, onnxruntime's (whichever package provides it), torch's where installed, Python's; and `extra`."""
    out = {"gptport": __version__, "onnxruntime": _version("onnxruntime-gpu", "onnxruntime", "onnxruntime-openvino"),
           "torch": _version("torch"), "python": platform.python_version(), **extra}
    return {k: v for k, v in out.items() if v is not None}


def commit(root: Path = ROOT) -> str | None:
    """HEAD's commit, with "-dirty" when gptport/ or benchmarks/ differ from it; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "gptport", "benchmarks"], cwd=root,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def machine_slug(m: dict[str, Any]) -> str:
    """The machine part of a results file's name: amd-epyc-avx512; nvidia-h100-80gb-hbm3 where a GPU ran."""
    if m.get("gpu"):
        return slug(str(m["gpu"]).split(",")[0])
    cpu = "unknown-cpu" if m.get("cpu") in (None, "", UNKNOWN) else slug(str(m["cpu"]))
    vclass = m.get("vector_class")
    return cpu if vclass in (None, "", UNKNOWN) else f"{cpu}-{vclass}"


def file_name(doc: dict[str, Any]) -> str:
    label = doc.get("label")
    return (f"{slug(doc['benchmark'])}-{machine_slug(doc['machine'])}-{doc['date'].replace('-', '')}"
            f"{'-' + slug(label) if label else ''}.json")


def document(benchmark: str, run: Run, rows: list[dict[str, Any]], settings: dict[str, Any], *,
             gpu: str | None = None, label: str = "", notes: list[str] | None = None,
             details: dict[str, Any] | None = None, extra_versions: dict[str, str] | None = None) -> dict[str, Any]:
    """A results document of `run`'s rounds and the `rows` computed from its kept rounds."""
    doc: dict[str, Any] = {"benchmark": benchmark, "machine": machine(gpu),
                           "versions": versions(**(extra_versions or {})), "commit": commit(),
                           "date": datetime.date.today().isoformat(), "settings": settings,
                           "rounds": run.records(), "rows": rows}
    if label:
        doc["label"] = label
    if run.notes or notes:
        doc["notes"] = [*run.notes, *(notes or [])]
    if details:
        doc["details"] = details
    return doc


def validate(doc: Any) -> list[str]:
    """What is wrong with a results document ([] when nothing)."""
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    problems = [f"no {k!r}" for k in REQUIRED if k not in doc]
    problems += [f"{k!r} is not {t}" for k, t in {**REQUIRED, **OPTIONAL}.items()
                 if k in doc and not isinstance(doc[k], t)]
    problems += [f"unknown key {k!r}" for k in doc if k not in REQUIRED and k not in OPTIONAL]
    if problems:
        return problems
    if doc["benchmark"].count(".") != 1:
        problems.append(f"benchmark {doc['benchmark']!r} is not <group>.<name>")
    problems += [f"machine has no {k!r}" for k in MACHINE if k not in doc["machine"]]
    problems += [f"versions has no {k!r}" for k in VERSIONS if k not in doc["versions"]]
    try:
        datetime.date.fromisoformat(doc["date"])
    except ValueError:
        problems.append(f"date {doc['date']!r} is not YYYY-MM-DD")
    for i, r in enumerate(doc["rounds"]):
        if not isinstance(r, dict) or not {"index", "probe", "kept"} <= set(r):
            problems.append(f"rounds[{i}] lacks index, probe or kept")
    problems += [f"rows[{i}] is not an object" for i, r in enumerate(doc["rows"]) if not isinstance(r, dict)]
    return problems


def machine_paths() -> dict[str, str]:
    """This machine's own folders, which a results file must not name (error traces, test logs and messages
    quote them), and the words that stand for them: the repository, Python's import path, the home folder."""
    pairs = {str(ROOT): "<repo>", str(Path.home()): "~", sys.prefix: "<python>", sys.base_prefix: "<python>"}
    pairs |= {p: "<python-path>" for p in sys.path if p.startswith("/") and not p.startswith(str(ROOT))}
    return {k: v for k, v in pairs.items() if len(k) > 1}


def anonymized(text: str, paths: dict[str, str] | None = None) -> str:
    """`text` with every folder of `paths` (machine_paths()) replaced by its word, longest first, where it is a
    whole path component."""
    for folder, word in sorted((paths or machine_paths()).items(), key=lambda kv: -len(kv[0])):
        text = re.sub(re.escape(folder) + r"(?![\w.-])", lambda _, w=word: w, text)
    return text


def write(doc: dict[str, Any], out_dir: Path = RESULTS) -> Path:
    """Check `doc` against the layout and write it atomically under its name in `out_dir`, this machine's
    folders replaced by words (anonymized)."""
    problems = validate(doc)
    if problems:
        raise ValueError(f"results of {doc.get('benchmark', '?')}: " + "; ".join(problems))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / file_name(doc)
    write_text(path, anonymized(json.dumps(doc, indent=1, default=str, ensure_ascii=False)) + "\n")
    print(f"wrote {path}")
    return path


def read(path: Path) -> dict[str, Any]:
    """A results file, checked against the layout (ValueError naming the file and what is wrong)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    problems = validate(doc)
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    if path.name != file_name(doc):
        raise ValueError(f"{path}: named {path.name}, its contents say {file_name(doc)}")
    return dict(doc)
