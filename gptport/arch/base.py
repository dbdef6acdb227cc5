"""What every architecture family shares, without torch: the tensors gptport's model has for a ModelConfig
(gptport_shapes); a format's layout of them (Layout: transformers' names, llama.cpp's) and the plan it gives
(for each gptport tensor: the source tensors and how they combine: as is, stacked along axis 0 (q|k|v), cut to
the vocabulary's rows, transposed, q/k rows in llama.cpp's order), carried out in memory both ways (assemble on
import, split on export; import-hf streams it: export/hf_stream.py); and `Family`, whose defaults are what the
Llama family's decoders share (config.json's keys, the rotary choices, the Llama layout of both formats). A family
module (llama.py, qwen2.py, ...) says only what differs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gptport.arch import hf_rope, hf_window
from gptport.arch.values import number, refused
from gptport.config import ModelConfig
from gptport.errors import InputError, UsageError

VOCAB_ROWS = ("wte", "lm_head")  # gptport's tensors with a row per token: cut to the tokenizer's vocabulary


@dataclass(frozen=True)
class Specials:
    """The special tokens a source declares, as ids of its tokenizer."""

    bos_id: int | None
    add_bos: bool  # the tokenizer starts every encoding with bos_id
    eos_ids: tuple[int, ...]  # every end-of-sequence id: generation_config's, config.json's, the tokenizer's
    eot_id: int  # the one that ends a document in gptport's data (tokenizer_config's eos_token first)


@dataclass(frozen=True)
class Part:
    """One source tensor of a gptport tensor: its name and shape as the format holds it, and what is done to it."""

    name: str
    shape: tuple[int, ...]
    rows: int | None = None  # keep `rows` rows from `start` (a padded vocabulary cut to the tokenizer's)
    start: int = 0  # the first row kept (a row range of a fused source: Phi-3's gate_up_proj)
    heads: int | None = None  # its rows in llama.cpp's interleaved order per head (undone on import)
    transposed: bool = False  # held as the transpose of gptport's matrix (GPT-2's Conv1D)
    plus_one: bool = False  # a norm's weight held as w where the model computes (1 + w) (Gemma's): 1 added in float32

    @property
    def out_rows(self) -> int:
        """The rows it gives gptport's tensor."""
        return self.rows if self.rows is not None else (self.shape[-1] if self.transposed else self.shape[0])


@dataclass(frozen=True)
class Planned:
    """One tensor of gptport's model.safetensors: its parts stacked along the first axis."""

    name: str
    shape: tuple[int, ...]
    parts: tuple[Part, ...]


@dataclass(frozen=True)
class RowsOf:
    """A gptport module held as the `index`-th of `count` equal row blocks of one source (Phi-3's gate_up_proj:
    the gate's rows, then the up projection's)."""

    name: str
    index: int
    count: int


@dataclass(frozen=True)
class Layout:
    """Where a format keeps gptport's tensors: the model-wide ones by name, each layer's under `block` (with {i});
    a tuple of names is q, k and v stacked (q_width, kv_width, kv_width rows)."""

    globals: Mapping[str, str]  # gptport's module -> the format's ("wte" -> "model.embed_tokens")
    block: str  # the format's prefix of layer i ("model.layers.{i}.")
    modules: Mapping[str, str | tuple[str, ...] | RowsOf]  # gptport's module in a layer -> the format's
    transposed: frozenset[str] = frozenset()  # modules whose weight the format holds transposed
    permuted: bool = False  # q and k rows in llama.cpp's interleaved order per head (its `llama` architecture)
    plus_one: frozenset[str] = frozenset()  # modules (norms) whose weight the format holds as w for (1 + w)


def gptport_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The tensors model.safetensors holds for `cfg`, by gptport name: GPT-2's layers or the Llama family's
    (RMSNorm without bias, SwiGLU's gate, q/k norms, each bias where the config has it); the tied head once."""
    d, f, v, q, kv = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.q_width, cfg.kv_width
    norm_bias = cfg.norm == "layernorm" and cfg.bias
    out: dict[str, tuple[int, ...]] = {"wte.weight": (v, d), "ln_f.weight": (d,)}
    if cfg.pos_encoding == "learned":
        out["wpe.weight"] = (cfg.n_ctx, d)
    if norm_bias:
        out["ln_f.bias"] = (d,)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = (v, d)
    mlp = {"mlp.c_fc": (f, d), "mlp.c_proj": (d, f), **({"mlp.c_gate": (f, d)} if cfg.mlp != "gelu" else {})}
    for i in range(cfg.n_layer):
        block = {**({"ln_1.weight": (d,), "ln_2.weight": (d,)} if cfg.pre_norms else {}),
                 "attn.c_attn.weight": (q + 2 * kv, d), "attn.c_proj.weight": (d, q),
                 **{f"{k}.weight": s for k, s in mlp.items()}}
        if norm_bias and cfg.pre_norms:
            block.update({"ln_1.bias": (d,), "ln_2.bias": (d,)})
        if cfg.has_qkv_bias:
            block["attn.c_attn.bias"] = (q + 2 * kv,)
        if cfg.has_out_bias:
            block["attn.c_proj.bias"] = (d,)
        if cfg.has_mlp_bias:
            block.update({f"{k}.bias": (s[0],) for k, s in mlp.items()})
        if cfg.qk_norm:
            spans = (cfg.head_dim, cfg.head_dim) if cfg.qk_norm_span == "head" else (q, kv)  # OLMo 2's: all heads
            block.update({"attn.q_norm.weight": (spans[0],), "attn.k_norm.weight": (spans[1],)})
        if cfg.post_norms:
            block.update({"ln_1_post.weight": (d,), "ln_2_post.weight": (d,)})
            if norm_bias:
                block.update({"ln_1_post.bias": (d,), "ln_2_post.bias": (d,)})
        out.update({f"h.{i}.{k}": s for k, s in block.items()})
    return out


def plan(layout: Layout, cfg: ModelConfig, vocab_rows: int) -> list[Planned]:
    """gptport's tensors for `cfg`, each from the format's (`vocab_rows`: the source's rows per token, at least the
    tokenizer's vocabulary; more are cut)."""
    if vocab_rows < cfg.vocab_size:
        raise ValueError(f"{vocab_rows} rows of vocabulary, fewer than the tokenizer's {cfg.vocab_size}")
    out = []
    for name, shape in gptport_shapes(cfg).items():
        module, _, kind = name.rpartition(".")
        if module.startswith("h."):
            _, i, sub = module.split(".", 2)
            prefix, theirs = layout.block.format(i=i), layout.modules[sub]
        else:
            sub, prefix, theirs = module, "", layout.globals[module]
        if isinstance(theirs, tuple):  # [q | k | v] along the output: (H*hd + 2*Hkv*hd, D)
            rows = (cfg.q_width, cfg.kv_width, cfg.kv_width)
            heads = (cfg.n_head, cfg.n_kv_head, None) if layout.permuted else (None, None, None)
            parts = tuple(Part(f"{prefix}{t}.{kind}", (n, *shape[1:]), heads=h)
                          for t, n, h in zip(theirs, rows, heads, strict=True))
        elif isinstance(theirs, RowsOf):  # rows index*n.. of a source count*n rows long
            parts = (Part(f"{prefix}{theirs.name}.{kind}", (shape[0] * theirs.count, *shape[1:]), rows=shape[0],
                          start=shape[0] * theirs.index),)
        else:
            cut = sub in VOCAB_ROWS and vocab_rows != shape[0]
            source = (vocab_rows, *shape[1:]) if cut else shape
            transposed = kind == "weight" and sub in layout.transposed
            parts = (Part(f"{prefix}{theirs}.{kind}", source[::-1] if transposed else source,
                          rows=shape[0] if cut else None, transposed=transposed,
                          plus_one=kind == "weight" and sub in layout.plus_one),)
        out.append(Planned(name, shape, parts))
    return out


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: each head's rows from halves order (transformers', gptport's rotation) to
    interleaved pairs (llama.cpp's `llama` rotation)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """permute undone: each head's rows back from interleaved pairs to halves."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def take(part: Part, source: np.ndarray) -> np.ndarray:
    """What `part` gives gptport's tensor from its source array."""
    a = source.T if part.transposed else source
    a = a if part.rows is None else a[part.start: part.start + part.rows]
    if part.plus_one:  # float32 w + 1: bit for bit what transformers' (1.0 + weight.float()) is
        a = np.asarray(a, dtype=np.float32) + np.float32(1.0)
    return a if part.heads is None else unpermute(a, part.heads)


def assemble(planned: Planned, read: Callable[[str], np.ndarray]) -> np.ndarray:
    """gptport's tensor from its sources (`read`: a source's array by name), in memory."""
    arrays = [take(p, read(p.name)) for p in planned.parts]
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def split_all(plans: list[Planned], pop: Callable[[str], np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """Every gptport tensor of `plans` (`pop`: its array by name) as the format's tensors, in order: split, and
    the row blocks of one fused source (RowsOf) joined back into it."""
    out: dict[str, list[tuple[int, np.ndarray]]] = {}
    for planned in plans:
        array = pop(planned.name)
        for (name, piece), part in zip(split(planned, array), planned.parts, strict=True):
            out.setdefault(name, []).append((part.start, piece))
    return [(name, pieces[0][1] if len(pieces) == 1 else np.concatenate([p for _, p in sorted(
        pieces, key=lambda sp: sp[0])])) for name, pieces in out.items()]


def split(planned: Planned, array: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """gptport's tensor as the format's (export: permuted and transposed back; a vocabulary is written as it is;
    a row block of a fused source as that block: split_all joins them)."""
    out, start = [], 0
    for p in planned.parts:
        rows = p.out_rows if len(planned.parts) > 1 else array.shape[0]
        piece = array[start:start + rows]
        start += rows
        piece = piece if p.heads is None else permute(piece, p.heads)
        if p.plus_one:  # back to w: exact wherever 1 + w lies in [0.5, 2] (Sterbenz)
            piece = np.asarray(piece, dtype=np.float32) - np.float32(1.0)
        out.append((p.name, np.ascontiguousarray(piece.T if p.transposed else piece)))
    return out



# the Llama family's config.json (each key used, ignored because it does not change what the model computes, or
# refused by name) and its layout of the tensors in transformers' and llama.cpp's formats
SHAPE = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "max_position_embeddings")  # required
USED = frozenset({*SHAPE, "architectures", "model_type", "num_key_value_heads", "rms_norm_eps", "rope_theta",
                  "rope_scaling", "rope_parameters", "tie_word_embeddings", "hidden_act", "bos_token_id",
                  "eos_token_id"})
IGNORED = frozenset({"initializer_range", "attention_dropout", "use_cache", "torch_dtype", "dtype",
                     "transformers_version", "pad_token_id", "pretraining_tp", "_name_or_path", "output_attentions",
                     "output_hidden_states", "return_dict"})
KEYS = {"n_ctx": "max_position_embeddings", "d_model": "hidden_size", "n_layer": "num_hidden_layers",
        "n_head": "num_attention_heads", "n_kv_head": "num_key_value_heads", "head_dim": "head_dim",
        "d_ff": "intermediate_size", "ln_eps": "rms_norm_eps", "rope_theta": "rope_theta", "rope_factor": "factor",
        "rope_low_freq_factor": "low_freq_factor", "rope_high_freq_factor": "high_freq_factor",
        "rope_original_n_ctx": "original_max_position_embeddings", "rope_short_factor": "short_factor",
        "rope_long_factor": "long_factor", "rope_attention_factor": "attention_factor",
        "rotary_dim": "partial_rotary_factor"}  # ModelConfig's field -> config.json's key
HF_LAYOUT = Layout(
    {"wte": "model.embed_tokens", "ln_f": "model.norm", "lm_head": "lm_head"}, "model.layers.{i}.",
    {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm",
     "attn.c_attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "attn.c_proj": "self_attn.o_proj",
     "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm", "mlp.c_gate": "mlp.gate_proj",
     "mlp.c_fc": "mlp.up_proj", "mlp.c_proj": "mlp.down_proj"})
GGUF_LAYOUT = Layout(  # llama.cpp's names (its qwen2 and qwen3 rotate halves as gptport does: rows as they are)
    {"wte": "token_embd", "ln_f": "output_norm", "lm_head": "output"}, "blk.{i}.",
    {"ln_1": "attn_norm", "ln_2": "ffn_norm", "attn.c_attn": ("attn_q", "attn_k", "attn_v"),
     "attn.c_proj": "attn_output", "attn.q_norm": "attn_q_norm", "attn.k_norm": "attn_k_norm",
     "mlp.c_gate": "ffn_gate", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"})
GGUF_KEYS = frozenset({"context_length", "embedding_length", "block_count", "feed_forward_length",
                       "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
                       "rope.freq_base", "rope.dimension_count", "rope.scaling.type", "rope.scaling.factor",
                       "rope.scaling.original_context_length", "rope.scale_linear", "attention.key_length",
                       "attention.value_length", "vocab_size"})


@dataclass(frozen=True)
class Family:
    """One architecture family: its names in config.json and GGUF, its layouts of the tensors, its config.json
    read into a ModelConfig and written back. The defaults are the Llama family's decoders' (RMSNorm, SwiGLU,
    RoPE in halves, grouped kv heads); a family says what differs."""

    model_type: str  # config.json's model_type
    hf_class: str  # config.json's architectures: the transformers class
    gguf_arch: str | None  # llama.cpp's general.architecture read as this family (None: none of its own)
    hf_keys: frozenset[str] = frozenset()  # config.json keys its class reads besides USED
    hf_layout: Layout = HF_LAYOUT
    gguf_layout: Layout = GGUF_LAYOUT
    hf_skipped: tuple[str, ...] = ("rotary_emb.inv_freq",)  # suffixes of tensors read past (older buffers)
    gguf_keys: frozenset[str] = GGUF_KEYS  # the `{gguf_arch}.*` metadata import-gguf reads
    rope_freqs: bool = False  # llama.cpp applies rope_freqs.weight (Llama 3's scaling) to its GGUF architecture
    qkv_bias: bool = False  # q, k and v always have biases (Qwen2); else attention_bias says (with o's)
    qk_norm: bool = False  # RMSNorm on each head's q and k (Qwen3)
    head_dim: int | None = None  # the class's head_dim when config.json has none (None: hidden_size / heads)
    windowed: bool = False  # a sliding window always in effect (Mistral's); else only with use_sliding_window
    partial_rope: bool = False  # the class reads partial_rotary_factor and LongRoPE ("longrope", "su": Phi-3's)
    gguf_side: frozenset[str] = frozenset()  # GGUF tensors gguf_values reads besides the plan's (Phi-3's factors)

    def canonical(self, name: str) -> str:
        """A source tensor's name as the layout spells it."""
        return name

    def hf_plan(self, cfg: ModelConfig, vocab_rows: int) -> list[Planned]:
        return plan(self.hf_layout, cfg, vocab_rows)

    def gguf_plan(self, cfg: ModelConfig, vocab_rows: int) -> list[Planned]:
        return plan(self.gguf_layout, cfg, vocab_rows)

    def model_config(self, hf: Mapping[str, Any], vocab_size: int, tokens: Specials, where: Path) -> ModelConfig:
        """The ModelConfig of config.json `hf` (`vocab_size`: the tokenizer's, which may be smaller)."""

        self._check_keys(hf, where)
        for key in SHAPE:
            number(hf, key, where, positive=True)
        n_head, d_model = number(hf, "num_attention_heads", where), number(hf, "hidden_size", where)
        attention_bias = bool(hf.get("attention_bias", False))
        values: dict[str, Any] = {
            "vocab_size": vocab_size, "n_ctx": self._n_ctx(hf, where), "d_model": d_model,
            "n_layer": number(hf, "num_hidden_layers", where), "n_head": n_head,
            "n_kv_head": number(hf, "num_key_value_heads", where, n_head, positive=True),
            "head_dim": number(hf, "head_dim", where, self.head_dim or d_model // n_head, positive=True),
            "d_ff": number(hf, "intermediate_size", where), "dropout": 0.0, "bias": False, "norm": "rmsnorm",
            "mlp": "swiglu", "ln_eps": number(hf, "rms_norm_eps", where, 1e-6, kind=float),
            "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
            "qkv_bias": self.qkv_bias or attention_bias, "out_bias": attention_bias,
            "mlp_bias": bool(hf.get("mlp_bias", False)), "qk_norm": self.qk_norm,
            "bos_id": tokens.bos_id, "add_bos": tokens.add_bos, "eos_ids": tokens.eos_ids,
            **self.layer_choices(hf, where), **hf_rope.rope(hf, where, self)}
        values.update(hf_window.read(hf, values["n_layer"], values["n_ctx"], where, self.windowed))
        try:
            return ModelConfig(**values)
        except UsageError as e:  # a shape gptport's model cannot have, said by ModelConfig with config.json's keys
            raise refused(e, KEYS, where) from e

    def layer_choices(self, hf: Mapping[str, Any], where: Path) -> dict[str, Any]:
        """ModelConfig's fields only this family's config.json says (SmolLM3's layers without rope)."""
        return {}

    def _check_keys(self, hf: Mapping[str, Any], where: Path) -> None:
        unknown = sorted(set(hf) - USED - self.hf_keys - IGNORED)
        if unknown:
            raise InputError(f"{where}: key {unknown[0]!r} is not one gptport knows for a {self.model_type} model "
                             f"({self.hf_class}); refusing rather than importing a model that may compute otherwise")
        archs = hf.get("architectures")
        if archs is not None and archs != [self.hf_class]:
            raise InputError(f"{where}: architectures {archs} is not [{self.hf_class!r}] (a causal language model)")
        if hf.get("hidden_act", "silu") != "silu":
            raise InputError(f"{where}: hidden_act {hf['hidden_act']!r} is not silu (SwiGLU's)")
        if hf.get("use_mrope"):
            raise InputError(f"{where}: use_mrope is true (multimodal rotary positions), which gptport does not have")

    def _n_ctx(self, hf: Mapping[str, Any], where: Path) -> int:
        """max_position_embeddings (a sliding window is a mask on its layers: hf_window.py)."""
        odd = [t for t in hf.get("layer_types") or [] if t not in ("full_attention", "sliding_attention")]
        if odd:
            raise InputError(f"{where}: layer type {odd[0]!r} is not one gptport has")
        return number(hf, "max_position_embeddings", where)

    def hf_config(self, cfg: ModelConfig, ends: list[int]) -> dict[str, Any]:
        """config.json of this family's transformers class for `cfg` (`ends`: every end id), every key
        model_config reads back to the same ModelConfig."""
        scaling: dict[str, Any] | None = None  # rope_scaling as transformers 4.x writes it (5.x reads it too)
        if cfg.rope_scaling == "linear":
            scaling = {"rope_type": "linear", "factor": cfg.rope_factor}
        elif cfg.rope_scaling == "llama3":
            scaling = {"rope_type": "llama3", "factor": cfg.rope_factor, "low_freq_factor": cfg.rope_low_freq_factor,
                       "high_freq_factor": cfg.rope_high_freq_factor,
                       "original_max_position_embeddings": cfg.rope_original_n_ctx}
        elif cfg.rope_scaling == "longrope":
            scaling = {"rope_type": "longrope", "short_factor": list(cfg.rope_short_factor),
                       "long_factor": list(cfg.rope_long_factor), "attention_factor": cfg.rope_attention_factor,
                       "original_max_position_embeddings": cfg.rope_original_n_ctx}
        return {
            "architectures": [self.hf_class], "model_type": self.model_type, "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_kv_head,
            "max_position_embeddings": cfg.n_ctx, "hidden_act": "silu", "rms_norm_eps": cfg.ln_eps,
            "rope_theta": cfg.rope_theta, "rope_scaling": scaling, "tie_word_embeddings": cfg.tie_embeddings,
            "bos_token_id": cfg.bos_id, "eos_token_id": ends[0] if len(ends) == 1 else ends,
            "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True, "torch_dtype": "float32",
            **self.hf_extra(cfg)}

    def hf_extra(self, cfg: ModelConfig) -> dict[str, Any]:
        """The keys of config.json only this family's class has."""
        return {}

    def gguf_values(self, f: Any, values: dict[str, Any]) -> dict[str, Any]:
        """A GGUF file's ModelConfig values beyond the Llama family's (`f`: export/gguf_file.GGUFFile)."""
        return values

    def gguf_write(self, writer: Any, cfg: ModelConfig) -> None:
        """The `{gguf_arch}.*` metadata only this family has (`writer`: a gguf.GGUFWriter); gguf_values reads it."""
