"""import-hf's weights, streamed: the family's plan (gptport/arch/) checked against the shards' headers before a
weight is read (every tensor it names present with the shape config.json implies and a float type, none left
over), then each of gptport's tensors written into model.safetensors from its sources' bytes, read by their
offsets a chunk at a time (q|k|v one after another: stacking along the first axis is writing them in turn; a
vocabulary cut is its first rows' bytes). A tensor keeps its source's type (bf16, fp16, fp32); one whose sources
mix types, and a Gemma norm's 1 + w, is widened to float32. Only a transposed source (GPT-2's Conv1D) is held
whole, one matrix at a time. No torch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from gptport.arch.base import Family, Planned, take
from gptport.config import ModelConfig
from gptport.errors import ArtifactError, escaped
from gptport.export.hf_files import Held, read_bytes
from gptport.safetensors_file import DTYPE_BITS
from gptport.safetensors_stream import Out, ordered
from gptport.weights import widen

CHUNK = 16 * 2**20  # source bytes read at a time


def out_dtype(dtypes: list[str]) -> str:
    """The type a tensor is written in: its sources' when they agree, else float32 (bf16 and fp16 hold each
    other's values no better than float32 holds both)."""
    return dtypes[0] if len(set(dtypes)) == 1 else "F32"


def _converted(raw: np.ndarray, source: str, dtype: str) -> np.ndarray:
    return raw if source == dtype else widen(raw, source)


def _chunks(planned: Planned, dtype: str, held: dict[str, Held]) -> Iterator[np.ndarray]:
    """gptport's tensor's bytes in order, from its parts, CHUNK source bytes at a time (a part that is transposed
    or permuted comes whole)."""
    for part in planned.parts:
        h = held[part.name]
        if part.transposed or part.heads is not None or part.plus_one:
            raw = read_bytes(h, 0, h.entry.end - h.entry.begin)
            whole = take(part, widen(raw, h.entry.dtype).reshape(part.shape))
            yield np.ascontiguousarray(whole, dtype=np.float32) if dtype == "F32" else _narrowed(whole, dtype)
            continue
        row = int(np.prod(part.shape[1:], dtype=np.int64)) * DTYPE_BITS[h.entry.dtype] // 8
        rows, step = part.out_rows, max(1, CHUNK // max(row, 1))
        for start in range(0, rows, step):
            n = min(step, rows - start)
            yield _converted(read_bytes(h, (part.start + start) * row, n * row), h.entry.dtype, dtype)


def _narrowed(a: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values that came from `dtype` back in it (exact: they were widened from it)."""
    if dtype == "F16":
        return a.astype("<f2")
    return (np.ascontiguousarray(a, dtype="<f4").view("<u4") >> 16).astype("<u2")  # bf16: the high half


def outs(family: Family, cfg: ModelConfig, vocab_rows: int, held: dict[str, Held], where: Path) -> list[Out]:
    """model.safetensors' tensors for `cfg` from the shards `held` (hf_files.read_headers), in the order they are
    written, each checked against the plan first: a tensor missing, of another shape or left over is refused
    naming it and its shard, before anything is read."""
    by_name = {family.canonical(name): h for name, h in held.items()}
    used: set[str] = set()
    out = []
    for planned in family.hf_plan(cfg, vocab_rows):
        for part in planned.parts:
            h = by_name.get(part.name)
            if h is None:
                raise ArtifactError(f"{where}: no tensor {part.name}, which this config.json's model has")
            if h.entry.shape != part.shape:
                raise ArtifactError(f"{h.path}: tensor {escaped(h.entry.name)} has shape {list(h.entry.shape)}; "
                                    f"config.json's model needs {list(part.shape)} (gptport's {planned.name})")
            used.add(part.name)
        dtype = out_dtype([by_name[p.name].entry.dtype for p in planned.parts])
        dtype = "F32" if any(p.plus_one for p in planned.parts) else dtype  # 1 + w kept whole
        out.append(Out(planned.name, dtype, planned.shape,
                       lambda p=planned, d=dtype: _chunks(p, d, by_name)))  # type: ignore[misc]
    head = family.hf_layout.globals["lm_head"] + ".weight"  # a tied head saved anyway: read past (wte is kept)
    left = sorted(n for n in set(by_name) - used
                  if not n.endswith(family.hf_skipped) and not (cfg.tie_embeddings and n == head))
    if left:
        raise ArtifactError(f"{by_name[left[0]].path}: tensor {escaped(by_name[left[0]].entry.name)} is not one "
                            "this config.json's model has")
    return ordered(out)
