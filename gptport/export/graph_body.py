"""What every graph shares, written op by op from the weights: the embeddings, each layer around its attention
(its norms, the fused q|k|v projection and the q/k norm, the output projection, the MLP), the final norm and the
head on the positions `logits_index` asks for (the static-cache graphs' inputs and outputs: gqa_graph.py); float16
for an fp16 graph (Builder's `half`). Each graph supplies its own attention (gqa_graph.py: GroupQueryAttention;
scatter_graph.py: TensorScatter + Attention; contract_graph.py: onnx's operators). GPT-2's layers and the Llama
family's (RMSNorm, SwiGLU, rope, grouped kv heads, q/k norm, separate biases) alike, as ModelConfig says. No torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from gptport import contract
from gptport.config import ModelConfig
from gptport.export.graph_caps import finish, finishes, scaled
from gptport.export.lazy_weights import Float32, Joined, Thunk, later, shape
from gptport.export.nbits import NBits, Quant, slabs
from gptport.export.tensor_sink import InlineSink, Sink

CACHE = "max_sequence"  # the cache's length dimension: n_ctx at run time (or more: the buffers' capacity)
IR_VERSION = 10  # what onnxruntime 1.20 and later read (onnx writes newer ones by default)
RMS_NORM_OPSET = 23  # onnx's own RMSNormalization


@dataclass(frozen=True)
class Qkv:
    """A layer's queries, keys and values: `packed` (B, S, q | k | v, heads contiguous in each) or, when a
    q/k norm had to take them apart, `parts` (q (B, S, H*hd), k and v (B, S, Hkv*hd))."""

    packed: str
    parts: tuple[str, str, str] | None = None


# the attention of layer i: (builder, i, its q/k/v) -> its output (B, S, H*hd)
Attend = Callable[["Builder", int, Qkv], str]


@dataclass(frozen=True)
class Forms:
    """Which of onnxruntime's operators write the Llama family's RMSNorm and SwiGLU, and GPT-2's residual
    LayerNorm. The defaults are the fastest on the CPU (benchmarks/decode/static_llama.py; design record
    0035's amendment); the CUDA graphs fuse (cuda_graphs.CUDA_FORMS)."""

    rms: str = "onnx"  # onnx: Add + RMSNormalization (opset 23); skip: SkipSimplifiedLayerNormalization where
    #                    a sum is normalised, RMSNormalization elsewhere; simplified: Add +
    #                    SimplifiedLayerNormalization (onnxruntime's, in the onnx domain: onnx's checker refuses it)
    swiglu: str = "fused"  # fused: one MatMul of [gate | up], then Split; apart: two MatMuls
    layer: str = "apart"  # apart: Add(s) + LayerNormalization; skip: SkipLayerNormalization, the bias and the
    #                       residual sum in one node (one kernel on CUDA for three; 2x slower on the CPU)
    gelu: str = "fused"  # fused: FastGelu / BiasGelu (com.microsoft); plain: onnx's Tanh or Erf and arithmetic
    sinusoid: str = "table"  # table: sinusoidal positions gathered from n_ctx rows; computed: sin/cos of each


FASTEST = Forms()
# the contract graph: onnx's own operators at opset 18 (plain RMSNorm: Pow, ReduceMean, Sqrt, Div), which
# onnxruntime's optimizer fuses
PORTABLE = Forms(rms="plain", gelu="plain", sinusoid="computed")


def sinusoidal_table(n_ctx: int, d_model: int) -> np.ndarray:
    """model.sinusoidal for positions 0..n_ctx-1, as a (n_ctx, D) float32 table."""
    half = d_model // 2
    inv_freq = np.exp(np.arange(half, dtype=np.float32) * np.float32(-math.log(10000.0) / half))  # (D/2,)
    angles = np.arange(n_ctx, dtype=np.float32)[:, None] * inv_freq  # (C, D/2)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1).astype(np.float32)  # (C, D)


def _i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


class Builder:
    """Nodes and initializers, with unique names; `opset`: the default domain's version its nodes need. `half`: an
    fp16 graph's, float16 weights and activations but for its norms, softmax and rope angles (float32 inside
    float32(): where float16's range and precision fall short)."""

    def __init__(self, config: ModelConfig, forms: Forms = FASTEST, sink: Sink | None = None,
                 nbits: NBits | None = None, half: bool = False) -> None:
        if half and (nbits is not None or "skip" in (forms.rms, forms.layer)):
            raise ValueError("a float16 graph is built without MatMulNBits and without the Skip norms")
        self.config, self.forms, self.nbits, self.half = config, forms, nbits, half
        self._wide = False  # inside float32(): float32 constants stay float32
        self.sink: Sink = sink or InlineSink()
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.residuals: list[str] = []  # the residual stream after each layer (what a layer-by-layer check taps)
        self.opset = 1
        self._count = 0
        self._names: set[str] = set()
        self.made: set[str] = set()  # names of what an attention made once for every layer (its rope tables)

    def const(self, name: str, array: np.ndarray | Thunk) -> str:
        """An initializer; one of that name already made is used again (a shape every layer reshapes to). A
        thunk (a weight, read when made) is not even called where the sink has it from an earlier graph."""
        if name not in self._names:
            self._names.add(name)
            held = self.sink.reuse(name) if callable(array) else None
            if held is None:
                made = array() if callable(array) else array
                if self.half and not self._wide and made.dtype == np.float32:
                    made = np.ascontiguousarray(made, np.float16)
                held = self.sink.tensor(name, made)
            self.inits.append(held)
        return name

    @contextmanager
    def float32(self) -> Iterator[None]:
        """The float32 constants made inside stay float32 in a `half` graph (its inputs widened by the caller)."""
        wide, self._wide = self._wide, True
        try:
            yield
        finally:
            self._wide = wide

    def widen(self, x: str, out: str | None = None) -> str:
        """x as float32: a Cast in a `half` graph (named `out` if given), x itself elsewhere."""
        return self.op("Cast", [x], [out] if out else 1, to=TensorProto.FLOAT)[0] if self.half else x

    def narrow(self, x: str) -> str:
        """x (float32) as the graph's activations: a Cast to float16 in a `half` graph, x itself elsewhere."""
        return self.op("Cast", [x], to=TensorProto.FLOAT16)[0] if self.half else x

    def op(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, domain: str = "",
           **attrs: Any) -> list[str]:
        self._count += 1
        name = f"{op_type}_{self._count}"
        outs = [f"{name}_out{i}" for i in range(outputs)] if isinstance(outputs, int) else outputs
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, domain=domain, **attrs))
        return outs

    def matmul(self, x: str, weights: Mapping[str, np.ndarray], prefix: str, out: str | None = None
               ) -> tuple[str, str]:
        """x @ W.T and the name of the bias ("" without one), left for the next op to add. W is
        stored (in, out), a constant MatMul weight, which is what the quantizers look for; with `nbits`,
        a MatMulNBits of W quantized (the head and the MLP's down projections as NBits.of says)."""
        name = f"{prefix}.weight"
        if self.nbits is not None:
            role = "head" if prefix == "lm_head" else "down" if prefix.endswith("mlp.c_proj") else ""
            y = self.nbits_matmul(x, later(weights, name), shape(weights, name), prefix, self.nbits.of(role), out)
        else:
            y = self.op("MatMul", [x, self.const(f"{name}_t", later(weights, name, transpose=True))],
                        [out] if out else 1)[0]
        bias = f"{prefix}.bias"
        return y, self.const(bias, weights[bias]) if bias in weights else ""

    def nbits_matmul(self, x: str, w: Thunk, w_shape: tuple[int, ...], prefix: str, q: Quant,
                     out: str | None = None) -> str:
        """x @ w.T by MatMulNBits, `w` (N, K) quantized a slab of rows at a time straight into the sink; not even
        read where the sink has its blocks, scales and zero points from an earlier graph (its reuse)."""
        n, k = w_shape
        packed_shape, _, zp_shape = q.shapes(n, k)
        name = f"{prefix}.weight_Q{q.bits}"
        names = [name, f"{prefix}.weight_scales", *([] if q.symmetric else [f"{prefix}.weight_zero_points"])]
        held = [self.sink.reuse(m) for m in names] if self.sink.holds(names) else []
        if held:
            self._names.update(names)
            self.inits.extend(h for h in held if h is not None)
        else:
            scales: list[np.ndarray] = []
            zeros: list[np.ndarray] = []

            def packed() -> Iterator[np.ndarray]:
                for part, scale, zero in slabs(w(), q):
                    scales.append(scale)
                    zeros.append(zero)
                    yield part

            self._names.add(name)
            self.inits.append(self.sink.chunked(name, np.dtype(np.uint8), packed_shape, packed()))
            self.const(names[1], np.concatenate(scales).reshape(-1))
            if not q.symmetric:
                self.const(names[2], np.concatenate(zeros).reshape(zp_shape))
        inputs = [x, *names]
        level = {"accuracy_level": q.accuracy_level} if q.accuracy_level else {}
        return self.op("MatMulNBits", inputs, [out] if out else 1, domain="com.microsoft", K=k, N=n, bits=q.bits,
                       block_size=q.block, **level)[0]

    def linear(self, x: str, weights: Mapping[str, np.ndarray], prefix: str, out: str | None = None) -> str:
        """x @ W.T (+ b)."""
        if f"{prefix}.bias" not in weights:
            return self.matmul(x, weights, prefix, out)[0]
        y, bias = self.matmul(x, weights, prefix)
        return self.op("Add", [y, bias], [out] if out else 1)[0]

    def add_norm(self, x: str, delta: str, bias: str, weights: Mapping[str, np.ndarray], prefix: str
                 ) -> tuple[str, str]:
        """x + delta (+ bias) and its norm: -> (normalized, sum); x alone when there is no delta (a rope
        model's first layer). By default Add and LayerNormalization rather than the fused
        SkipLayerNormalization, whose CPU kernel is 2x slower (benchmarks/results): Forms.layer and
        Forms.rms say which."""
        if not self.config.pre_norms:  # OLMo 2's: the sum itself goes in
            total = self.op("Add", [x, self.op("Add", [delta, bias])[0] if bias else delta])[0] if delta else x
            return total, total
        if not delta:
            return self.norm(x, weights, prefix), x
        if self.config.norm == "layernorm" and self.forms.layer == "skip":
            gamma = self.const(f"{prefix}.weight", weights[f"{prefix}.weight"])
            beta = self.const(f"{prefix}.bias", weights[f"{prefix}.bias"]) if f"{prefix}.bias" in weights else ""
            outs = self.op("SkipLayerNormalization", [x, delta, gamma, beta, bias] if bias else [x, delta, gamma, beta],
                           [f"{prefix}.normed", "", "", f"{prefix}.sum"], domain="com.microsoft",
                           epsilon=self.config.ln_eps)  # no mean, no inv_std_var (CUDA's kernel writes neither)
            return outs[0], outs[3]  # norm(x + delta + bias), and that sum (input_skip_bias_sum)
        if bias:  # onto the MatMul's output first: onnxruntime folds it into a quantized MatMulNBits
            delta = self.op("Add", [delta, bias])[0]
        if self.config.norm == "rmsnorm" and self.forms.rms == "skip":
            gamma = self.const(f"{prefix}.weight", weights[f"{prefix}.weight"])
            outs = self.op("SkipSimplifiedLayerNormalization", [x, delta, gamma], [f"{prefix}.normed", "", "",
                           f"{prefix}.sum"], domain="com.microsoft", epsilon=self.config.ln_eps)
            return outs[0], outs[3]  # the normalized sum, and the sum (input_skip_bias_sum)
        total = self.op("Add", [x, delta])[0]
        return self.norm(total, weights, prefix), total

    def norm(self, x: str, weights: Mapping[str, np.ndarray], prefix: str) -> str:
        """The model's norm (LayerNorm or RMSNorm, epsilon ln_eps) over x's last axis, weights `prefix`; in float32,
        in a `half` graph too."""
        if self.config.norm == "rmsnorm":
            return self.rms_of(x, weights, f"{prefix}.weight")
        with self.float32():
            return self.narrow(self.layer_norm(self.widen(x), weights, prefix))

    def rms_of(self, x: str, weights: Mapping[str, np.ndarray], name: str) -> str:
        """RMSNorm of x by the weight `name`, in float32 (a `half` graph's too), back in x's type."""
        with self.float32():
            return self.narrow(self.rms_norm(self.widen(x), self.const(name, weights[name])))

    def rms_norm(self, x: str, gamma: str) -> str:
        """x / sqrt(mean(x^2) + eps) * gamma over the last axis, in float32 (Forms.rms's operator)."""
        eps = self.config.ln_eps
        if self.forms.rms == "plain":  # x / sqrt(mean(x^2) + eps) * gamma
            square = self.op("Pow", [x, self.const("two", np.array(2, np.float32))])[0]  # Pow: kept float32 in fp16
            mean = self.op("ReduceMean", [square, self.const("last_axis", _i64(-1))], keepdims=1)[0]  # (..., 1)
            root = self.op("Sqrt", [self.op("Add", [mean, self.const("rms_eps", np.array(eps, np.float32))])[0]])[0]
            return self.op("Mul", [self.op("Div", [x, root])[0], gamma])[0]
        if self.forms.rms == "simplified":
            return self.op("SimplifiedLayerNormalization", [x, gamma], axis=-1, epsilon=eps, stash_type=1)[0]
        self.opset = max(self.opset, RMS_NORM_OPSET)
        return self.op("RMSNormalization", [x, gamma], axis=-1, epsilon=eps)[0]

    def layer_norm(self, x: str, weights: Mapping[str, np.ndarray], prefix: str) -> str:
        beta = [self.const(f"{prefix}.bias", weights[f"{prefix}.bias"])] if f"{prefix}.bias" in weights else []
        gamma = self.const(f"{prefix}.weight", weights[f"{prefix}.weight"])
        return self.op("LayerNormalization", [x, gamma, *beta], axis=-1, epsilon=self.config.ln_eps)[0]

    def gelu(self, x: str, bias: str, kind: str) -> str:
        """GELU(x + bias): FastGelu (tanh) or BiasGelu (exact), with the bias folded in (Forms.gelu fused)."""
        if self.forms.gelu == "plain":
            return self.plain_gelu(self.op("Add", [x, bias])[0] if bias else x, kind)
        if kind == "tanh":
            return self.op("FastGelu", [x, bias] if bias else [x], domain="com.microsoft")[0]
        if bias:
            return self.op("BiasGelu", [x, bias], domain="com.microsoft")[0]
        return self.op("Gelu", [x], approximate="none")[0]

    def sinusoid(self, positions: str) -> str:
        """model.sinusoidal of (B, S) int64 positions: [sin | cos] of position * frequency, (B, S, D) float32."""
        half = self.config.d_model // 2
        freq = np.exp(np.arange(half, dtype=np.float32) * np.float32(-math.log(10000.0) / half))  # (D/2,)
        pos = self.op("Unsqueeze", [self.op("Cast", [positions], to=TensorProto.FLOAT)[0],
                                    self.const("last_axis", _i64(-1))])[0]  # (B, S, 1)
        with self.float32():
            angles = self.op("Mul", [pos, self.const("sinusoid.inv_freq", freq)])[0]  # (B, S, D/2)
        return self.narrow(self.op("Concat", [self.op("Sin", [angles])[0], self.op("Cos", [angles])[0]], axis=-1)[0])

    def plain_gelu(self, x: str, kind: str) -> str:
        """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) for tanh, 0.5 x (1 + erf(x / sqrt(2))) for exact."""
        def c(name: str, value: float) -> str:
            return self.const(name, np.array(value, np.float32))

        if kind == "tanh":
            cube = self.op("Mul", [self.op("Mul", [x, x])[0], x])[0]
            inner = self.op("Add", [x, self.op("Mul", [cube, c("gelu_cubic", 0.044715)])[0]])[0]
            curve = self.op("Tanh", [self.op("Mul", [inner, c("gelu_slope", math.sqrt(2 / math.pi))])[0]])[0]
        else:
            curve = self.op("Erf", [self.op("Mul", [x, c("gelu_erf_scale", 1 / math.sqrt(2))])[0]])[0]
        half = self.op("Mul", [x, c("gelu_half", 0.5)])[0]
        return self.op("Mul", [half, self.op("Add", [curve, c("gelu_one", 1.0)])[0]])[0]

    def mlp(self, h: str, weights: Mapping[str, np.ndarray], prefix: str) -> tuple[str, str]:
        """The MLP of h up to its output projection's MatMul: -> (that product, its bias or "")."""
        cfg = self.config
        if cfg.mlp == "gelu":
            f = self.gelu(*self.matmul(h, weights, f"{prefix}.c_fc"), cfg.gelu)  # (B, S, 4D)
            return self.matmul(f, weights, f"{prefix}.c_proj")
        if self.forms.swiglu == "fused":  # [gate | up] (D, 2F): one product, then split
            both = Joined(weights, {f"{prefix}.c_gate_fc.{kind}": [f"{prefix}.c_gate.{kind}", f"{prefix}.c_fc.{kind}"]
                                    for kind in ("weight", "bias") if f"{prefix}.c_gate.{kind}" in weights})
            gate, up = self.op("Split", [self.linear(h, both, f"{prefix}.c_gate_fc"), self.const(
                "ffn_halves", _i64(cfg.d_ff, cfg.d_ff))], 2, axis=-1)  # (B, S, F) each
        else:
            gate, up = self.linear(h, weights, f"{prefix}.c_gate"), self.linear(h, weights, f"{prefix}.c_fc")
        if cfg.mlp == "geglu":  # Gemma's: GELU of the gate
            act = self.gelu(gate, "", cfg.gelu)
        else:
            act = self.op("Mul", [gate, self.op("Sigmoid", [gate])[0]])[0]  # onnxruntime fuses it (QuickGelu)
        return self.matmul(self.op("Mul", [act, up])[0], weights, f"{prefix}.c_proj")

    def post_norm(self, delta: str, bias: str, weights: Mapping[str, np.ndarray], prefix: str) -> tuple[str, str]:
        """A sublayer's output (delta + bias) through its post-norm `prefix` (post_norms: Gemma's), else as it is."""
        if not self.config.post_norms:
            return delta, bias
        return self.norm(self.op("Add", [delta, bias])[0] if bias else delta, weights, prefix), ""

    def qkv(self, h: str, weights: Mapping[str, np.ndarray], prefix: str) -> Qkv:
        """The layer's fused q|k|v projection of h; with a q/k norm, q and k apart and each head normalised."""
        packed = self.linear(h, weights, f"{prefix}.c_attn")  # (B, S, H*hd + 2*Hkv*hd)
        if not self.config.qk_norm:
            return Qkv(packed)
        q, k, v = self.split_qkv(packed)
        if self.config.qk_norm_span == "all":  # over every head together (OLMo 2's)
            q, k = (self.rms_of(x, weights, f"{prefix}.{n}.weight") for x, n in ((q, "q_norm"), (k, "k_norm")))
            return Qkv("", (q, k, v))
        q, k = (self.head_norm(x, weights, f"{prefix}.{n}.weight", width)
                for x, n, width in ((q, "q_norm", self.config.q_width), (k, "k_norm", self.config.kv_width)))
        return Qkv("", (q, k, v))

    def split_qkv(self, packed: str) -> tuple[str, str, str]:
        """(B, S, q|k|v) -> q (B, S, H*hd), k and v (B, S, Hkv*hd)."""
        cfg = self.config
        sizes = self.const("qkv_widths", _i64(cfg.q_width, cfg.kv_width, cfg.kv_width))
        q, k, v = self.op("Split", [packed, sizes], 3, axis=-1)
        return q, k, v

    def parts(self, qkv: Qkv) -> tuple[str, str, str]:
        """q, k and v apart, however the layer made them."""
        return qkv.parts if qkv.parts is not None else self.split_qkv(qkv.packed)

    def head_norm(self, x: str, weights: Mapping[str, np.ndarray], name: str, width: int) -> str:
        """RMSNorm of each head of x (B, S, width = n*hd) over its hd values by the weight `name` (the q/k norm)."""
        heads = self.op("Reshape", [x, self.const("by_head", _i64(0, -1, self.config.head_dim))])[0]  # (B, S*n, hd)
        normed = self.rms_of(heads, weights, name)
        return self.op("Reshape", [normed, self.const(f"by_token_{width}", _i64(0, -1, width))])[0]  # (B, S, n*hd)


def transformer(config: ModelConfig, weights: Mapping[str, np.ndarray], attend: Attend, forms: Forms = FASTEST,
                sink: Sink | None = None, nbits: NBits | None = None, every_position: bool = False,
                half: bool = False) -> Builder:
    """The nodes and initializers of a model with this config (config.json's "model") and these weights
    (model.safetensors as numpy, gptport's names, each read when its op is written; the head is wte.weight when
    the embeddings are tied), each layer's attention written by `attend`, each initializer handed to `sink` as it
    is made (default: inline), the MatMul weights quantized by `nbits` if given, float16 with `half` (Builder); its
    output is contract.LOGITS (B, L, V) float32 at the positions logits_index names, or with `every_position` at
    every position (B, S, V)."""
    w = Float32(weights)
    g = Builder(config, forms, sink, nbits, half)
    x = g.op("Gather", [g.const("wte.weight", later(w, "wte.weight")), contract.INPUT_IDS])[0]  # (B, S, D)
    if config.embed_scale != 1.0:  # as float32, as the torch model multiplies
        x = g.op("Mul", [x, g.const("embed_scale", np.array(config.embed_scale, np.float32))])[0]  # (B, S, D)
    delta = delta_bias = ""  # rope: nothing is added to the embeddings
    if config.pos_encoding != "rope":
        if config.pos_encoding == "sinusoidal" and forms.sinusoid == "computed":
            delta = g.sinusoid(contract.POSITION_IDS)  # (B, S, D)
        else:
            table = (later(w, "wpe.weight") if config.pos_encoding == "learned"
                     else sinusoidal_table(config.n_ctx, config.d_model))
            delta = g.op("Gather", [g.const("positions", table), contract.POSITION_IDS])[0]  # (B, S, D)
    for i in range(config.n_layer):
        p = f"h.{i}"
        h, x = g.add_norm(x, *scaled(g, delta, delta_bias), w, f"{p}.ln_1")  # x += delta; h = norm(x)
        if i:
            g.residuals.append(x)  # (B, S, D): layer i - 1's output
        attn = attend(g, i, g.qkv(h, w, f"{p}.attn"))  # (B, S, H*hd)
        delta, delta_bias = g.post_norm(*g.matmul(attn, w, f"{p}.attn.c_proj"), w, f"{p}.ln_1_post")
        h, x = g.add_norm(x, *scaled(g, delta, delta_bias), w, f"{p}.ln_2")
        delta, delta_bias = g.post_norm(*g.mlp(h, w, f"{p}.mlp"), w, f"{p}.ln_2_post")
    delta, delta_bias = scaled(g, delta, delta_bias)
    if delta_bias:
        delta = g.op("Add", [delta, delta_bias])[0]
    x = g.op("Add", [x, delta])[0]  # (B, S, D)
    g.residuals.append(x)
    if not every_position:
        index = g.op("Unsqueeze", [contract.LOGITS_INDEX, g.const("last_axis", _i64(-1))])[0]
        x = g.op("GatherND", [x, index], batch_dims=1)[0]  # (B, L, D): only the positions asked for
    h = g.norm(x, w, "ln_f")
    out = contract.HEAD if finishes(g) or half else contract.LOGITS  # (B, L, V)
    if config.tie_embeddings and nbits is not None:  # the quantized head is a matrix of its own
        g.nbits_matmul(h, later(w, "wte.weight"), w.shape("wte.weight"), "lm_head", nbits.of("head"), out=out)
    elif config.tie_embeddings:  # stored once; onnxruntime folds the Transpose when it loads the graph
        head = g.op("Transpose", ["wte.weight"], perm=[1, 0])[0]  # (D, V)
        g.op("MatMul", [h, head], [out])
    else:
        g.linear(h, w, "lm_head", out=out)
    with g.float32():  # a half graph's logits: float32 (its head float16)
        if finishes(g):
            finish(g, g.widen(out))  # divided, soft-capped: graph_caps.py
        elif out == contract.HEAD:
            g.widen(out, contract.LOGITS)
    return g


def model(g: Builder, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
          opsets: Mapping[str, int]) -> onnx.ModelProto:
    """The graph of `g`'s nodes and initializers as a model importing `opsets` (domain -> version; the
    default domain's at least what g's nodes need)."""
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.inits)
    versions = {**opsets, "": max(opsets.get("", 1), g.opset)}
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in versions.items()],
                             producer_name="gptport", ir_version=IR_VERSION)
