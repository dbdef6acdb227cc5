"""RoPE written in onnx's own operators for every rope choice gptport has, where onnxruntime's fused rotations cannot
follow (GroupQueryAttention's do_rotary and RotaryEmbedding rotate whole heads by one table at cache positions):
partial rotary (the first rotary_dim of each head rotate, halves layout within it, the rest pass), LongRoPE (the
short or the long frequencies for each row, chosen as transformers chooses for a call of one row: the long ones when
the row's max(position_ids) + 1 > rope_original_n_ctx; cos and sin times the attention factor) and layers without
rope. The frequencies are gptport/rope.py's, the torch model's float32 values; cos and sin of position_ids *
frequency in float32, as the torch model takes them. No torch."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from gptport import contract, rope
from gptport.config import ModelConfig
from gptport.export.graph_body import Builder


def _i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def rope_tables(config: ModelConfig, positions: int | None = None, local: bool = False
                ) -> tuple[np.ndarray, np.ndarray]:
    """RoPE's cos and sin of position * frequency for positions 0..positions-1 (default n_ctx), (P, hd/2)
    float32 each: each frequency once, as GroupQueryAttention (do_rotary) and RotaryEmbedding read them in
    the halves (rotate_half) layout. The frequencies are the torch model's own (gptport/rope.py's float32
    values: an ulp of difference at position 8000 turns a rotation by ~1e-3 rad); the angles are taken in
    float64 and their cos and sin rounded once. Whole heads, one set of frequencies (outside(): not
    for partial rotary or LongRoPE). `local`: the window layers' own frequencies (rope_local_theta)."""
    n = config.n_ctx if positions is None else positions
    freq = rope.inv_freq(config, local=local).astype(np.float64)  # (hd/2,)
    angles = np.arange(n, dtype=np.float64)[:, None] * freq[None, :]  # (P, hd/2)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def outside(config: ModelConfig) -> bool:
    """Whether the graphs rotate q and k themselves (this module) rather than in a fused operator: partial rotary,
    LongRoPE, or a layer without rope."""
    return config.pos_encoding == "rope" and (config.rotary_width != config.head_dim
                                              or config.rope_scaling == "longrope" or bool(config.no_rope_layers))


class Rotary:
    """What every layer's rotation shares (cos and sin of the call's positions), made at the first layer's call.
    `packed`: the positions are several rows' new tokens in one sequence (1, T) (the multi-row append graph), each
    row's found by unpack_index // K (pack_index's width)."""

    def __init__(self, config: ModelConfig, packed: bool = False) -> None:
        self.config, self.positions, self.packed = config, contract.POSITION_IDS, packed
        self.cos_sin: dict[bool, tuple[str, str]] = {}  # by local (Gemma 3's window layers' own frequencies)

    def applies(self, layer: int) -> bool:
        return self.config.pos_encoding == "rope" and layer not in self.config.no_rope_layers

    def heads(self, g: Builder, x: str, layer: int, n: int) -> str:
        """x (B, S, n*hd) rotated in layer `layer` (as it is where the layer has no rope)."""
        if not self.applies(layer):
            return x
        hd = self.config.head_dim
        split = g.op("Reshape", [x, g.const(f"rope_heads_{n}", _i64(0, 0, n, hd))])[0]  # (B, S, n, hd)
        return g.op("Reshape", [self.rotate(g, split, layer), g.const(f"rope_tokens_{n}", _i64(0, 0, n * hd))])[0]

    def rotate(self, g: Builder, x: str, layer: int) -> str:
        """x (B, S, n, hd) rotated by its position's angles in the halves layout over the first rotary_width:
        (x1, x2) -> (x1 c - x2 s, x2 c + x1 s), the rest of each head as it is."""
        if not self.applies(layer):
            return x
        cfg = self.config
        rd, hd = cfg.rotary_width, cfg.head_dim
        cos, sin = self.angles(g, cfg.local_rope(layer))  # (B, S, 1, rd/2) each
        rest = ""
        if rd < hd:
            x, rest = g.op("Split", [x, g.const("rope_part", _i64(rd, hd - rd))], 2, axis=-1)  # (.., rd), (.., hd-rd)
        x1, x2 = g.op("Split", [x, g.const("rope_halves", _i64(rd // 2, rd // 2))], 2, axis=-1)  # (B, S, n, rd/2)
        first = g.op("Sub", [g.op("Mul", [x1, cos])[0], g.op("Mul", [x2, sin])[0]])[0]
        second = g.op("Add", [g.op("Mul", [x2, cos])[0], g.op("Mul", [x1, sin])[0]])[0]
        return g.op("Concat", [first, second, rest] if rest else [first, second], axis=-1)[0]  # (B, S, n, hd)

    def angles(self, g: Builder, local: bool = False) -> tuple[str, str]:
        """cos and sin of position * frequency, (B, S, 1, rd/2) float32 each; LongRoPE's set chosen for each row and
        both scaled by its attention factor; `local`: the window layers' frequencies (rope_local_theta)."""
        if local in self.cos_sin:
            return self.cos_sin[local]
        with g.float32():  # in float32, an fp16 graph's too (position * frequency needs its precision)
            cos, sin = self._angles(g, local)
        self.cos_sin[local] = g.narrow(cos), g.narrow(sin)
        return self.cos_sin[local]

    def _angles(self, g: Builder, local: bool) -> tuple[str, str]:
        cfg = self.config
        freq = g.const("rope.local_inv_freq" if local else "rope.inv_freq", rope.inv_freq(cfg, local=local))
        if cfg.rope_scaling == "longrope" and not local:  # each row's set: long once its max(position) + 1 > original
            last = self._packed_last(g) if self.packed else g.op(
                "ReduceMax", [self.positions, g.const("axis_1", _i64(1))], keepdims=1)[0]  # (1, T) or (B, 1)
            long = g.op("Greater", [last, g.const("rope.original_last", np.array(cfg.rope_original_n_ctx - 1,
                                                                                  np.int64))])[0]
            long = g.op("Unsqueeze", [long, g.const("axes_2_3", _i64(2, 3))])[0]  # (B, 1 or T, 1, 1)
            freq = g.op("Where", [long, g.const("rope.inv_freq_long", rope.inv_freq(cfg, long=True)), freq])[0]
        pos = g.op("Cast", [self.positions], to=TensorProto.FLOAT)[0]  # (B, S); freq (rd/2,) or (B, S|1, 1, rd/2)
        pos = g.op("Unsqueeze", [pos, g.const("axes_2_3", _i64(2, 3))])[0]  # (B, S, 1, 1)
        angles = g.op("Mul", [pos, freq])[0]  # (B, S, 1, rd/2)
        cos, sin = g.op("Cos", [angles])[0], g.op("Sin", [angles])[0]
        if cfg.rope_attention_factor != 1.0 and not local:
            scale = g.const("rope.attention_factor", np.array(cfg.rope_attention_factor, np.float32))
            cos, sin = g.op("Mul", [cos, scale])[0], g.op("Mul", [sin, scale])[0]
        return cos, sin

    def _packed_last(self, g: Builder) -> str:
        """(1, T): for each packed token, the highest position of its row's new tokens."""
        width = g.op("Shape", [contract.PACK_INDEX], start=1, end=2)[0]  # (1,): K
        row = g.op("Div", [contract.UNPACK_INDEX, width])[0]  # (T,): each token's row
        rows = g.op("Shape", [contract.WRITE_INDEX])[0]  # (1,): B
        zero, one = g.const("rope.zero", np.array(0, np.int64)), g.const("rope.one", np.array(1, np.int64))
        every = g.op("Range", [zero, g.op("Squeeze", [rows])[0], one])[0]  # (B,)
        mine = g.op("Equal", [g.op("Unsqueeze", [every, g.const("axis_1", _i64(1))])[0], row])[0]  # (B, T)
        held = g.op("Where", [mine, self.positions, g.const("rope.none", np.array(-1, np.int64))])[0]  # (B, T)
        last = g.op("ReduceMax", [held, g.const("axis_1", _i64(1))], keepdims=0)[0]  # (B,)
        return g.op("Unsqueeze", [g.op("Gather", [last, row], axis=0)[0], g.const("axis_0", _i64(0))])[0]  # (1, T)
