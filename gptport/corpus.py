"""Streaming corpus reading: files, directories and stdin, decoded as UTF-8 with errors that name
the file and byte offset. Memory stays bounded: text is read in blocks and handed on in chunks."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

from gptport.errors import InputError, UsageError

EncodingErrors = Literal["strict", "replace"]
STDIN = "-"
BLOCK_BYTES = 1 << 20  # read size; chunks handed on are cut at newlines inside a block
CHUNK_BYTES = 16 << 10  # items of ~16 KiB keep the tokenizers trainer's parallel batches busy
_MAX_CARRY = 8 * BLOCK_BYTES  # a line longer than this is cut at a UTF-8 boundary instead


@dataclass(frozen=True)
class Source:
    """One document of the corpus: a file, or stdin when `path` is None."""

    path: Path | None
    size: int | None  # bytes, when known before reading

    @property
    def name(self) -> str:
        return "<stdin>" if self.path is None else str(self.path)


@dataclass
class CorpusStats:
    """What reading the corpus saw; filled in as chunks are consumed."""

    documents: int = 0
    bytes: int = 0
    replaced_bytes: int = 0
    sha256: hashlib._Hash = field(default_factory=hashlib.sha256, repr=False)


def resolve_sources(inputs: Sequence[str | os.PathLike[str]], glob: str = "*.txt") -> list[Source]:
    """Expand files, directories (recursively, files matching `glob`) and '-' (stdin) into sources."""
    if not inputs:
        raise UsageError("no corpus given: pass one or more files, directories, or '-' for stdin")
    sources: list[Source] = []
    for raw in inputs:
        if str(raw) == STDIN:
            sources.append(Source(None, None))
            continue
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob(glob) if p.is_file())
            if not found:
                raise InputError(f"{path}: directory holds no files matching --glob {glob!r}")
            sources.extend(Source(p, p.stat().st_size) for p in found)
        elif path.is_file():
            sources.append(Source(path, path.stat().st_size))
        elif path.exists():
            raise InputError(f"{path}: not a regular file or directory")
        else:
            raise InputError(f"{path}: no such file or directory")
    if sum(s.path is None for s in sources) > 1:
        raise UsageError("'-' (stdin) can be given only once")
    return sources


def _utf8_cut(buf: bytes) -> int:
    """The largest index <= len(buf) that does not split a multi-byte UTF-8 character."""
    end = len(buf)
    i = end - 1
    while i > max(end - 4, 0) and (buf[i] & 0xC0) == 0x80:  # continuation bytes
        i -= 1
    return i if i >= 0 and buf[i] >= 0xC0 else end


def _blocks(stream: BinaryIO, block_bytes: int) -> Iterator[tuple[int, bytes]]:
    """Yield (offset, bytes) pieces of the stream that end after a newline (or at a char boundary)."""
    carry = b""
    offset = 0
    while True:
        data = stream.read(block_bytes)
        if not data:
            if carry:
                yield offset, carry
            return
        buf = carry + data if carry else data
        cut = buf.rfind(b"\n") + 1
        if cut == 0:
            if len(buf) < _MAX_CARRY:
                carry = buf
                continue
            cut = _utf8_cut(buf)
        yield offset, buf[:cut]
        offset += cut
        carry = buf[cut:]


def _decode_replacing(data: bytes) -> tuple[str, int]:
    """Decode with U+FFFD for invalid bytes; return the text and how many input bytes were replaced."""
    text = data.decode("utf-8", "replace")
    inserted = text.count("\ufffd") - data.count("\ufffd".encode())
    kept = len(text.encode("utf-8")) - 3 * inserted
    return text, len(data) - kept


class CorpusReader:
    """Iterates the text of a corpus chunk by chunk, one document (file or stdin) after another.

    Chunks end on line boundaries where lines allow it; `stats` counts documents, bytes, replaced bytes
    and the sha256 of everything read, as the iteration goes.
    """

    def __init__(
        self,
        sources: Sequence[Source],
        encoding_errors: EncodingErrors = "strict",
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        if encoding_errors not in ("strict", "replace"):
            raise UsageError(f"--encoding-errors must be 'strict' or 'replace', not {encoding_errors!r}")
        self.sources = list(sources)
        self.encoding_errors = encoding_errors
        self.chunk_bytes = chunk_bytes
        self.stats = CorpusStats()

    @property
    def known_bytes(self) -> int | None:
        """Total size when every source has a known size (not stdin), for progress bars."""
        sizes = [s.size for s in self.sources]
        return None if any(s is None for s in sizes) else sum(sizes)  # type: ignore[misc]

    def documents(self) -> Iterator[tuple[Source, Iterator[str]]]:
        """Yield each source with an iterator over its text chunks."""
        for source in self.sources:
            self.stats.documents += 1
            yield source, self._chunks(source)

    def chunks(self) -> Iterator[str]:
        """All text chunks of all documents, in order."""
        for _, chunks in self.documents():
            yield from chunks

    def _chunks(self, source: Source) -> Iterator[str]:
        if source.path is None:
            yield from self._decode_stream(source, sys.stdin.buffer)
            return
        try:
            with open(source.path, "rb") as f:
                yield from self._decode_stream(source, f)
        except PermissionError as e:
            raise InputError(f"{source.name}: permission denied") from e

    def _decode_stream(self, source: Source, stream: BinaryIO) -> Iterator[str]:
        stats = self.stats
        for offset, data in _blocks(stream, BLOCK_BYTES):
            stats.bytes += len(data)
            stats.sha256.update(data)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as e:
                if self.encoding_errors == "strict":
                    raise InputError(
                        f"{source.name}: not valid UTF-8 at byte offset {offset + e.start} "
                        f"({e.reason}); pass --encoding-errors replace to substitute U+FFFD"
                    ) from None
                text, replaced = _decode_replacing(data)
                stats.replaced_bytes += replaced
            yield from _split(text, self.chunk_bytes)


def _split(text: str, chunk_chars: int) -> Iterator[str]:
    """Cut `text` into pieces of about `chunk_chars`, at newlines where there are any."""
    start, n = 0, len(text)
    while n - start > chunk_chars:
        cut = text.rfind("\n", start, start + chunk_chars) + 1
        if cut <= start:
            cut = start + chunk_chars
        yield text[start:cut]
        start = cut
    if start < n:
        yield text[start:]


def default_corpus() -> tuple[list[Source], int]:
    """The corpus every Python installation carries: the standard library's own source files of the
    running interpreter (site-packages excluded). Returns the UTF-8 ones and how many were skipped."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    sources, skipped = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "dist-packages" in path.parts or not path.is_file():
            continue
        try:
            path.read_bytes().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            skipped += 1
            continue
        sources.append(Source(path, path.stat().st_size))
    if not sources:
        raise InputError(f"{root}: no standard-library sources found to use as the default corpus")
    return sources, skipped
