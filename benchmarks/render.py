"""Render the performance pages from benchmarks/results/: docs/performance/index.md, a page per benchmark
group (docs/performance/<group>.md), and the README's headline table between <!-- figures:start --> and
<!-- figures:end --> (only where README.md has both markers; it says so where it has not). No figure on
those pages is typed by hand: each comes from a results file.

    python -m benchmarks.render            # write the pages
    python -m benchmarks.render --check    # exit 1 naming every page that differs from what the results give
"""

from __future__ import annotations

import argparse
import ast
import sys
import textwrap
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import results, tables
from benchmarks.harness.probe import RULE
from gptport.atomic import write_text

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
DOCS = ROOT / "docs" / "performance"
README = ROOT / "README.md"
START, END = "<!-- figures:start -->", "<!-- figures:end -->"
NOT_GROUPS = {"harness", "results", "work"}
GENERATED = "<!-- made by `python -m benchmarks.render` from benchmarks/results/: edit those, not this page -->"


@dataclass(frozen=True)
class Headline:
    """One line of the README's table: a row of the newest results file of `benchmark` (with `label`)."""

    measure: str
    benchmark: str
    where: dict[str, Any]
    value: str
    reference: str | None = None
    ratio: str | None = None
    label: str = ""


HEADLINES = (
    Headline("Decode tok/s, `small`, fp32, batch 1: gptport / llama.cpp", "decode.vs_llamacpp",
             {"shape": "small", "row": "fp32 / F32 decode"}, "gptport_tok_s", "llama_cpp_tok_s", "ratio"),
    Headline("Decode tok/s, `small`, int8 / Q8_0, batch 1: gptport / llama.cpp", "decode.vs_llamacpp",
             {"shape": "small", "row": "int8 / Q8_0 decode"}, "gptport_tok_s", "llama_cpp_tok_s", "ratio"),
    Headline("Decode tok/s, `gpt2-124m`, fp32, batch 1: gptport / llama.cpp", "decode.vs_llamacpp",
             {"shape": "gpt2-124m", "row": "fp32 / F32 decode"}, "gptport_tok_s", "llama_cpp_tok_s", "ratio"),
    Headline("Decode tok/s, SmolLM2-135M-Instruct, fp32 / F32, batch 1: gptport / llama.cpp",
             "decode.vs_llamacpp_smollm2", {"row": "fp32 / F32 decode"}, "gptport_tok_s", "llama_cpp_tok_s", "ratio",
             label="static-quiet"),
    Headline("Decode tok/s, SmolLM2-135M-Instruct, int8 / Q8_0, batch 1: gptport / llama.cpp",
             "decode.vs_llamacpp_smollm2", {"row": "int8 / Q8_0 decode"}, "gptport_tok_s", "llama_cpp_tok_s", "ratio",
             label="static-quiet"),
    Headline("Decode tok/s, SmolLM2-135M-Instruct, int4 / the original Q4_1, batch 1: gptport / llama.cpp",
             "decode.vs_llamacpp_smollm2", {"row": "int4 / Q4_1 decode"}, "gptport_tok_s", "llama_cpp_tok_s", "ratio",
             label="int4-grid"),
    Headline("Serving output tok/s, `small`, 16 users, each engine's fastest: gptport / llama-server", "serve.best",
             {"table": "fastest", "shape": "small"}, "gptport_tok_s", "llama_tok_s", "vs_llama"),
    Headline("Serving output tok/s, `gpt2-124m`, 16 users, each engine's fastest: gptport / llama-server",
             "serve.best", {"table": "fastest", "shape": "gpt2-124m"}, "gptport_tok_s", "llama_tok_s", "vs_llama"),
    Headline("Prefix caching, `small`, 16 users: median TTFT with reuse / without", "serve.prefix",
             {"table": "ratios", "shape": "small"}, "ttft_on_over_off", label="quiet-both"),
    Headline("Prefix caching, `gpt2-124m`, 16 users: median TTFT with reuse / without", "serve.prefix",
             {"table": "ratios", "shape": "gpt2-124m"}, "ttft_on_over_off", label="quiet-both"),
    Headline("Tokenizer training MB/s, 30 MB corpus: gptport / bare `tokenizers` (ratio: time)",
             "tokenizer.training", {"corpus": "big_corpus.txt"}, "gptport_mb_s", "bare_mb_s", "gptport_over_bare"),
    Headline("Training `tiny` for 5 minutes on the CPU: validation bits per byte", "train.fixed_time", {},
             "final_val_bpb"),
    Headline("Training at equal parameters and minutes: held-out bits per byte, modern (`llama-tiny`) / classic "
             "(`tiny`)", "train.modern_vs_classic", {"table": "modern against classic"}, "modern_bpb",
             "classic_bpb", "modern_over_classic"),
)


@dataclass
class Script:
    group: str
    name: str
    doc: str
    files: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


def first_paragraph(doc: str) -> str:
    return " ".join(doc.split("\n\n")[0].split())


def groups() -> dict[str, dict[str, Script]]:
    """Every group and script in the tree, with the results files of each (newest first)."""
    out: dict[str, dict[str, Script]] = {}
    for init in sorted(BENCHMARKS.glob("*/__init__.py")):
        group = init.parent.name
        if group in NOT_GROUPS:
            continue
        out[group] = {p.stem: Script(group, p.stem, docstring(p)) for p in sorted(init.parent.glob("*.py"))
                      if p.stem != "__init__"}
    return out


def load(results_dir: Path, tree: dict[str, dict[str, Script]]) -> list[tuple[str, dict[str, Any]]]:
    """Every results file, checked, filed under its script (ValueError naming a file that fits none)."""
    docs = [(p.name, results.read(p)) for p in sorted(results_dir.glob("*.json"))]
    for name, doc in docs:
        group, _, script = doc["benchmark"].partition(".")
        if script not in tree.get(group, {}):
            raise ValueError(f"{results_dir / name}: benchmark {doc['benchmark']!r} is no script of benchmarks/")
        tree[group][script].files.append((name, doc))
    for scripts in tree.values():
        for s in scripts.values():
            s.files.sort(key=lambda f: (f[1]["date"], f[0]), reverse=True)
    return docs


def file_section(name: str, doc: dict[str, Any]) -> list[str]:
    m = doc["machine"]
    title = f"{m.get('gpu') or m['cpu']} ({m['vector_class']}) · {doc['date']}" + (
        f" · {doc['label']}" if doc.get("label") else "")
    out = ["", f"### {title}", "", f"`benchmarks/results/{name}`", "", f"- machine: {tables.machine_line(doc)}",
           f"- rounds: {tables.rounds_line(doc)}"]
    discarded = [r for r in doc["rounds"] if not r["kept"]]
    out += [f"  - discarded: round {r['index'] + 1}"
            + "".join(f" {k}={v}" for k, v in r.items() if k not in ("index", "probe", "kept", "discarded", "data"))
            + f": {r['discarded']}" for r in discarded]
    if doc["settings"]:
        out.append(f"- settings: {tables.settings_line(doc['settings'])}")
    out += [f"- note: {n}" for n in doc.get("notes", [])]
    out += [""] + tables.tables(doc["rows"]) if doc["rows"] else ["", "No rows."]
    return out


def group_page(group: str, scripts: dict[str, Script]) -> str:
    intro = docstring(BENCHMARKS / group / "__init__.py")
    title, _, rest = intro.partition(":")
    rest = " ".join(rest.split())
    out = [GENERATED, "", f"# {title.strip()}", "", rest[:1].upper() + rest[1:], "",
           "How the rounds are judged and what a results file holds: [the index](index.md)."]
    for s in scripts.values():
        out += ["", f"## {s.name}", "", f"`python -m benchmarks.{group}.{s.name}` (`--help` for its options)", "",
                first_paragraph(s.doc)]
        if not s.files:
            out += ["", "No results yet."]
        for name, doc in s.files:
            out += file_section(name, doc)
    return "\n".join(out) + "\n"


def index_page(tree: dict[str, dict[str, Script]], docs: list[tuple[str, dict[str, Any]]]) -> str:
    probe = (docstring(BENCHMARKS / "harness" / "probe.py")).split("\n\n")
    layout = (results.__doc__ or "").split("\n\n")
    out = [GENERATED, "", "# Performance", "", first_paragraph(docstring(BENCHMARKS / "__init__.py")), "",
           "## Rounds and the machine probe", "", " ".join(probe[1].split()), "",
           f"The rule: {RULE.describe()}. Every configuration of an interleaved comparison runs in each round, so "
           "a discarded round drops all of them alike. Figures are medians over the kept rounds; where every "
           "round of a series was discarded, the figures use all of them and the file's notes say so. The load "
           "average is recorded, not judged: the benchmark's own threads raise it. Files written before the "
           "harness carry no probe: every round of theirs is kept.", "",
           "## The results files", "", first_paragraph(layout[0]), "", "```", textwrap.dedent(layout[1]).strip(),
           "```", "", " ".join(layout[2].split()), "",
           "## Groups", "", "| group | scripts | results files | newest |", "| --- | ---: | ---: | --- |"]
    for group, scripts in tree.items():
        files = [d for s in scripts.values() for _, d in s.files]
        newest = max((d["date"] for d in files), default=tables.DASH)
        out.append(f"| [{group}]({group}.md) | {len(scripts)} | {len(files)} | {newest} |")
    out += ["", "## Machines", "", "| machine | CPU | vector class | cores | GPU | results files |",
            "| --- | --- | --- | ---: | --- | ---: |"]
    machines: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _, d in docs:
        machines[results.machine_slug(d["machine"])].append(d["machine"])
    for slug_, ms in sorted(machines.items()):
        m = ms[0]
        out.append(f"| {slug_} | {m['cpu']} | {m['vector_class']} | {tables.cell(m.get('cores'))} | "
                   f"{m.get('gpu') or tables.DASH} | {len(ms)} |")
    return "\n".join(out) + "\n"


def headline_table(tree: dict[str, dict[str, Script]]) -> str:
    out = ["| measure | gptport | reference | ratio | machine | results |", "| --- | ---: | ---: | ---: | --- | --- |"]
    for h in HEADLINES:
        group, _, script = h.benchmark.partition(".")
        files = [(n, d) for n, d in tree[group][script].files if d.get("label", "") == h.label]
        if not files:
            raise ValueError(f"README headline {h.measure!r}: no results file of {h.benchmark}")
        name, doc = files[0]
        rows = [r for r in doc["rows"] if all(r.get(k) == v for k, v in h.where.items())]
        if not rows:
            raise ValueError(f"README headline {h.measure!r}: no row {h.where} in benchmarks/results/{name}")
        r, m = rows[0], doc["machine"]
        ratio = f"{r[h.ratio]:.2f}×" if h.ratio else ""
        ref = tables.cell(r[h.reference]) if h.reference else ""
        out.append(f"| {h.measure} | {tables.cell(r[h.value])} | {ref} | {ratio} | {m.get('gpu') or m['cpu']} "
                   f"({m['vector_class']}), {doc['date']} | [{group}](docs/performance/{group}.md) |")
    return "\n".join(out)


def readme_with(text: str, table: str) -> str | None:
    """README.md's text with `table` between the markers; None where it lacks them."""
    if START not in text or END not in text or text.index(START) > text.index(END):
        return None
    head, _, tail = text.partition(START)
    _, _, tail = tail.partition(END)
    return f"{head}{START}\n{GENERATED}\n\n{table}\n\n{END}{tail}"


def render(results_dir: Path, docs_dir: Path, readme: Path, check: bool) -> int:
    tree = groups()
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    try:
        docs = load(results_dir, tree)
        pages = {docs_dir / "index.md": index_page(tree, docs)}
        pages |= {docs_dir / f"{g}.md": group_page(g, s) for g, s in tree.items()}
        new_readme = readme_with(text, headline_table(tree)) if START in text else None
    except ValueError as e:
        print(f"render: {e}", file=sys.stderr)
        return 1
    if new_readme is None:
        print(f"render: {readme.name} has no {START} ... {END} markers: its headline table is not rendered",
              file=sys.stderr)
    else:
        pages[readme] = new_readme
    if check:
        stale = [p for p, t in pages.items() if not p.is_file() or p.read_text(encoding="utf-8") != t]
        stale += sorted(p for p in docs_dir.glob("*.md") if p not in pages)
        for p in stale:
            print(f"render --check: {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p} differs from what "
                  f"benchmarks/results/ gives; run python -m benchmarks.render", file=sys.stderr)
        return 1 if stale else 0
    docs_dir.mkdir(parents=True, exist_ok=True)
    for p in sorted(docs_dir.glob("*.md")):
        if p not in pages:
            p.unlink()
    for p, t in pages.items():
        if not p.is_file() or p.read_text(encoding="utf-8") != t:
            write_text(p, t)
            print(f"wrote {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}")
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each page that differs")
    ap.add_argument("--results", type=Path, default=results.RESULTS, help="the results files' folder")
    ap.add_argument("--docs", type=Path, default=DOCS, help="the pages' folder")
    ap.add_argument("--readme", type=Path, default=README, help="the README whose headline table is rendered")
    args = ap.parse_args()
    sys.exit(render(args.results, args.docs, args.readme, args.check))


if __name__ == "__main__":
    main()
