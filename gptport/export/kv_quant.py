"""An int8 KV cache for the static-cache graphs (`export --kv-dtype int8`): onnxruntime's CPU
GroupQueryAttention stores keys and values as int8 (`k_quant_type`/`v_quant_type`, `kv_cache_bit_width`
8) with scales given as inputs; this module calibrates those scales, writes the int8-cache twin of a
static graph, and gates it.

- Calibration: the fp32 static graph prefills the gate's held-out windows (a model too large for it: the torch
  model run layer by layer on them, layer_reference.py, the same keys and values); the largest |key| and
  |value| per layer (per tensor) or per layer, kv head and channel (per channel) over every position,
  divided by 127, are the scales (symmetric), stored in the graph as initializers. With rope the keys
  are calibrated as the cache holds them: rotated (GroupQueryAttention rotates before it stores).
- The int8-cache graph is its twin's nodes rewritten, the weights not loaded: its data file is a clone of the
  twin's (the same blocks where the filesystem clones, a kernel copy elsewhere; not a hard link, which onnx
  refuses).
- Gate: the int8-cache graph against its float32-cache twin of the same weights, both decoding the
  windows token by token (teacher-forced: the cache is what decoding reads): top-1 agreement ≥ 98% (a pick
  the float32 cache rates within agreement.TIE_NATS of its best agrees) and
  bits per byte within 1%, as the issue asks. Both scale kinds are gated and timed (a 16-row decode
  step); the faster that passes is written, and none when neither passes.
No torch here but through layer_reference.py (calibrate_layers).
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from gptport import atomic, contract
from gptport.config import ModelConfig
from gptport.errors import ArtifactError
from gptport.export import graph_write, layer_reference
from gptport.export.agreement import TOP_K, agrees_top_k, top_k
from gptport.export.tensor_sink import data_name
from gptport.runtime.onnx_engine import OnnxModel, file_metadata, load_cpu
from gptport.runtime.slots import StaticSlots

KINDS = ("PER_TENSOR", "PER_CHANNEL")
GATE_TOP1, GATE_BPB = 0.98, 0.01
SCALE_INPUTS = 12  # GroupQueryAttention's k_scale and v_scale are its inputs 12 and 13
STEP_ROWS = 16  # rows of the decode step the gate times
FICLONE = 0x40049409  # Linux's ioctl: the destination shares the source's blocks, copied on write


@dataclass(frozen=True)
class KvGateRow:
    """One int8-cache graph as gated: agreement and bits per byte against the float32 cache, its step time."""

    label: str  # "fp32 static.kv8", "int8 static.kv8"
    kind: str  # PER_TENSOR | PER_CHANNEL
    top1: float
    bpb_fp32: float
    bpb_int8: float
    positions: int
    step_ms: float  # a decode step of min(16, n) rows at about half the context
    step_ms_fp32: float
    ok: bool

    @property
    def bpb_change(self) -> float:
        return self.bpb_int8 / self.bpb_fp32 - 1.0


def calibrate(fp32_static: OnnxModel, windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The largest |key| and |value| per layer, kv head and channel (L, Hkv, hd) over every position of the
    windows (N, T), as the fp32 static graph computes them."""
    cfg = fp32_static.config
    slots = StaticSlots(fp32_static.session, cfg, 1)
    k_max = np.zeros((cfg.n_layer, cfg.n_kv_head, cfg.head_dim), dtype=np.float32)  # (L, Hkv, hd)
    v_max = np.zeros_like(k_max)
    for row in windows:
        slots.free(0)
        slots.append(0, np.asarray(row, dtype=np.int64))
        T = len(row)
        for i in range(cfg.n_layer):
            np.maximum(k_max[i], np.abs(slots.buffers[2 * i][0, :, :T]).max(axis=1), out=k_max[i])  # (H, hd)
            np.maximum(v_max[i], np.abs(slots.buffers[2 * i + 1][0, :, :T]).max(axis=1), out=v_max[i])
    return k_max, v_max


def calibrate_layers(cfg: ModelConfig, weights: Mapping[str, np.ndarray], windows: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """calibrate's |max| (L, Hkv, hd) from the torch model run layer by layer on the windows (N, T) in one batch
    (layer_reference.run_layers: one layer's weights at a time), for a model without an fp32 static graph."""
    k_max = np.zeros((cfg.n_layer, cfg.n_kv_head, cfg.head_dim), dtype=np.float32)  # (L, Hkv, hd)
    v_max = np.zeros_like(k_max)
    for out in layer_reference.run_layers(cfg, weights.__getitem__, np.asarray(windows, np.int64), last_only=True):
        if isinstance(out, layer_reference.LayerOut):  # key, value (N, Hkv, T, hd): rotated, as the cache holds them
            k_max[out.index] = np.abs(out.key).max(axis=(0, 2))
            v_max[out.index] = np.abs(out.value).max(axis=(0, 2))
    return k_max, v_max


def scales(amax: np.ndarray, kind: str) -> np.ndarray:
    """One layer's symmetric int8 scale from its |max| (H, hd): (1,) per tensor, (1, H, 1, hd) per channel."""
    amax = np.maximum(amax, 1e-8)
    if kind == "PER_TENSOR":
        return np.array([amax.max() / 127.0], dtype=np.float32)
    return (amax / 127.0).reshape(1, amax.shape[0], 1, amax.shape[1]).astype(np.float32)


def rewrite(src: Path, dst: Path, k_max: np.ndarray, v_max: np.ndarray, kind: str,
            meta: dict[str, str]) -> bool:
    """The static graph at `src` with an int8 cache, written to `dst` with `meta` as its metadata: each
    GroupQueryAttention takes its layer's scales and quantizes what it appends; the cache inputs and
    outputs become int8. Its weights are not loaded: the twin's data file, if any, is cloned under dst's data name
    (clone_data: False when it had to be copied)."""
    proto = onnx.load(str(src), load_external_data=False)
    graph = proto.graph
    cloned = _share_data(src, dst, graph)
    layer = {name: i for i, name in enumerate(contract.past_names(len(k_max))[::2])}
    for node in (n for n in graph.node if n.op_type == "GroupQueryAttention"):
        i = layer[node.input[3]]
        names = [f"kv8.{i}.k_scale", f"kv8.{i}.v_scale"]
        graph.initializer.extend([numpy_helper.from_array(scales(k_max[i], kind), names[0]),
                                  numpy_helper.from_array(scales(v_max[i], kind), names[1])])
        inputs = [*node.input, *[""] * (SCALE_INPUTS - len(node.input)), *names]
        del node.input[:]
        node.input.extend(inputs)
        node.attribute.extend([helper.make_attribute("k_quant_type", kind), helper.make_attribute("v_quant_type", kind),
                               helper.make_attribute("kv_cache_bit_width", 8)])
    for value in (*graph.input, *graph.output):
        if value.name.startswith(("past_key_values.", "present.")):
            value.type.tensor_type.elem_type = TensorProto.INT8
    del proto.metadata_props[:]
    helper.set_model_props(proto, meta)
    onnx.save_model(proto, str(dst))
    return cloned


def _share_data(src: Path, dst: Path, graph: onnx.GraphProto) -> bool:
    """src's external data file (if any) cloned under dst's data name (clone_data), the initializers of `graph`
    pointing at it; False where it was copied."""
    data = graph_write.data_of(src)
    if data is None:
        return True
    target = dst.with_name(data_name(dst))
    cloned = clone_data(data, target)
    for init in graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = target.name
    return cloned


def clone_data(src: Path, dst: Path) -> bool:
    """dst made of src's bytes without reading them into memory: a clone sharing src's blocks where the filesystem
    makes one (FICLONE: btrfs, XFS; no disk of its own), else a copy in the kernel (False). Never a hard link: onnx
    (1.23) refuses to load external data with more than one ("possible hardlink attack"), the twin's included."""
    dst.unlink(missing_ok=True)
    try:
        import fcntl  # (POSIX only)

        with src.open("rb") as s, dst.open("wb") as d:
            fcntl.ioctl(d.fileno(), FICLONE, s.fileno())
        return True
    except (ImportError, OSError):
        dst.unlink(missing_ok=True)
    try:
        shutil.copyfile(src, dst)
    except OSError as e:
        dst.unlink(missing_ok=True)
        raise ArtifactError(f"{dst}: cannot copy {src.name} into it ({e.strerror or e})") from e
    return False


def remove(path: Path) -> None:
    """A graph and its data file (if any) removed."""
    path.unlink(missing_ok=True)
    path.with_name(data_name(path)).unlink(missing_ok=True)


def decode_scores(model: OnnxModel, windows: np.ndarray, nats_bytes: np.ndarray
                  ) -> tuple[np.ndarray, float, float, tuple[np.ndarray, np.ndarray]]:
    """Every window (N, T) decoded token by token in one batch of N slots, each position's next token
    fed from the window: the argmax at each position (N, T - 1), total nats of the true next tokens, their
    bytes, and the top agreement.TOP_K logits and ids at each position ((N, T - 1, k) each)."""
    N, T = windows.shape
    slots = StaticSlots(model.session, model.config, N, model.kv_dtype)
    first = [slots.append(r, windows[r, :1])[0] for r in range(N)]
    logits = np.stack(first)  # (N, V)
    picks = np.zeros((N, T - 1), dtype=np.int64)
    k = min(TOP_K, logits.shape[-1])
    top_vals, top_ids = np.zeros((N, T - 1, k), dtype=np.float32), np.zeros((N, T - 1, k), dtype=np.int64)
    nats = 0.0
    for t in range(1, T):
        target = windows[:, t]  # (N,)
        lg = logits.astype(np.float64)
        top = lg.max(-1)
        nats += float((top + np.log(np.exp(lg - top[:, None]).sum(-1)) - lg[np.arange(N), target]).sum())
        picks[:, t - 1] = lg.argmax(-1)
        top_vals[:, t - 1], top_ids[:, t - 1] = top_k(logits, k)
        if t < T - 1:
            logits = slots.decode(list(range(N)), target)  # (N, V)
    return picks, nats, float(nats_bytes[windows[:, 1:]].sum()), (top_vals, top_ids)


def step_ms(model: OnnxModel, rows: int = STEP_ROWS, repeat: int = 30, held: int | None = None) -> float:
    """Median ms of a decode step of `rows` rows holding `held` positions each (default: half the context)."""
    cfg = model.config
    slots = StaticSlots(model.session, cfg, rows, model.kv_dtype)
    held = cfg.n_ctx // 2 if held is None else held
    ids = np.arange(1, held + 1, dtype=np.int64) % cfg.vocab_size
    for r in range(rows):
        slots.append(r, ids)
    times = []
    for _ in range(repeat + 5):
        slots.lengths[:] = held
        t0 = time.perf_counter()
        slots.decode(list(range(rows)), np.ones(rows, dtype=np.int64))
        times.append(time.perf_counter() - t0)
    return float(np.median(times[5:]) * 1e3)


def gate(label: str, kind: str, fp32_cache: OnnxModel, int8_cache: OnnxModel, windows: np.ndarray,
         token_bytes: np.ndarray, reference: tuple[Any, ...]) -> KvGateRow:
    """The int8-cache graph against `reference` (its float32-cache twin's decode_scores and step time)."""
    picks, nats, n_bytes, _ = decode_scores(int8_cache, windows, token_bytes)
    _, ref_nats, _, (ref_vals, ref_ids), ref_ms = reference
    top1 = float(agrees_top_k(ref_vals, ref_ids, picks).mean())  # a near-tie of the reference agrees
    bpb, ref_bpb = nats / math.log(2) / n_bytes, ref_nats / math.log(2) / n_bytes
    ok = top1 >= GATE_TOP1 and abs(bpb / ref_bpb - 1.0) <= GATE_BPB
    return KvGateRow(label, kind, top1, ref_bpb, bpb, picks.size, step_ms(int8_cache), ref_ms, ok)


def make(label: str, twin: Path, path: Path, amax: tuple[np.ndarray, np.ndarray], windows: np.ndarray,
         token_bytes: np.ndarray, gated: bool, rows: list[KvGateRow], say: Callable[[str], None] = lambda message: None
         ) -> Path | None:
    """The int8-cache graph of the float32-cache static graph `twin`, under a temporary name beside
    `path`: each scale kind gated (rows appended to `rows`) and the faster passing one kept; None when
    none passes. Not `gated` (--no-gate): per tensor, unchecked, recorded as ungated. `say`: told when the
    twin's data had to be copied, not cloned."""
    k_max, v_max = amax
    ref = load_cpu(twin) if gated else None
    reference = (*decode_scores(ref, windows, token_bytes), step_ms(ref)) if ref is not None else None
    best: tuple[float, Path] | None = None
    for kind in KINDS:
        tmp = atomic.temp_name(path.with_name(f"{path.name}.{kind.lower()}"))
        meta = {**file_metadata(twin), contract.META_KV_SCALES: kind}
        if not rewrite(twin, tmp, k_max, v_max, kind, meta if gated else {**meta, contract.META_GATED: "false"}):
            say(f"{path.name}: {twin.name}'s data copied (this filesystem clones no blocks)")
        if not gated:
            return tmp
        row = gate(label, kind, ref, load_cpu(tmp), windows, token_bytes, reference)  # type: ignore[arg-type]
        rows.append(row)
        if row.ok and (best is None or row.step_ms < best[0]):
            if best is not None:
                remove(best[1])
            best = (row.step_ms, tmp)
        else:
            remove(tmp)
    return None if best is None else best[1]
