"""Where a graph came from: the sha256 of the weights file and of config.json it was exported from,
recorded in its metadata and compared with the model directory whenever generate, bench, eval or serve
open it (loader.open_graph). And whether the weights are the bytes that were written: config.json records
the sha256 of model.safetensors, which every reader of the weights compares (check_weights). No torch,
no onnxruntime.

A file that is not in the directory (a deployment copy with the ONNX files only) is not compared. The
digest of a large file is cached in digests.json, keyed by its size, mtime and inode, so that opening a
model does not read its weights once more."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

from gptport import __version__, atomic, contract
from gptport.config import read_json
from gptport.errors import ArtifactError
from gptport.paths import CONFIG, DIGESTS, WEIGHTS

CACHED_FROM = 1 << 20  # files smaller than this are hashed every time (config.json: microseconds)
RACY_NS = 2_000_000_000  # a file modified this recently is not cached: a rewrite within the same
# timestamp tick could keep its size and mtime (git's "racy" entries)
SOURCES = ((contract.META_WEIGHTS, WEIGHTS, "weights"), (contract.META_CONFIG_SHA, CONFIG, CONFIG))
WEIGHTS_SHA = "weights_sha256"  # config.json: the sha256 of model.safetensors as written
WEIGHTS_PENDING = "weights_sha256_pending"  # config.json, while new weights are being renamed into place


def file_digest(path: Path) -> str:
    """sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _key(st: os.stat_result) -> dict[str, int]:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def digest(path: Path, fresh: bool = False) -> str:
    """sha256 of `path`; for a large file, through the cache in its directory's digests.json, which is
    rewritten (atomically; silently skipped where the directory is read-only) after each new hash.
    `fresh`: hash the file even when the cache has it (and correct the cache)."""
    st = path.stat()
    if st.st_size < CACHED_FROM:
        return file_digest(path)
    cache_path = path.parent / DIGESTS
    cache = _read_cache(cache_path)
    entry = cache.get(path.name)
    if not fresh and isinstance(entry, dict) and {k: entry.get(k) for k in ("size", "mtime_ns", "ino")} == _key(st):
        return str(entry.get("sha256"))
    sha = file_digest(path)
    if time.time_ns() - st.st_mtime_ns > RACY_NS and _key(path.stat()) == _key(st):
        cache[path.name] = {**_key(st), "sha256": sha}
        with contextlib.suppress(OSError):
            atomic.write_text(cache_path, json.dumps(cache, indent=2) + "\n")
    return sha


def _read_cache(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def sources(model_dir: Path) -> dict[str, str]:
    """The metadata entries naming the weights and config.json of `model_dir`, for export to record:
    hashed afresh (what a graph records must not come from a cache that could be damaged)."""
    out = {}
    for key, name, _ in reversed(SOURCES):  # config.json first: without it there is no model at all
        if not (model_dir / name).is_file():
            raise ArtifactError(f"{model_dir}: no {name}; train a model first (`gptport train`)")
        out[key] = digest(model_dir / name, fresh=True)
    return out


def rebuild_command(graph: Path, precision: str) -> str:
    """The command that writes `graph` again from the directory's current weights."""
    variant = "" if precision == "fp32" else f" --precision fp32,{precision}"
    return f"gptport export {graph.parent}{variant} --force"


def check_contract(graph: Path, meta: Mapping[str, str]) -> None:
    """Refuse a graph of another contract version than this gptport's, or one gptport did not write."""
    version = meta.get(contract.META_CONTRACT)
    expected = f"`gptport export` under contract {contract.CONTRACT_VERSION}"
    if version is None and contract.META_CONFIG not in meta:
        raise ArtifactError(f"{graph}: not a gptport graph (no {contract.META_CONTRACT} metadata); expected one "
                            f"written by {expected}")
    if version != contract.CONTRACT_VERSION:
        raise ArtifactError(f"{graph}: written under gptport's ONNX contract {version or '(none)'} (gptport "
                            f"{meta.get(contract.META_VERSION, '?')}), this gptport {__version__} expects contract "
                            f"{contract.CONTRACT_VERSION}; rebuild it: "
                            f"`{rebuild_command(graph, meta.get(contract.META_PRECISION, 'fp32'))}`")
    if contract.META_CONFIG not in meta:
        raise ArtifactError(f"{graph}: not a gptport export (no {contract.META_CONFIG} metadata); expected one "
                            f"written by {expected}")


def check(model_dir: Path, graph: Path, meta: Mapping[str, str]) -> None:
    """Refuse a graph whose recorded weights or config.json sha256 is not that of the file in
    `model_dir`, or which records none while the file is there; a file that is absent is not compared."""
    precision = meta.get(contract.META_PRECISION, "fp32")
    for key, name, what in SOURCES:
        path = model_dir / name
        if not path.is_file():
            continue
        recorded = meta.get(key, "")
        if not recorded:
            raise ArtifactError(f"{graph} records no {what} sha256 (exported by gptport "
                                f"{meta.get(contract.META_VERSION, '?')}, before graphs recorded their sources); "
                                f"rebuild it: `{rebuild_command(graph, precision)}`")
        current = digest(path)
        if recorded != current:  # before refusing, hash the file itself: digests.json may be damaged
            current = digest(path, fresh=True)
        if recorded != current and name == WEIGHTS and (model_dir / CONFIG).is_file():
            check_weights(model_dir, current)  # damaged weights are said so, not taken for newer ones
        if recorded != current:
            raise ArtifactError(f"{graph} was exported from other {what} (sha256 {recorded[:12]}…) than "
                                f"{path} ({current[:12]}…); rebuild it: `{rebuild_command(graph, precision)}`")


def recorded_weights(model_dir: Path) -> tuple[str, ...]:
    """The sha256 config.json accepts for model.safetensors: the recorded one, and during a checkpoint
    the pending one too; () for a config.json written before weights recorded their sha256."""
    path = model_dir / CONFIG
    data = read_json(path)
    out = []
    for key in (WEIGHTS_SHA, WEIGHTS_PENDING):
        value = data.get(key)
        if value is None:
            continue
        if not (isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)):
            raise ArtifactError(f"{path}: {key} is not a sha256 ({str(value)[:20]!r})")
        out.append(value)
    return tuple(out)


def check_weights(model_dir: Path, current: str = "") -> None:
    """Refuse a model.safetensors whose bytes are not those config.json records. The file is hashed
    afresh (`current`: a sha256 of it already taken so), never looked up in digests.json: a flip on disk
    keeps the size, mtime and inode the cache is keyed by. Weights without a recorded sha256 (directories
    written before it was recorded) and an absent file are not compared."""
    path = model_dir / WEIGHTS
    accepted = recorded_weights(model_dir)
    if not accepted or not path.is_file():
        return
    current = current or digest(path, fresh=True)  # corrects the cache too
    if current not in accepted:
        raise ArtifactError(f"{path}: damaged: its sha256 {current[:12]}… differs from the {accepted[0][:12]}… "
                            f"recorded in {CONFIG} when it was written; restore the directory from a copy or "
                            "train again")


def stale(meta: Mapping[str, str], current: Mapping[str, str]) -> str:
    """Why a graph with metadata `meta` was not made from the `current` sources ("" when it was)."""
    for key, _, what in SOURCES:
        recorded = meta.get(key)
        if recorded != current[key]:
            was = f"sha256 {recorded[:12]}…" if recorded else "none recorded"
            return f"exported from other {what}: {was}, not {current[key][:12]}…"
    return ""
