"""The benchmark suite as a suite: every script under benchmarks/<group>/ imports and answers --help as a
module; the machine probe and the rule that discards disturbed rounds; the results layout and its writer;
the performance pages and the README's table are what benchmarks/results/ gives (render --check)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import render
from benchmarks.harness import results
from benchmarks.harness.probe import RULE, RoundProbe, Rule, cpu_ticks, steal_share
from benchmarks.harness.run import Run

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(f"benchmarks.{p.parent.name}.{p.stem}" for p in (ROOT / "benchmarks").glob("*/*.py")
                 if p.stem != "__init__" and p.parent.name != "harness")


def test_the_tree_has_the_groups_and_scripts() -> None:
    assert len(SCRIPTS) >= 20
    groups = {s.split(".")[1] for s in SCRIPTS}
    assert {"decode", "serve", "stress", "export", "train", "tokenizer", "gpu"} <= groups
    for group in groups:
        assert (ROOT / "benchmarks" / group / "__init__.py").is_file(), group


@pytest.mark.parametrize("module", SCRIPTS)
def test_script_imports_and_answers_help(module: str) -> None:
    mod = importlib.import_module(module)
    assert mod.__doc__ and f"python -m {module}" in mod.__doc__, f"{module}: its docstring shows how to run it"
    assert callable(mod.main)
    run = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage:") and "--results" in run.stdout and "--label" in run.stdout


def probe(bw: float | None, steal: float | None = 0.0) -> dict[str, float | None] | None:
    return None if bw is None else {"bandwidth_gb_s": bw, "steal": steal}


def test_rule_discards_low_bandwidth_and_high_steal() -> None:
    rule = Rule(min_bandwidth_share=0.8, max_steal=0.05)
    why = rule.judge([probe(40), probe(39), probe(32.7), probe(41), probe(40, 0.06), probe(40, None), probe(None)])
    assert [bool(w) for w in why] == [False, False, True, False, True, False, False]
    assert "32.7 GB/s < 80% of the run's best 41.0" in why[2]
    assert "steal 6.0% > 5%" in why[4]
    assert rule.judge([probe(30, 0.2)]) == ["steal 20.0% > 5%"]  # alone, it is its own best
    assert "80%" in RULE.describe() and "5%" in RULE.describe()


def test_steal_share_from_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 1 2 3\n")
    assert cpu_ticks(stat) == (35, 1000)
    assert steal_share((35, 1000), (45, 1200)) == pytest.approx(0.05)
    assert steal_share(None, (45, 1200)) is None and steal_share((45, 1200), (45, 1200)) is None
    stat.write_text("cpu  100 0 50 800\n")  # a kernel without the steal column
    assert cpu_ticks(stat) is None
    assert cpu_ticks(tmp_path / "absent") is None


def test_a_real_round_probe() -> None:
    p = RoundProbe(mib=8).finish()
    assert p["bandwidth_gb_s"] > 0 and p["loadavg_1m_start"] >= 0 and p["seconds"] >= 0
    assert p["steal"] is None or 0 <= p["steal"] <= 1


def test_run_keeps_the_undisturbed_rounds_and_says_when_none_is() -> None:
    run = Run(probe_mib=8, log=lambda _: None)
    for shape in ("small", "big"):
        for rnd in run.series(3, shape=shape):
            rnd.data["tok_s"] = 100 + rnd.index
    assert [r.index for r in run.rounds] == [0, 1, 2, 0, 1, 2]
    for r, (bw, steal) in zip(run.rounds, [(40, 0), (20, 0), (40, 0), (40, 0.5), (40, 0.5), (40, 0.5)], strict=True):
        r.probe = {"bandwidth_gb_s": bw, "steal": steal}
    run.judge()
    assert run.values("tok_s", shape="small") == [100, 102]
    assert not run.notes
    assert run.values("tok_s", shape="big") == [100, 101, 102]  # all disturbed: every one, and a note
    assert run.notes and "shape" in run.notes[0]
    records = run.records()
    assert records[1]["kept"] is False and "bandwidth" in records[1]["discarded"]
    assert records[0]["shape"] == "small" and records[0]["data"] == {"tok_s": 100}


def test_round_order_alternates_and_rotates() -> None:
    run = Run(probe_mib=8, log=lambda _: None)
    orders = [(r.order("ab"), r.rotation("abc")) for r in run.series(3)]
    assert orders == [(["a", "b"], ["a", "b", "c"]), (["b", "a"], ["b", "c", "a"]), (["a", "b"], ["c", "a", "b"])]


def test_writer_writes_the_layout_atomically(tmp_path: Path) -> None:
    run = Run(probe_mib=8, log=lambda _: None)
    for rnd in run.series(2, shape="tiny"):
        rnd.data["ms"] = 1.5
    doc = results.document("decode.span", run, [{"shape": "tiny", "ms": 1.5}], {"rounds": 2}, label="Busy Spell")
    path = results.write(doc, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    slug = results.machine_slug(doc["machine"])
    assert path.name == f"decode-span-{slug}-{doc['date'].replace('-', '')}-busy-spell.json"
    got = results.read(path)
    assert set(got) == {*results.REQUIRED, "label"}
    assert {"cpu", "vector_class", "cores"} <= set(got["machine"])
    assert {"gptport", "onnxruntime", "python"} <= set(got["versions"])
    assert [r["probe"]["bandwidth_gb_s"] > 0 for r in got["rounds"]] == [True, True]
    assert got["rows"] == [{"shape": "tiny", "ms": 1.5}]


def test_writer_names_no_folder_of_this_machine(tmp_path: Path) -> None:
    run = Run(probe_mib=8, log=lambda _: None)
    with run.round(shape="tiny") as rnd:
        rnd.data["error"] = f'File "{results.ROOT / "gptport" / "cli.py"}", in {Path.home() / "x"}'
    path = results.write(results.document("decode.span", run, [], {}), tmp_path)
    text = path.read_text()
    assert str(results.ROOT) + "/" not in text and str(Path.home()) + "/" not in text
    assert results.read(path)["rounds"][0]["data"]["error"] == 'File "<repo>/gptport/cli.py", in ~/x'
    assert results.anonymized("/a/bc /a/b/d /a/b", {"/a/b": "<x>"}) == "/a/bc <x>/d <x>"  # whole components only


def test_layout_problems_are_named(tmp_path: Path) -> None:
    assert results.validate([]) == ["not a JSON object"]
    good = {"benchmark": "decode.span", "machine": {"cpu": "x", "vector_class": "avx2", "cores": 2},
            "versions": {"gptport": "1", "onnxruntime": "1", "python": "3"}, "commit": None, "date": "2026-01-02",
            "settings": {}, "rounds": [], "rows": []}
    assert results.validate(good) == []
    assert results.validate({**good, "extra": 1}) == ["unknown key 'extra'"]
    assert results.validate({k: v for k, v in good.items() if k != "rows"}) == ["no 'rows'"]
    assert results.validate({**good, "date": "yesterday"}) == ["date 'yesterday' is not YYYY-MM-DD"]
    assert results.validate({**good, "benchmark": "span"}) == ["benchmark 'span' is not <group>.<name>"]
    assert results.validate({**good, "rounds": [{"index": 0}]}) == ["rounds[0] lacks index, probe or kept"]
    with pytest.raises(ValueError, match="results of decode.span: no 'rows'"):
        results.write({k: v for k, v in good.items() if k != "rows"}, tmp_path)
    misnamed = tmp_path / "span.json"
    misnamed.write_text(json.dumps(good))
    with pytest.raises(ValueError, match="named span.json, its contents say decode-span-x-avx2-20260102.json"):
        results.read(misnamed)


def test_render_check_passes_on_the_committed_tree() -> None:
    run = subprocess.run([sys.executable, "-m", "benchmarks.render", "--check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_render_check_names_the_page_a_changed_result_changes(tmp_path: Path) -> None:
    src = ROOT / "benchmarks" / "results"
    res, docs, readme = tmp_path / "results", tmp_path / "docs", tmp_path / "README.md"
    res.mkdir()
    name = sorted(src.glob("decode-span-*.json"))[0].name
    (res / name).write_text((src / name).read_text())
    readme.write_text("no markers here\n")
    assert render.render(res, docs, readme, check=False) == 0
    assert sorted(p.name for p in docs.iterdir()) == sorted(["index.md", *(f"{g}.md" for g in render.groups())])
    assert render.render(res, docs, readme, check=True) == 0
    doc = json.loads((res / name).read_text())
    doc["rows"][0]["break_even_steps"] = 12345.0
    (res / name).write_text(json.dumps(doc))
    (docs / "stale.md").write_text("a page no results give\n")
    assert render.render(res, docs, readme, check=True) == 1
    assert "12,345" not in (docs / "decode.md").read_text()  # --check writes nothing
    assert render.render(res, docs, readme, check=False) == 0
    assert "12,345" in (docs / "decode.md").read_text() and not (docs / "stale.md").exists()


def test_render_check_output_names_pages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res, docs = tmp_path / "results", tmp_path / "docs"
    res.mkdir()
    assert render.render(res, docs, tmp_path / "README.md", check=True) == 1
    err = capsys.readouterr().err
    assert "index.md differs" in err and "decode.md differs" in err and "has no <!-- figures:start -->" in err


def test_readme_table_goes_between_the_markers_only() -> None:
    text = "head\n<!-- figures:start -->\nold figures\n<!-- figures:end -->\ntail\n"
    got = render.readme_with(text, "| new |")
    assert got is not None and got.startswith("head\n<!-- figures:start -->\n") and got.endswith(
        "\n| new |\n\n<!-- figures:end -->\ntail\n")
    assert "old figures" not in got
    assert render.readme_with("no markers\n", "| new |") is None


def test_a_results_file_of_no_script_is_refused(tmp_path: Path) -> None:
    res = tmp_path / "results"
    res.mkdir()
    doc = {"benchmark": "decode.nothing", "machine": {"cpu": "x", "vector_class": "avx2", "cores": 2},
           "versions": {"gptport": "1", "onnxruntime": "1", "python": "3"}, "commit": None, "date": "2026-01-02",
           "settings": {}, "rounds": [], "rows": []}
    (res / results.file_name(doc)).write_text(json.dumps(doc))
    assert render.render(res, tmp_path / "docs", tmp_path / "README.md", check=True) == 1
