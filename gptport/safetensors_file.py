"""A safetensors file's header read and checked against the file before any library maps it: every reader of
safetensors (import-hf's shards, a model directory's model.safetensors, export-hf's and export-gguf's reads, the
training checkpoint) calls `read_header` first. The header length is bounded by the file and by MAX_HEADER, the
JSON must be an object without a key twice, each tensor's dtype known, its shape at most MAX_DIMS integers >= 0,
its byte length (computed in Python's integers: no wrap-around) that of its data_offsets, and the tensors must
tile the data section exactly (no overlap, no gap, nothing past the end, nothing after). Refusals are one line
naming the file, the file's own names escaped. No torch, no safetensors import: the base layer."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptport.errors import ArtifactError, escaped, first_line

if TYPE_CHECKING:
    import numpy as np

MAX_HEADER = 100_000_000  # bytes of JSON: the safetensors library's own bound (its HeaderTooLarge)
MAX_DIMS = 8  # no weight has more (a 3-D convolution's has 5); numpy takes at most 64
METADATA = "__metadata__"
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8,
              "F8_E5M2FNUZ": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
              "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64}  # the format's types
NUMPY_DTYPES = frozenset({"BOOL", "U8", "I8", "I16", "U16", "F16", "I32", "U32", "F32", "I64", "U64", "F64", "C64"})


@dataclass(frozen=True)
class Entry:
    """One tensor as the header lists it: its bytes are data[begin:end] of the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


class _Duplicate(ValueError):
    """A key the JSON holds twice (json keeps the last, the library another: which tensor is meant?)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def unreadable(path: Path, e: BaseException) -> ArtifactError:
    """The ArtifactError for a library's exception on `path` (what read_header let through): one line, the
    file's own names in it escaped."""
    return ArtifactError(f"{path}: unreadable ({escaped(first_line(e))})")


def _header_bytes(path: Path) -> tuple[bytes, int]:
    """The header's JSON bytes and the length of the data section after it."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise ArtifactError(f"{path}: not a safetensors file ({size} bytes, fewer than the 8 of its header "
                                    "length)")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ArtifactError(f"{path}: not a safetensors file, or truncated: its header length {n:,} runs past "
                                    f"the end of the file ({size:,} bytes)")
            if n > MAX_HEADER:
                raise ArtifactError(f"{path}: its header length {n:,} is over {MAX_HEADER:,} bytes, the most gptport "
                                    "reads")
            text = f.read(n)
    except OSError as e:
        raise ArtifactError(f"{path}: unreadable ({e.strerror or first_line(e)})") from e
    if len(text) != n:  # the file shrank while read
        raise ArtifactError(f"{path}: truncated while read")
    return text, size - 8 - n


def _parse(path: Path, text: bytes) -> dict[str, Any]:
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except _Duplicate as e:
        raise ArtifactError(f"{path}: its header lists {escaped(str(e))} twice") from None
    except UnicodeDecodeError as e:
        raise ArtifactError(f"{path}: its header is not UTF-8 ({first_line(e)})") from None
    except RecursionError:
        raise ArtifactError(f"{path}: its header's JSON is nested too deep") from None
    except ValueError as e:  # JSONDecodeError, or an integer of thousands of digits
        raise ArtifactError(f"{path}: its header is not valid JSON ({escaped(first_line(e))})") from None
    if not isinstance(header, dict):
        raise ArtifactError(f"{path}: its header is not a JSON object")
    meta = header.pop(METADATA, {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ArtifactError(f"{path}: its {METADATA} must map strings to strings")
    return header


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry(path: Path, name: str, raw: object, dtypes: Collection[str]) -> Entry:
    """One tensor's entry, checked on its own: dtype, shape, data_offsets and the byte length they agree on."""
    where = f"{path}: tensor {escaped(name)}"
    if not isinstance(raw, dict) or not {"dtype", "shape", "data_offsets"} <= set(raw):
        raise ArtifactError(f"{where} is not an object with dtype, shape and data_offsets")
    dtype, shape, offsets = raw["dtype"], raw["shape"], raw["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise ArtifactError(f"{where} has dtype {escaped(repr(dtype))[:40]}, which is no safetensors type")
    if dtype not in dtypes:
        raise ArtifactError(f"{where} is {dtype}, which this reader does not take ({', '.join(sorted(dtypes))})")
    if isinstance(shape, list) and len(shape) > MAX_DIMS:
        raise ArtifactError(f"{where} has {len(shape):,} dimensions (at most {MAX_DIMS})")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise ArtifactError(f"{where} has shape {escaped(repr(shape))[:60]}; expected a list of integers >= 0")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets)
            or offsets[0] > offsets[1]):
        raise ArtifactError(f"{where} has data_offsets {escaped(repr(offsets))[:60]}; expected [begin, end] with "
                            "0 <= begin <= end")
    count = 1
    for d in shape:
        count *= d  # Python's integers: 2**32 x 2**32 is no 0
    bits, held = count * DTYPE_BITS[dtype], offsets[1] - offsets[0]
    if bits != 8 * held:
        size = f"{bits // 8:,}" if bits % 8 == 0 else f"{bits / 8:,}"
        raise ArtifactError(f"{where} is {dtype} of shape {shape} ({size} bytes), but its data_offsets {offsets} "
                            f"hold {held:,}")
    return Entry(name, dtype, tuple(shape), offsets[0], offsets[1])


def read_header(path: Path, dtypes: Collection[str] = DTYPE_BITS.keys()) -> dict[str, Entry]:
    """The tensors of the safetensors file at `path`, by name, checked against the file (the module's
    docstring); `dtypes`: the types the caller can read, any other refused by name. An ArtifactError
    naming the file otherwise. Reads the header alone: bounded by MAX_HEADER whatever the file says."""
    text, data_len = _header_bytes(path)
    entries = [_entry(path, str(name), raw, dtypes) for name, raw in _parse(path, text).items()]
    cursor, previous = 0, ""
    for e in sorted(entries, key=lambda e: (e.begin, e.end)):
        if e.end > data_len:
            raise ArtifactError(f"{path}: tensor {escaped(e.name)} ends at byte {e.end:,} of the data, which holds "
                                f"{data_len:,} (truncated?)")
        if e.begin < cursor:
            raise ArtifactError(f"{path}: tensors {escaped(previous)} and {escaped(e.name)} overlap")
        if e.begin > cursor:
            raise ArtifactError(f"{path}: bytes {cursor:,}..{e.begin:,} of the data belong to no tensor (before "
                                f"{escaped(e.name)})")
        cursor, previous = e.end, e.name
    if cursor != data_len:
        raise ArtifactError(f"{path}: the tensors end at byte {cursor:,} of the data, which holds {data_len:,}")
    return {e.name: e for e in entries}


def data_start(path: Path) -> int:
    """The file offset where the data section starts (8 + the header's length): a tensor's data_offsets count
    from it. For a file read_header has checked."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
    except (OSError, struct.error) as e:
        raise ArtifactError(f"{path}: unreadable ({first_line(e)})") from e
    return 8 + n


def read_numpy(path: Path, dtypes: Collection[str] = NUMPY_DTYPES | {"BF16"}) -> dict[str, np.ndarray]:
    """Every tensor of the file as a numpy array (the safetensors library's numpy API; BF16, which numpy lacks, read
    by its offsets and widened to float32), its header checked first (read_header); what the library still refuses
    is an ArtifactError naming the file too."""
    entries = read_header(path, dtypes)
    import numpy as np
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            out = {k: f.get_tensor(k) for k in f.keys() if entries[k].dtype != "BF16"}  # noqa: SIM118 (no dict)
        start = data_start(path)
        with open(path, "rb") as f:
            for e in (e for e in entries.values() if e.dtype == "BF16"):
                f.seek(start + e.begin)
                raw = f.read(e.end - e.begin)
                if len(raw) != e.end - e.begin:
                    raise ArtifactError(f"{path}: truncated while tensor {escaped(e.name)} was read")
                bits = np.frombuffer(raw, "<u2").astype(np.uint32) << 16  # bf16: float32's high half
                out[e.name] = bits.view(np.float32).reshape(e.shape)
    except (SafetensorError, OSError, TypeError, ValueError) as e:
        raise unreadable(path, e) from e
    return out
