"""Atomic writes: every artifact is written under a temporary name in its own directory and
renamed into place, so a crash or an error never leaves a half-written file behind."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()  # what open() would give a new file; some writers use 0600
_DIR_MODE = 0o777 & ~_umask()  # what mkdir() would give (tempfile.mkdtemp gives 0700)


def temp_name(path: Path) -> Path:
    """A unique hidden sibling of `path`, on the same filesystem so that the rename is atomic."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces `path`, on error it is removed."""
    target = Path(path)
    tmp = temp_name(target)
    try:
        yield tmp
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` atomically, flushed to disk before the rename."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write UTF-8 `text` to `path` atomically."""
    write_bytes(path, text.encode("utf-8"))


def replace_dir(staged: Path, target: Path) -> None:
    """Put a fully written directory `staged` (a sibling of `target`) in place of `target`: the old one, if
    any, is moved aside first and removed only once the new one is in place."""
    import shutil

    os.chmod(staged, _DIR_MODE)
    old = temp_name(target) if target.exists() else None
    if old is not None:
        os.replace(target, old)
    try:
        os.replace(staged, target)
    except OSError:
        if old is not None:
            os.replace(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
