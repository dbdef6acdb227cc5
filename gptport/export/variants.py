"""Variants of the fp32 graph made with onnxruntime's own tools: int8 and int4 weight quantization for
the CPU provider (the schemes the builder cannot write from the weights) and the transformer optimizer's fusions
(fp16 is built from the weights: contract_graph's `half`). No torch here."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from gptport import contract
from gptport.config import ModelConfig
from gptport.errors import UsageError
from gptport.export import awq, grid, kquant, smooth, w8a8
from gptport.export.nbits import NBits


def materialize_head(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Give a tied head a weight of its own: quantizers skip a MatMul whose weight is computed
    (Transpose of the embedding), and at GPT-2 sizes the head is a third of the bytes read per token."""
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    head = next((n for n in graph.node if n.op_type == "MatMul" and set(n.output) & set(contract.HEADS)), None)
    producer = next((n for n in graph.node if head is not None and head.input[1] in n.output), None)
    if producer is None or producer.op_type != "Transpose" or producer.input[0] not in inits:
        return proto
    wte = numpy_helper.to_array(inits[producer.input[0]])
    graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(wte.T), producer.output[0]))
    graph.node.remove(producer)
    return proto


def _quiet() -> None:
    for name in ("onnxruntime", "onnxruntime.quantization", "root"):
        logging.getLogger(name).setLevel(logging.ERROR)


@dataclass(frozen=True)
class Scheme:
    """A weight-quantization scheme of onnxruntime's: block-wise MatMulNBits (bits, block size,
    accuracy level 4 = int8 compute, 0 = float compute; the head may get more bits than the rest;
    `smooth` > 0: activations smoothed first with that alpha, smooth.py; `grid`: weights already on a 4-bit
    grid encoded exactly, grid.py, every other matrix quantized like the head, with `head_bits` and
    `head_accuracy_level` (`kq`: the weights first rounded onto such grids, kquant.py); `fine_block`: the head,
    and with `fine_down` the down projections, in blocks that long; `awq`: activation-aware scales and clipping
    first, awq.py; `wide`: roles kept at `head_bits` like the head, "qkv", "down" or "down-half" (the down
    projections of the layers llama.cpp's Q4_K_M gives 6 bits)), 'dynamic' (QInt8 per-channel weights,
    DynamicQuantizeMatMul: an int8 GEMM with one scale per activation tensor), 'w8a8' (per-channel int8 weights,
    per-token int8 activations: w8a8.py)."""

    name: str
    kind: str = "nbits"
    bits: int = 8
    block: int = 32
    accuracy_level: int = 4
    symmetric: bool = True
    head_bits: int = 0  # 0: the head gets `bits` like every other MatMul
    smooth: float = 0.0  # SmoothQuant's alpha; 0: no smoothing
    grid: bool = False  # matrices on a 4-bit grid (GGUF 4-bit imports) encoded exactly; none: not applicable
    head_accuracy_level: int = -1  # -1: the head's accuracy level is `accuracy_level`
    fine_block: int = 0  # > 0: the head (and with fine_down the down projections) in blocks this long
    fine_down: bool = False  # the MLP's down projections (input wider than output) get `fine_block` too
    awq: bool = False  # activation-aware scaling and clipping (awq.py) before the 4-bit rounding
    wide: tuple[str, ...] = ()  # roles quantized like the head: "qkv", "down", "down-half"
    kq: bool = False  # 4-bit with a float minimum per block of 32, searched as llama.cpp's k-quants (kquant.py)


SCHEMES = {s.name: s for s in [
    Scheme("dynamic-int8", kind="dynamic"),
    Scheme("w8a8", kind="w8a8"),
    Scheme("w8a8-smooth", kind="w8a8", smooth=0.5),
    Scheme("nbits8-b32-acc4", bits=8, block=32, accuracy_level=4),
    Scheme("nbits8-b128-acc4", bits=8, block=128, accuracy_level=4),
    Scheme("nbits8-b32-acc0", bits=8, block=32, accuracy_level=0),
    Scheme("nbits8-b32-acc4-smooth", bits=8, block=32, accuracy_level=4, smooth=0.5),
    Scheme("nbits8-b32-acc4-smooth-head16", bits=8, block=32, accuracy_level=4, smooth=0.5, fine_block=16),
    Scheme("nbits8-b32-acc4-smooth-fine16", bits=8, block=32, accuracy_level=4, smooth=0.5, fine_block=16,
           fine_down=True),
    Scheme("nbits8-b16-acc4-smooth", bits=8, block=16, accuracy_level=4, smooth=0.5),
    Scheme("nbits4-b32-acc4", bits=4, block=32, accuracy_level=4),
    Scheme("nbits4-b32-acc4-head8", bits=4, block=32, accuracy_level=4, head_bits=8),
    Scheme("nbits4-b128-acc4-head8", bits=4, block=128, accuracy_level=4, head_bits=8),
    Scheme("nbits4-b16-acc4-head8", bits=4, block=16, accuracy_level=4, head_bits=8),
    Scheme("nbits4-b32-acc0-head8", bits=4, block=32, accuracy_level=0, head_bits=8),
    Scheme("nbits4-b32-asym-acc4-head8", bits=4, block=32, accuracy_level=4, symmetric=False, head_bits=8),
    Scheme("nbits4-b32-awq-acc4-head8", bits=4, block=32, accuracy_level=4, head_bits=8, awq=True),
    Scheme("nbits4-b32-asym-awq-acc4-head8", bits=4, block=32, accuracy_level=4, symmetric=False, head_bits=8,
           awq=True),
    Scheme("nbits4-b32-acc4-head8-down8", bits=4, block=32, accuracy_level=4, head_bits=8, wide=("down",)),
    Scheme("nbits4-b32-awq-acc4-head8-downhalf8", bits=4, block=32, accuracy_level=4, head_bits=8, awq=True,
           wide=("down-half",)),
    Scheme("nbits4-b32-awq-acc4-head8-down8", bits=4, block=32, accuracy_level=4, head_bits=8, awq=True,
           wide=("down",)),
    Scheme("nbits4-b128-acc4-head8-down8", bits=4, block=128, accuracy_level=4, head_bits=8, wide=("down",)),
    Scheme("nbits4-b32-acc4-head8-qkv8-down8", bits=4, block=32, accuracy_level=4, head_bits=8,
           wide=("qkv", "down")),
    Scheme("nbits4-b128-awq-acc4-head8", bits=4, block=128, accuracy_level=4, head_bits=8, awq=True),
    Scheme("nbits4-b128-awq-acc4-head8-down8", bits=4, block=128, accuracy_level=4, head_bits=8, awq=True,
           wide=("down",)),
    Scheme("nbits4-b32-awq-acc4-head8-qkv8-down8", bits=4, block=32, accuracy_level=4, head_bits=8, awq=True,
           wide=("qkv", "down")),
    Scheme("nbits4-b32-awq-acc0-head8", bits=4, block=32, accuracy_level=0, head_bits=8, awq=True),
    Scheme("nbits4-grid-acc4-head8", bits=4, block=grid.BLOCK, accuracy_level=4, head_bits=8, grid=True),
    Scheme("nbits4-kq-acc4-head8", bits=4, block=grid.BLOCK, accuracy_level=4, head_bits=8, kq=True),
    Scheme("nbits4-kq-acc4-head8-down8", bits=4, block=grid.BLOCK, accuracy_level=4, head_bits=8, kq=True,
           wide=("down",)),
    Scheme("nbits4-kq-awq-acc4-head8", bits=4, block=grid.BLOCK, accuracy_level=4, head_bits=8, kq=True, awq=True,
           symmetric=False),
    Scheme("nbits4-kq-awq-acc4-head8-down8", bits=4, block=grid.BLOCK, accuracy_level=4, head_bits=8, kq=True,
           awq=True, symmetric=False, wide=("down",)),
    Scheme("nbits4-grid-acc0-head8", bits=4, block=grid.BLOCK, accuracy_level=0, head_bits=8, grid=True,
           head_accuracy_level=4),
]}
# What `gptport export --precision int8/int4` tries, in order: the first scheme that passes the accuracy
# gate ships. Block 128 is faster than block 32 (benchmarks/decode) but a little less accurate
# (benchmarks/export/quant.py), so block 32 is the fallback; then smoothed activations, for models whose
# activations have outlier channels (the Llama family's: design record 0035): block 32, block 32 with the head
# and the down projections in blocks of 16 (the matrices whose error costs most agreement), block 16 (0038).
# Float compute (acc0) is not on the ladder: onnxruntime's CPU has no fast 8-bit kernel for it (slower than fp32).
# int4 first tries the exact encodings of weights already on a 4-bit grid (a GGUF Q4_0/Q4_1/Q4_K import,
# grid.py; skipped where no matrix is), int8 compute then float compute (4-bit acc0 is ~2x faster than
# fp32 per weight read, acc4 ~4x: design record 0039), then the requantizing schemes: activation-aware (awq.py:
# held-out perplexity +9.5% over fp32 on SmolLM2 against plain rounding's +16%, design record 0051), the same with
# the down projections at 8 bits, then plain rounding in blocks of 32, then of 128. Block 128 decodes ~1.2x faster at
# the 0.5B and 1B shapes (benchmarks/decode/int4_scale.py) but costs held-out perplexity: +22% over fp32 on SmolLM2
# against block 32's +16%, +66% against +44% on Gemma 3 270M (benchmarks/export/int4_quality.py, record 0051). A model
# too large to quantize in memory (never gated) gets the first rung the builder writes: plain rounding in blocks of 32.
LADDER = {"int8": ("nbits8-b128-acc4", "nbits8-b32-acc4", "nbits8-b32-acc4-smooth", "nbits8-b32-acc4-smooth-fine16",
                  "nbits8-b16-acc4-smooth"),
          "int4": ("nbits4-grid-acc4-head8", "nbits4-grid-acc0-head8", "nbits4-b32-awq-acc4-head8",
                   "nbits4-b32-awq-acc4-head8-down8", "nbits4-b32-acc4-head8", "nbits4-b128-acc4-head8")}
Ranges = Mapping[str, np.ndarray]  # calibration.activation_ranges: module name -> (channels,) max |x|
# (an awq scheme's: calibration.activation_samples, module name -> (rows, channels))
WIDE = {"qkv": ".attn.c_attn", "down": ".mlp.c_proj", "down-half": ".mlp.c_proj"}  # role -> its modules' suffix


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's use_more_bits: the layers whose down projection (and v) its Q4_K_M keeps at 6 bits."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def wide_modules(roles: tuple[str, ...], layers: int) -> set[str]:
    """The modules ("h.3.mlp.c_proj") of `roles` in a model of `layers` layers."""
    return {f"h.{i}{WIDE[r]}" for r in roles for i in range(layers) if r != "down-half" or more_bits(i, layers)}


def _wide_nodes(proto: onnx.ModelProto, roles: tuple[str, ...]) -> list[str]:
    """The names of the MatMuls whose weight is one of `roles`' (the builder names it "<module>.weight_t")."""
    layers = sum(1 for i in proto.graph.initializer if i.name.endswith(".attn.c_attn.weight_t"))
    weights = {f"{m}.weight_t" for m in wide_modules(roles, layers)}
    return [n.name for n in proto.graph.node if n.op_type == "MatMul" and len(n.input) == 2 and n.input[1] in weights]


def _kq_round(proto: onnx.ModelProto, apart: set[str | None]) -> None:
    """Each MatMul's float weight (K, N), but those of the nodes `apart` (the head, the roles kept at 8 bits),
    replaced by its values on 4-bit grids with float minima (kquant.rounded), for grid.encode to write exactly."""
    inits = {i.name: i for i in proto.graph.initializer}
    done: set[str] = set()
    for node in proto.graph.node:
        name = node.input[1] if node.op_type == "MatMul" and len(node.input) == 2 else ""
        w = inits.get(name)
        if w is None or name in done or node.name in apart or len(w.dims) != 2 or w.dims[0] % kquant.BLOCK:
            continue
        w.CopyFrom(numpy_helper.from_array(kquant.rounded(numpy_helper.to_array(w)), name))
        done.add(name)


class NotApplicable(Exception):
    """A scheme that does not apply to this graph (a grid scheme where most weights are off the grid), and why."""


def _down_projections(proto: onnx.ModelProto) -> list[str]:
    """The names of the MatMuls that read the MLP's hidden layer: a float weight (K, N) with K > N, the head
    (whose N is the vocabulary) never among them."""
    inits = {i.name: i for i in proto.graph.initializer}
    return [n.name for n in proto.graph.node if w8a8.weight_matmul(n, inits)
            and inits[n.input[1]].dims[0] > inits[n.input[1]].dims[1] and not set(n.output) & {*contract.HEADS}]


def quantize(src: Path, dst: Path, scheme: Scheme, ranges: Ranges | None = None) -> None:
    """Quantize the MatMul weights of the graph at `src` (the head included) into `dst`; a smoothing
    scheme rescales with the activations' `ranges` first. NotApplicable (nothing written): a grid scheme on a
    graph whose matrices on a 4-bit grid hold less than half of the MatMul weights."""
    _quiet()
    proto = materialize_head(onnx.load(str(src)))
    if scheme.smooth:
        if ranges is None:
            raise NotApplicable("smoothing needs the activations' ranges, measured on the gate's held-out text, "
                                "and --no-gate has none")
        smooth.smooth(proto, ranges, scheme.smooth)
    if scheme.awq:
        if ranges is None:
            raise NotApplicable("AWQ needs the activations' samples, drawn from the gate's held-out text, and "
                                "--no-gate has none")
        layers = sum(1 for i in proto.graph.initializer if i.name.endswith(".attn.c_attn.weight_t"))
        skip = {m.replace(".attn.c_attn", ".ln_1") for m in wide_modules(scheme.wide, layers)}  # their norms'
        awq.apply(proto, ranges, scheme.block, scheme.symmetric, skip=skip, int8=scheme.accuracy_level == 4)
    head = next((n.name for n in proto.graph.node if set(n.output) & set(contract.HEADS)), None)  # None: a bare MatMul
    if scheme.kind == "w8a8":
        w8a8.rewrite(proto)
        onnx.save_model(proto, str(dst))
        return
    if scheme.kind == "dynamic":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(proto, str(dst), op_types_to_quantize=["MatMul"], per_channel=True,
                         weight_type=QuantType.QInt8,
                         extra_options={"MatMulConstBOnly": True,  # float: contrib ops stop shape inference
                                        "DefaultTensorType": onnx.TensorProto.FLOAT})
        return
    head_level = scheme.accuracy_level if scheme.head_accuracy_level < 0 else scheme.head_accuracy_level
    if scheme.kq:
        _kq_round(proto, {head, *_wide_nodes(proto, scheme.wide)})
    if scheme.grid or scheme.kq:
        inits = {i.name: i for i in proto.graph.initializer}
        sizes = {n.name or n.output[0]: int(np.prod(inits[n.input[1]].dims)) for n in proto.graph.node
                 if n.op_type == "MatMul" and n.input[1] in inits}  # each weight-reading MatMul's weights
        added = grid.encode(proto, scheme.accuracy_level)
        encoded = {a.removesuffix("_Q4_grid") for a in added if a.endswith("_Q4_grid")}  # grid.encode's names
        on, weights = sum(v for k, v in sizes.items() if k in encoded), sum(sizes.values())
        if 2 * on < weights and not scheme.kq:  # not a 4-bit import, and the rest would get 8 bits
            raise NotApplicable(f"{on / max(weights, 1):.1%} of the MatMul weights lie on a 4-bit grid "
                                f"({len(encoded)} of {len(sizes)} matrices); the exact encoding needs half")
        passes = [(scheme.head_bits or scheme.bits, head_level, scheme.block, added)]  # every matrix off the grid
    else:  # the head (and the down projections) apart where they differ: the second pass finds them all that is left
        apart = ([head] if head and (scheme.head_bits or scheme.fine_block) else []) + (
            _down_projections(proto) if scheme.fine_down else []) + _wide_nodes(proto, scheme.wide)
        passes = [(scheme.bits, scheme.accuracy_level, scheme.block, apart)]
        if apart:
            passes.append((scheme.head_bits or scheme.bits, head_level, scheme.fine_block or scheme.block, []))
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    for bits, level, block, exclude in passes:
        q = MatMulNBitsQuantizer(proto, bits=bits, block_size=block, is_symmetric=scheme.symmetric,
                                 accuracy_level=level, nodes_to_exclude=exclude)
        q.process()
        proto = q.model.model
    onnx.save_model(proto, str(dst))


def optimize(src: Path, cfg: ModelConfig) -> tuple[Path, dict[str, int]]:
    """onnxruntime's transformer optimizer (GPT-2 fusions); the fused-operator counts it reports. The fusions
    only: onnxruntime's own graph optimizations (opt_level 1, a session made to write them) run again whenever a
    session loads the graph, and symbolic shape inference copies the whole graph several times; without both,
    the fused operators and the graph a session runs are the same (op for op, on `small` and SmolLM2-135M) and
    the optimizer peaks at about 2x the model's bytes instead of 5x (1.15 GB against 2.87 for 135M)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    _quiet()
    options = FusionOptions("gpt2")
    options.enable_shape_inference = False
    if not cfg.bias:  # its SkipLayerNormalization fusion assumes LayerNorm has a bias (IndexError without)
        options.enable_skip_layer_norm = False
    opt = optimize_model(str(src), model_type="gpt2", num_heads=cfg.n_head, hidden_size=cfg.d_model,
                         optimization_options=options, use_gpu=False, opt_level=0)
    stats = {k: int(v) for k, v in opt.get_fused_operator_statistics().items() if v}
    dst = src.with_name(src.name + ".opt")
    opt.save_model_to_file(str(dst), use_external_data_format=False)
    return dst, stats


def direct(name: str) -> NBits | None:
    """The scheme `name` as the builder's NBits, when the builder can write it straight from the weights (a
    MatMulNBits scheme without smoothing or a grid: the same onnxruntime kernels MatMulNBitsQuantizer calls, on
    the same matrices); None when only quantize() can make it, from a float graph in memory."""
    s = SCHEMES[name]
    if s.kind != "nbits" or s.smooth or s.grid or s.awq or s.wide:
        return None
    return NBits(s.bits, s.block, s.accuracy_level, s.symmetric, s.head_bits, s.head_accuracy_level, s.fine_block,
                 s.fine_block if s.fine_down else 0)


def make(precision: str, fp32: Path, dst: Path, cfg: ModelConfig, scheme: str = "",
         ranges: Ranges | None = None) -> None:
    """Write the `precision` variant (int8, int4) of the fp32 graph at `fp32` to `dst` with `scheme` (a SCHEMES
    name), by default the first of the precision's LADDER (`ranges`: a smoothing scheme's calibration).
    NotApplicable (nothing written): the scheme does not apply to this graph. (fp16 is built from the weights:
    contract_graph's `half`.)"""
    if precision not in LADDER:
        raise UsageError(f"unknown precision {precision!r}")
    quantize(fp32, dst, SCHEMES[scheme or LADDER[precision][0]], ranges)
