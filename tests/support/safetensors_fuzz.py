"""Hostile safetensors files made from a valid one, for tests/base/test_safetensors_hostile.py (through hypothesis:
`files()`) and benchmarks.stress.fuzz_safetensors (through `mutate(seed, random.Random(i))`): one mutation function
drawing from a Random, so that hypothesis records and shrinks each choice and the benchmark replays a case from its
number. What it mutates: the header length (extremes, off by one, the file's size), the header's JSON (offsets,
shapes and dtypes rewritten or swapped between tensors, a key twice, an array for the object, deep nesting, bytes
that are no UTF-8), bytes flipped anywhere, the file cut short or grown. `classify` reads a file with a reader and
says what happened: read, refused in one line naming the file, or anything else (a finding)."""

from __future__ import annotations

import json
import random
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st
from safetensors.numpy import save_file

from gptport.errors import GptportError

EXTREMES = (0, 1, 7, 8, 2**31 - 1, 2**32 - 1, 2**32, 2**40, 2**53 + 1, 2**63 - 1, 2**64 - 1)
DTYPES = ("F64", "F32", "F16", "BF16", "I8", "U8", "BOOL", "F4", "F6_E2M3", "F8_E8M0", "C64", "Q9", "", "f32", 7,
          None, ["F32"])
SHAPES = ([], [0], [1], [16], [4, 4], [2, 8], [4, 5], [2**32, 2**32], [2**40, 2**40], [-1, 16], [0, 2**62],
          ["4", 4], [4.0, 4], [True, 16], [1] * 70 + [16], None, 16)
OFFSETS = (0, 1, 7, 24, 64, 88, 100, 101, 2**32, 2**40, 2**64, -1, 1.5, "8", None, True)


def seed_bytes() -> bytes:
    """A small valid file: three tensors (F32 and F16, the float types import-hf widens) and a __metadata__."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "seed.safetensors"
        save_file({"a": np.arange(16, dtype=np.float32).reshape(4, 4), "b": np.arange(6, dtype=np.float32),
                   "c": np.ones((2, 3), np.float16)}, str(path), metadata={"format": "pt"})
        return path.read_bytes()


def split(data: bytes) -> tuple[dict[str, Any], bytes]:
    """A valid file's header (as JSON) and data section."""
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def joined(header_text: bytes, body: bytes) -> bytes:
    return struct.pack("<Q", len(header_text)) + header_text + body


def _edit_header(header: dict[str, Any], rnd: random.Random) -> None:
    """One change to the header's JSON object, in place."""
    names = [k for k in header if k != "__metadata__"]
    entry = header[rnd.choice(names)]
    what = rnd.randrange(7)
    if what == 0:
        entry["data_offsets"][rnd.randrange(2)] = rnd.choice(OFFSETS)
    elif what == 1:
        entry["shape"] = rnd.choice(SHAPES)
    elif what == 2:
        entry["dtype"] = rnd.choice(DTYPES)
    elif what == 3:  # two tensors' offsets (or dtypes) swapped
        other = header[rnd.choice(names)]
        field = rnd.choice(("data_offsets", "dtype", "shape"))
        entry[field], other[field] = other[field], entry[field]
    elif what == 4:
        del entry[rnd.choice(("dtype", "shape", "data_offsets"))]
    elif what == 5:
        header["__metadata__"] = rnd.choice(({"k": 1}, {"k": None}, [], "x", {"a\nb": "c"}, {}))
    else:  # a tensor renamed: a newline, an empty name, the metadata key's
        header[rnd.choice(("x\ny", "", "__metadata__ ", "é" * 3))] = header.pop(rnd.choice(names))


def _edit_text(text: bytes, rnd: random.Random) -> bytes:
    """One change to the header's JSON text itself."""
    what = rnd.randrange(5)
    if what == 0:
        return text.replace(b"{", b"[", 1)
    if what == 1:  # a tensor listed twice
        first = text.index(b'"a"')
        return text[:-1] + b"," + text[first:text.index(b"}", first) + 1] + b"}"
    if what == 2:
        return text[:-1] + b', "deep": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    if what == 3:
        return text.replace(b'"a"', b'"\xff\xfe"', 1)
    return text + rnd.choice((b" " * 4, b"\x00", b"}", b"\n"))


def mutate(seed: bytes, rnd: random.Random) -> bytes:
    """One hostile file from `seed`, every choice drawn from `rnd` (one to three mutations in a row)."""
    data = seed
    for _ in range(rnd.randint(1, 3)):
        data = _mutate_once(data, rnd)
    return data


def _mutate_once(data: bytes, rnd: random.Random) -> bytes:
    what = rnd.randrange(6)
    if len(data) < 8:
        what = 4
    if what == 0:
        (n,) = struct.unpack("<Q", data[:8])
        return struct.pack("<Q", rnd.choice((*EXTREMES, n - 1 if n else 0, n + 1, len(data), len(data) - 8))) + data[8:]
    if what == 1:
        out = bytearray(data)
        for _ in range(rnd.randint(1, 8)):
            out[rnd.randrange(len(out))] = rnd.randrange(256)
        return bytes(out)
    if what == 2:
        return data[:rnd.randrange(len(data))]
    if what == 3:
        return data + bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 16)))
    try:
        header, body = split(data)
        if what == 4 and isinstance(header, dict) and any(k != "__metadata__" for k in header):
            _edit_header(header, rnd)
            return joined(json.dumps(header).encode(), body)
        return joined(_edit_text(json.dumps(header).encode(), rnd), body)
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, struct.error):  # a mutation broke it before
        return bytes(rnd.randrange(256) for _ in range(8)) + data[8:]


def files(seed: bytes | None = None) -> st.SearchStrategy[bytes]:
    """Hypothesis's strategy of hostile files: `mutate` driven by a Random hypothesis controls (and shrinks)."""
    original = seed_bytes() if seed is None else seed
    return st.randoms(use_true_random=False).map(lambda rnd: mutate(original, rnd))


def classify(read: Callable[[Path], object], path: Path) -> tuple[str, str]:
    """("read", "") / ("refused", the message) / ("crashed", what): a refusal must be a GptportError of one line
    naming the file, else it counts as crashed, as does any other exception (what a user would see as a
    traceback)."""
    try:
        read(path)
    except GptportError as e:
        message = str(e)
        if "\n" in message or "\r" in message or str(path) not in message:
            return "crashed", f"refusal not one line naming the file: {message[:300]!r}"
        return "refused", message
    except Exception as e:  # noqa: BLE001 - what the fuzz looks for: any other exception is a finding
        return "crashed", f"{type(e).__name__}: {str(e)[:300]!r}"
    return "read", ""
