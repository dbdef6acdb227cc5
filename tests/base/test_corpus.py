"""Corpus streaming: chunks reassemble the text exactly, errors name the file and byte offset."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from gptport import corpus
from gptport.corpus import CorpusReader, resolve_sources
from gptport.errors import InputError, UsageError


def test_chunks_reassemble_the_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "BLOCK_BYTES", 64)
    monkeypatch.setattr(corpus, "_MAX_CARRY", 256)
    text = ("héllo wörld 日本語 🙂\n" * 50) + ("x" * 1000) + "é" * 300 + "\n tail without newline"
    path = tmp_path / "a.txt"
    path.write_text(text, encoding="utf-8")
    reader = CorpusReader(resolve_sources([path]), chunk_bytes=40)
    chunks = list(reader.chunks())
    assert "".join(chunks) == text
    assert len(chunks) > 10
    assert reader.stats.bytes == len(text.encode("utf-8"))
    assert reader.stats.documents == 1


def test_strict_error_names_file_and_byte_offset(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes(("a" * 100 + "\n").encode() * 3 + b"caf\xe9\n")
    with pytest.raises(InputError, match=r"latin1\.txt: not valid UTF-8 at byte offset 306"):
        list(CorpusReader(resolve_sources([path])).chunks())


def test_replace_counts_replaced_bytes(tmp_path: Path) -> None:
    path = tmp_path / "mixed.txt"
    path.write_bytes(b"ok \xef\xbf\xbd genuine\ncaf\xe9 and \xff\xfe\n")
    reader = CorpusReader(resolve_sources([path]), encoding_errors="replace")
    text = "".join(reader.chunks())
    assert text == "ok \ufffd genuine\ncaf\ufffd and \ufffd\ufffd\n"
    assert reader.stats.replaced_bytes == 3


def test_directories_are_searched_recursively_with_the_glob(tmp_path: Path) -> None:
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "b.txt").write_text("b")
    (tmp_path / "sub" / "deeper" / "a.txt").write_text("a")
    (tmp_path / "sub" / "c.md").write_text("c")
    names = [s.path.name for s in resolve_sources([tmp_path]) if s.path]
    assert sorted(names) == ["a.txt", "b.txt"]
    assert [s.path.name for s in resolve_sources([tmp_path], glob="*.md") if s.path] == ["c.md"]


def test_bad_sources_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="missing.txt: no such file"):
        resolve_sources([tmp_path / "missing.txt"])
    with pytest.raises(InputError, match="no files matching"):
        resolve_sources([tmp_path])
    with pytest.raises(UsageError):
        resolve_sources([])
    with pytest.raises(UsageError, match="stdin"):
        resolve_sources(["-", "-"])


def test_stdin_is_a_document(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("from stdin ✓\n".encode())))
    reader = CorpusReader(resolve_sources(["-"]))
    assert reader.known_bytes is None
    assert "".join(reader.chunks()) == "from stdin ✓\n"
