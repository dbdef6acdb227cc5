"""The CLI contract: --version, examples in --help, one-line errors with exit codes, nothing half-written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup, TyperOption

from gptport import __version__, arch
from gptport.cli.main import app
from tests.support.cli import assert_one_line_error, gptport

COMMANDS = typer.main.get_command(app)  # the click command Typer builds (Typer carries its own click)
assert isinstance(COMMANDS, TyperGroup)


def test_version() -> None:
    r = gptport("--version")
    assert r.returncode == 0
    assert r.stdout.strip() == f"gptport {__version__}"


@pytest.mark.parametrize("args", [["--help"], ["train-tokenizer", "--help"]])
def test_help_shows_an_example(args: list[str]) -> None:
    r = gptport(*args)
    assert r.returncode == 0
    assert "gptport train-tokenizer corpus.txt --vocab-size 8192" in r.stdout


def test_train_tokenizer_writes_the_model_dir_and_a_summary(corpus_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "m"
    r = gptport("train-tokenizer", str(corpus_file), "--vocab-size", "300", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""  # status goes to stderr
    for word in ("vocabulary", "300 tokens", "corpus", "compression", "sha256", "MB/s"):
        assert word in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["merges.txt", "tokenizer.json", "tokenizer_config.json",
                                                     "tokenizer_meta.json", "vocab.json"]


def test_stdin_corpus(corpus_file: Path, tmp_path: Path) -> None:
    r = gptport("train-tokenizer", "-", "--vocab-size", "280", "--out", str(tmp_path / "m"),
                stdin=corpus_file.read_text(encoding="utf-8"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "m" / "tokenizer.json").exists()


def test_bad_input_gives_one_line_and_leaves_nothing(tmp_path: Path, corpus_file: Path) -> None:
    out = tmp_path / "out"
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"fine line\ncaf\xe9\n")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    (tmp_path / "nodocs").mkdir()
    cases = [
        ([str(latin1)], 1, [str(latin1), "byte offset 13"]),
        ([str(tmp_path / "missing.txt")], 1, ["missing.txt", "no such file"]),
        ([str(empty)], 1, ["empty corpus", "empty.txt"]),
        ([str(tmp_path / "nodocs")], 1, ["nodocs", "*.txt"]),
    ]
    for corpus, code, needles in cases:
        r = gptport("train-tokenizer", *corpus, "--vocab-size", "300", "--out", str(out))
        assert_one_line_error(r, code, *needles)
        assert not out.exists()
    for bad in ("256", "1000001"):
        r = gptport("train-tokenizer", str(corpus_file), "--vocab-size", bad, "--out", str(out))
        assert_one_line_error(r, 2, f"--vocab-size {bad}")
        assert not out.exists()


def test_replace_goes_on_and_reports(tmp_path: Path, corpus_file: Path) -> None:
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"caf\xe9 cr\xe8me\n")
    r = gptport("train-tokenizer", str(corpus_file), str(latin1), "--vocab-size", "300",
                "--out", str(tmp_path / "m"), "--encoding-errors", "replace")
    assert r.returncode == 0, r.stderr
    assert "2 byte(s) that were not UTF-8" in r.stderr


def test_existing_tokenizer_is_refused_unless_forced(tmp_path: Path, corpus_file: Path) -> None:
    out = tmp_path / "m"
    args = ("train-tokenizer", str(corpus_file), "--vocab-size", "300", "--out", str(out))
    assert gptport(*args).returncode == 0
    before = (out / "tokenizer.json").read_bytes()
    assert_one_line_error(gptport(*args), 1, "already holds tokenizer.json", "--force")
    assert (out / "tokenizer.json").read_bytes() == before
    r = gptport(*args[:3], "290", "--out", str(out), "--force")
    assert r.returncode == 0, r.stderr
    assert (out / "tokenizer.json").read_bytes() != before


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    r = gptport("train-tokenizer", str(tmp_path / "missing.txt"), "--vocab-size", "300",
                "--out", str(tmp_path / "o"), debug=True)
    assert r.returncode != 0
    assert "Traceback" in r.stderr


def test_usage_error_exits_2(tmp_path: Path) -> None:
    r = gptport("train-tokenizer", "x.txt", "--vocab-size", "many", "--out", str(tmp_path))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("name", [None, *COMMANDS.commands])
def test_help_fits_80_columns_with_every_option_whole(name: str | None) -> None:
    """`--help` of the CLI and of each of its commands, in a terminal of 80 columns: every option the
    command declares (read from the click command Typer builds) is printed whole, none cut short, and the
    usage, description and options wrap within the 80 columns (only the examples' commands, printed as
    written, may run past)."""
    command = COMMANDS if name is None else COMMANDS.commands[name]
    params = command.get_params(command.context_class(command, info_name=name))  # --help's option too
    names = [opt for param in params if isinstance(param, TyperOption) for opt in (*param.opts, *param.secondary_opts)]
    assert "--help" in names
    r = gptport(*([name] if name else []), "--help", columns=80)
    assert r.returncode == 0, r.stderr
    for opt in names:
        assert re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", r.stdout), f"{name}: {opt} not whole in --help"
    assert "\u2026" not in r.stdout
    body = re.split(r"\n  Examples?:\n", r.stdout)[0]
    assert [line for line in body.splitlines() if len(line) > 80] == []


def test_import_help_names_every_architecture_read() -> None:
    """import-gguf's argument names each GGUF architecture a family reads, import-hf's each transformers class."""
    for command, names in (("import-gguf", arch.gguf_archs()), ("import-hf", arch.hf_classes())):
        r = gptport(command, "--help", columns=200)
        assert r.returncode == 0, r.stderr
        text = " ".join(r.stdout.split())
        for name in names:
            assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), f"{command} --help: no {name}"
