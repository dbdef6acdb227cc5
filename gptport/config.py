"""ModelConfig and TrainConfig, and config.json's round trip (the presets and --set: preset.py). No torch here."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from gptport.errors import ArtifactError, UsageError
from gptport.paths import CONFIG

PosEncoding = Literal["learned", "sinusoidal", "rope"]
Gelu = Literal["tanh", "exact"]
Norm = Literal["layernorm", "rmsnorm"]
Mlp = Literal["gelu", "swiglu", "geglu"]
RopeScaling = Literal["none", "linear", "llama3", "longrope"]
QkNormSpan = Literal["head", "all"]
MODEL_FORMAT_VERSION = 3  # config.json's format_version: 2 added the Llama family's keys (design record 0035), 3 the
#                          keys after eos_ids (Gemma's, Phi's, ...: issue 59)
MODEL_FORMAT_VERSIONS = (1, 2, 3)  # what this gptport reads: an older file is a newer one at the defaults
_ROPE = ("rope_theta", "rotary_dim", "no_rope_layers", "rope_scaling", "rope_factor", "rope_low_freq_factor",
         "rope_high_freq_factor", "rope_original_n_ctx", "rope_short_factor", "rope_long_factor",
         "rope_attention_factor")  # rope's keys: three of every rope, then the scalings'
_SCALING_KEYS = {"linear": ("rope_factor",), "llama3": ("rope_factor", "rope_low_freq_factor",
                                                       "rope_high_freq_factor", "rope_original_n_ctx"),
                 "longrope": ("rope_original_n_ctx", "rope_short_factor", "rope_long_factor",
                              "rope_attention_factor")}
_CHOICES: dict[str, tuple[str, ...]] = {
    "pos_encoding": ("learned", "sinusoidal", "rope"), "gelu": ("tanh", "exact"), "norm": ("layernorm", "rmsnorm"),
    "mlp": ("gelu", "swiglu", "geglu"), "rope_scaling": ("none", "linear", "llama3", "longrope"),
    "qk_norm_span": ("head", "all")}


def swiglu_width(d_model: int) -> int:
    """SwiGLU's default hidden width: 8/3 d_model (its three matrices hold as many weights as GELU's two of
    4 d_model), rounded up to a multiple of 64."""
    return -(-8 * d_model // 192) * 64


# each dimension's most: far past any published model, so a stranger's config sizes nothing absurd (design 0045)
LARGEST = {"vocab_size": 2**24, "n_ctx": 2**24, "d_model": 2**16, "n_layer": 2**12, "n_head": 2**12,
           "d_ff": 2**20, "n_kv_head": 2**12, "head_dim": 2**12}


@dataclass(frozen=True)
class ModelConfig:
    """The model's shape. Defaults are GPT-2's choices where GPT-2 made one; the keys after `gelu`
    (format_version 2) add the Llama family's choices, and at their defaults the model is GPT-2's."""

    vocab_size: int
    n_ctx: int = 256  # longest sequence the positions cover
    d_model: int = 384
    n_layer: int = 6
    n_head: int = 6
    d_ff: int = 0  # 0: 4 * d_model for GELU (the classic width), swiglu_width(d_model) for SwiGLU
    dropout: float = 0.0  # small models on small corpora overfit late; 0 is right for short runs
    bias: bool = True  # GPT-2 has biases in every Linear and LayerNorm; false: none but the three below
    pos_encoding: PosEncoding = "learned"
    tie_embeddings: bool = True  # the head reuses the token embedding: fewer parameters, better at small scale
    ln_eps: float = 1e-5  # the epsilon of every norm, LayerNorm or RMSNorm
    gelu: Gelu = "tanh"  # GPT-2's approximation; "exact" is erf-based (mlp "gelu" only)
    n_kv_head: int = 0  # key/value heads, each shared by n_head / n_kv_head query heads (GQA; 1: MQA); 0: n_head
    head_dim: int = 0  # 0: d_model // n_head; explicit where n_head * head_dim != d_model (Qwen3)
    norm: Norm = "layernorm"  # "rmsnorm": no mean subtracted, no bias (Llama)
    mlp: Mlp = "gelu"  # "swiglu": c_proj(silu(c_gate(x)) * c_fc(x)) (Llama)
    qkv_bias: bool = False  # q, k and v have biases even when bias is false (Qwen2)
    out_bias: bool = False  # the attention's output projection has a bias even when bias is false
    mlp_bias: bool = False  # the MLP's projections have biases even when bias is false (Llama's mlp_bias)
    qk_norm: bool = False  # RMSNorm over head_dim on each head's q and k, before the rotation (Qwen3)
    rope_theta: float = 10000.0  # RoPE's base wavelength (pos_encoding "rope")
    rope_scaling: RopeScaling = "none"  # "linear": frequencies / rope_factor; "llama3": Llama 3.1's smoothing
    rope_factor: float = 1.0  # linear and llama3
    rope_low_freq_factor: float = 1.0  # llama3
    rope_high_freq_factor: float = 4.0  # llama3
    rope_original_n_ctx: int = 8192  # llama3: the context the model was pretrained with
    bos_id: int | None = None  # the beginning-of-sequence token, if the model has one
    add_bos: bool = False  # prompts start with bos_id (Llama's tokenizers add it)
    eos_ids: tuple[int, ...] = ()  # the tokens that end a sequence, a set; (): the tokenizer's <|endoftext|>
    # format_version 3 (issue 59): each at its default computes what version 2 did
    embed_scale: float = 1.0  # the token embeddings are multiplied by it (Gemma: sqrt(d_model), as float32)
    attn_scale: float = 0.0  # the softmax's scale of q.k; 0: 1/sqrt(head_dim) (Gemma: query_pre_attn_scalar^-0.5)
    post_norms: bool = False  # a norm (ln_1_post, ln_2_post) on the attention's and the MLP's outputs before each
    #                           residual add (Gemma 2 and 3, OLMo 2)
    sliding_window: int = 0  # > 0: the layers of window_layers attend to the last sliding_window positions only,
    #                          their own included (query q sees keys k with q - window < k <= q)
    window_layers: tuple[int, ...] = ()  # the layers that attend within sliding_window, a set
    rope_local_theta: float = 0.0  # > 0: the window layers' RoPE base, unscaled (Gemma 3's rope_local_base_freq);
    #                                0: they rotate as the others do
    # format_version 3, Phi-3 and SmolLM3 (design record 0050): partial rotary, LongRoPE, layers without rope
    rotary_dim: int = 0  # rope rotates the first rotary_dim of each head, the rest pass (Phi-4-mini); 0: head_dim
    rope_short_factor: tuple[float, ...] = ()  # longrope: each frequency divided by it while the sequence is
    #                                            at most rope_original_n_ctx long (rotary_width / 2 of them)
    rope_long_factor: tuple[float, ...] = ()  # longrope: the divisors once it is longer
    rope_attention_factor: float = 1.0  # longrope: cos and sin multiplied by it
    no_rope_layers: tuple[int, ...] = ()  # indices of the layers that do not rotate q and k (SmolLM3)
    # format_version 3, Gemma 2, Granite and OLMo 2 (design record 0052)
    attn_softcap: float = 0.0  # > 0: each attention score s (after the scale, before the mask) becomes
    #                            tanh(s / attn_softcap) * attn_softcap (Gemma 2's attn_logit_softcapping); 0: none
    final_softcap: float = 0.0  # > 0: each logit l becomes tanh(l / final_softcap) * final_softcap (Gemma 2); 0: none
    residual_scale: float = 1.0  # each sublayer's output is multiplied by it before the residual add (Granite's
    #                              residual_multiplier)
    logits_divisor: float = 1.0  # the logits are divided by it (Granite's logits_scaling)
    pre_norms: bool = True  # a norm (ln_1, ln_2) before the attention and the MLP; false: none (OLMo 2, whose
    #                         post_norms are its only ones)
    qk_norm_span: QkNormSpan = "head"  # qk_norm's RMSNorm over each head's head_dim ("head": Qwen3, Gemma 3) or
    #                                    over all heads of q (q_width) and of k (kv_width) together ("all": OLMo 2)

    def __post_init__(self) -> None:
        if self.n_kv_head == 0:
            object.__setattr__(self, "n_kv_head", self.n_head)
        if self.head_dim == 0 and self.n_head > 0:
            if self.d_model % self.n_head:
                raise UsageError(f"model.d_model ({self.d_model}) must be divisible by model.n_head ({self.n_head})")
            object.__setattr__(self, "head_dim", self.d_model // self.n_head)
        if self.d_ff == 0:
            object.__setattr__(self, "d_ff", 4 * self.d_model if self.mlp == "gelu" else swiglu_width(self.d_model))
        object.__setattr__(self, "eos_ids", tuple(sorted(set(self.eos_ids))))
        object.__setattr__(self, "window_layers", tuple(sorted(set(self.window_layers))))
        object.__setattr__(self, "no_rope_layers", tuple(sorted(set(self.no_rope_layers))))
        for name in ("rope_short_factor", "rope_long_factor"):
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        self.validate()

    @property
    def rotary_width(self) -> int:
        """How much of each head rope rotates: rotary_dim, or the whole head."""
        return self.rotary_dim or self.head_dim

    @property
    def has_qkv_bias(self) -> bool:
        return self.bias or self.qkv_bias

    @property
    def has_out_bias(self) -> bool:
        return self.bias or self.out_bias

    @property
    def has_mlp_bias(self) -> bool:
        return self.bias or self.mlp_bias

    @property
    def q_width(self) -> int:
        """Width of all query heads together: n_head * head_dim."""
        return self.n_head * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of all key (or value) heads together: n_kv_head * head_dim."""
        return self.n_kv_head * self.head_dim

    @property
    def softmax_scale(self) -> float:
        """The scale of q.k before the softmax: attn_scale, or 1/sqrt(head_dim)."""
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)

    def windowed(self, layer: int) -> bool:
        """Whether `layer` attends within sliding_window (only the last sliding_window positions)."""
        return self.sliding_window > 0 and layer in self.window_layers

    def local_rope(self, layer: int) -> bool:
        """Whether `layer` rotates by rope_local_theta (a window layer of a model that has one)."""
        return self.rope_local_theta > 0 and self.windowed(layer)

    def llama_choices(self) -> list[str]:
        """The Llama family's choices of this model's layers, named (empty for GPT-2's layers): what a writer
        made for GPT-2's layers alone names when it refuses a model (the static-cache graphs take them all)."""
        return [what for what, used in (
            ("rope positions", self.pos_encoding == "rope"), ("RMSNorm", self.norm == "rmsnorm"),
            ("SwiGLU", self.mlp == "swiglu"),
            (f"{self.n_kv_head} key/value heads for {self.n_head} query heads", self.n_kv_head != self.n_head),
            (f"heads {self.q_width} wide over d_model {self.d_model}", self.q_width != self.d_model),
            ("q/k norm", self.qk_norm)) if used] + self.gemma_choices()

    def gemma_choices(self) -> list[str]:
        """The choices of format_version 3 this model makes, named (empty at the defaults): what a graph written
        without them names when it refuses the model."""
        return [what for what, used in (
            ("GeGLU", self.mlp == "geglu"), (f"embeddings scaled by {self.embed_scale:g}", self.embed_scale != 1.0),
            (f"softmax scale {self.attn_scale:g}", self.attn_scale != 0.0), ("post-norms", self.post_norms),
            (f"a sliding window of {self.sliding_window}", self.sliding_window > 0 and bool(self.window_layers)),
            (f"local RoPE base {self.rope_local_theta:g}", self.rope_local_theta > 0),
            (f"attention soft-capping at {self.attn_softcap:g}", self.attn_softcap > 0),
            (f"logit soft-capping at {self.final_softcap:g}", self.final_softcap > 0),
            (f"residual scale {self.residual_scale:g}", self.residual_scale != 1.0),
            (f"logits divided by {self.logits_divisor:g}", self.logits_divisor != 1.0),
            ("no pre-norms", not self.pre_norms), ("q/k norm over all heads", self.qk_norm_span == "all")) if used]

    def inert(self) -> dict[str, str]:
        """The fields this model's other choices leave without effect, each with why (a `--set` of one of
        them would change nothing)."""
        out: dict[str, str] = {}
        if self.mlp == "swiglu":
            out["gelu"] = f"model.mlp is {self.mlp!r} (gelu is the GELU and GeGLU MLPs')"
        if self.sliding_window == 0:
            out |= {k: f"model.sliding_window is 0 ({k} is a window's)" for k in ("window_layers", "rope_local_theta")}
        elif not self.window_layers:
            out |= {k: f"model.window_layers is empty ({k} is the window layers')"
                    for k in ("sliding_window", "rope_local_theta")}
        if not self.qk_norm:
            out["qk_norm_span"] = "model.qk_norm is false (qk_norm_span is the q/k norm's)"
        if self.pos_encoding != "rope":
            out |= {k: f"model.pos_encoding is {self.pos_encoding!r} ({k} is rope's)" for k in _ROPE}
        else:
            used = _SCALING_KEYS.get(self.rope_scaling, ())
            out |= {k: f"model.rope_scaling is {self.rope_scaling!r} ({k} is another scaling's)" for k in _ROPE[4:]
                    if k not in used}
        if self.bias:
            out |= {k: f"model.bias is true (every layer has biases; {k} adds them where bias is false)"
                    for k in ("qkv_bias", "out_bias", "mlp_bias")}
        return out

    def validate(self) -> None:
        """Refuse shapes the model cannot have, naming the field."""
        for name, most in LARGEST.items():
            if getattr(self, name) <= 0:
                raise UsageError(f"model.{name} must be positive, not {getattr(self, name)}")
            if getattr(self, name) > most:  # a config from a stranger: refused before anything is sized by it
                raise UsageError(f"model.{name} must be at most {most:,}, not {getattr(self, name):,}")
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                words = ", ".join(repr(a) for a in allowed[:-1]) + f" or {allowed[-1]!r}"
                raise UsageError(f"model.{name} must be {words}, not {getattr(self, name)!r}")
        if self.n_head % self.n_kv_head:
            raise UsageError(f"model.n_head ({self.n_head}) must be a multiple of model.n_kv_head ({self.n_kv_head})")
        if self.pos_encoding == "sinusoidal" and self.d_model % 2:
            raise UsageError("model.d_model must be even for sinusoidal positions")
        if self.pos_encoding == "rope" and self.head_dim % 2:
            raise UsageError(f"model.head_dim must be even for rope positions, not {self.head_dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise UsageError(f"model.dropout must be in [0, 1), not {self.dropout}")
        if not 0.0 <= self.ln_eps < math.inf:
            raise UsageError(f"model.ln_eps must be a finite number >= 0, not {self.ln_eps}")
        self._validate_rope()
        self._validate_tokens()
        self._validate_window()

    def _validate_window(self) -> None:
        for name in ("embed_scale", "attn_scale", "rope_local_theta"):
            if not 0 <= getattr(self, name) < math.inf or (name == "embed_scale" and self.embed_scale == 0):
                raise UsageError(f"model.{name} must be a finite positive number, not {getattr(self, name)}")
        if not 0 <= self.sliding_window <= LARGEST["n_ctx"]:
            raise UsageError(f"model.sliding_window must be 0 (none) or positive, not {self.sliding_window}")
        bad = [i for i in self.window_layers if not 0 <= i < self.n_layer]
        if bad:
            raise UsageError(f"model.window_layers: layer {bad[0]} is not one of the {self.n_layer} layers")
        if self.rope_local_theta > 0 and self.pos_encoding != "rope":
            raise UsageError("model.rope_local_theta is set but model.pos_encoding is not 'rope'")
        for name in ("attn_softcap", "final_softcap", "residual_scale", "logits_divisor"):
            value, off = getattr(self, name), name.endswith("softcap")  # a softcap's 0 is none
            if not 0 <= value < math.inf or (value == 0 and not off):
                kind = "number >= 0 (0: none)" if off else "positive number"
                raise UsageError(f"model.{name} must be a finite {kind}, not {value}")
        if not self.pre_norms and not self.post_norms:
            raise UsageError("model.pre_norms and model.post_norms are both false: a block without a norm")

    def _validate_rope(self) -> None:
        for name in ("rope_theta", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                     "rope_original_n_ctx"):
            if not 0 < getattr(self, name) < math.inf:
                raise UsageError(f"model.{name} must be a finite positive number, not {getattr(self, name)}")
        if self.rope_scaling == "llama3" and self.rope_high_freq_factor <= self.rope_low_freq_factor:
            raise UsageError(f"model.rope_high_freq_factor ({self.rope_high_freq_factor}) must exceed "
                             f"model.rope_low_freq_factor ({self.rope_low_freq_factor})")
        self._validate_partial_rope()

    def _validate_partial_rope(self) -> None:
        """rotary_dim, LongRoPE's factors and the layers without rope (format_version 3)."""
        if not 0 <= self.rotary_dim <= self.head_dim or self.rotary_dim % 2:
            raise UsageError(f"model.rotary_dim must be an even number from 0 to head_dim ({self.head_dim}), "
                             f"not {self.rotary_dim}")
        if not 0 < self.rope_attention_factor < math.inf:
            raise UsageError(f"model.rope_attention_factor must be a finite positive number, not "
                             f"{self.rope_attention_factor}")
        for name in ("rope_short_factor", "rope_long_factor"):
            values = getattr(self, name)
            if self.rope_scaling == "longrope" and len(values) != self.rotary_width // 2:
                raise UsageError(f"model.{name} must have {self.rotary_width // 2} values (one per frequency), "
                                 f"not {len(values)}")
            if not all(0 < v < math.inf for v in values):
                raise UsageError(f"model.{name} must hold finite positive numbers")
        bad = [i for i in self.no_rope_layers if not 0 <= i < self.n_layer]
        if bad:
            raise UsageError(f"model.no_rope_layers: layer {bad[0]} is not one of the model's (0..{self.n_layer - 1})")

    def _validate_tokens(self) -> None:
        for name, ids in (("bos_id", () if self.bos_id is None else (self.bos_id,)), ("eos_ids", self.eos_ids)):
            bad = [i for i in ids if not 0 <= i < self.vocab_size]
            if bad:
                raise UsageError(f"model.{name}: token {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})")
        if self.add_bos and self.bos_id is None:
            raise UsageError("model.add_bos is true but model.bos_id is not set")

    def n_params(self) -> int:
        """Parameter count, tied weights counted once."""
        d, f, v, q, kv = self.d_model, self.d_ff, self.vocab_size, self.q_width, self.kv_width
        qkv_b, out_b, mlp_b = int(self.has_qkv_bias), int(self.has_out_bias), int(self.has_mlp_bias)
        norm = d + (d if self.norm == "layernorm" and self.bias else 0)
        attn = d * (q + 2 * kv) + qkv_b * (q + 2 * kv) + q * d + out_b * d
        attn += (2 * self.head_dim if self.qk_norm_span == "head" else q + kv) if self.qk_norm else 0
        gated = self.mlp != "gelu"
        mlp = (3 if gated else 2) * d * f + mlp_b * ((2 if gated else 1) * f + d)
        norm_layer = (2 * self.pre_norms + 2 * self.post_norms) * norm
        emb = v * d + (self.n_ctx * d if self.pos_encoding == "learned" else 0)
        head = 0 if self.tie_embeddings else v * d
        return emb + self.n_layer * (attn + mlp + norm_layer) + norm + head


@dataclass(frozen=True)
class TrainConfig:
    """How to train. Defaults suit the `small` preset on one GPU; presets override them."""

    steps: int = 2000
    minutes: float = 0.0  # > 0: train for this time (as `clock` counts it) instead of a number of steps
    clock: str = "wall"  # what --minutes counts: wall time, or "cpu": the process's CPU time / torch threads
    schedule_steps: int = 0  # horizon of the LR schedule; 0 means `steps`
    batch_size: int = 32
    grad_accum: int = 1  # micro-batches per optimizer step on each rank
    global_batch: int = 0  # > 0: sequences per optimizer step over all ranks; sets grad_accum
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * this
    warmup_steps: int = 100
    weight_decay: float = 0.1  # on matrices and embeddings only
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 200
    eval_batches: int = 20
    checkpoint_every: int = 0  # steps between checkpoints; 0 means eval_every
    val_fraction: float = 0.1
    seed: int = 1337
    device: str = "auto"
    compile: bool = False
    autocast: str = "auto"  # auto: bf16 where native (CUDA from Ampere on, CPUs with AVX512-BF16/AMX); else fp32
    threads: int = 0  # torch intra-op threads on the CPU; 0 leaves torch's default

    def validate(self) -> None:
        for name in ("steps", "batch_size", "grad_accum", "eval_every", "eval_batches"):
            if getattr(self, name) <= 0:
                raise UsageError(f"--{name.replace('_', '-')} must be positive, not {getattr(self, name)}")
        if self.global_batch < 0:
            raise UsageError(f"--global-batch must be positive, not {self.global_batch}")
        if self.lr <= 0:
            raise UsageError(f"--lr must be positive, not {self.lr}")
        if not 0.0 < self.val_fraction < 0.5:
            raise UsageError(f"--val-fraction must be in (0, 0.5), not {self.val_fraction}")
        if self.minutes < 0:
            raise UsageError(f"--minutes must be positive, not {self.minutes}")
        if self.clock not in ("wall", "cpu"):
            raise UsageError(f"train.clock must be wall or cpu, not {self.clock!r}")
        if self.autocast not in ("auto", "bf16", "fp32"):
            raise UsageError(f"train.autocast must be auto, bf16 or fp32, not {self.autocast!r}")
        if self.device not in ("auto", "cpu", "cuda", "mps"):
            raise UsageError(f"--device must be auto, cpu, cuda or mps, not {self.device!r}")


def field_types(cls: type) -> dict[str, str]:
    """Each field's declared type as written (`from __future__ import annotations` keeps them as strings)."""
    return {f.name: str(f.type) for f in fields(cls)}


def model_config_to_dict(cfg: ModelConfig) -> dict[str, Any]:
    """Every field at its value, as JSON has it (eos_ids a list)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()}


# the JSON types each ModelConfig field takes (bool is no int here; a float field takes an int)
_JSON_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"), "float": ((int, float), "a number"), "bool": ((bool,), "true or false"),
    "int | None": ((int, type(None)), "an integer or null"), "tuple[int, ...]": ((list,), "a list of integers"),
    "tuple[float, ...]": ((list,), "a list of numbers"),
    **{kind: ((str,), "a string") for kind in ("PosEncoding", "Gelu", "Norm", "Mlp", "RopeScaling", "QkNormSpan")}}


def model_config_from_dict(data: Mapping[str, Any], where: str = CONFIG) -> ModelConfig:
    """A ModelConfig from a JSON object (config.json's "model", a graph's gptport.config metadata), or an
    ArtifactError naming `where`: no vocab_size, a key gptport does not know, a value of the wrong type, a
    shape the model cannot have. Format 1's objects (no Llama-family keys) read as the defaults."""
    if not isinstance(data, Mapping):
        raise ArtifactError(f"{where}: the model config is not a JSON object")
    known = field_types(ModelConfig)
    missing = {"vocab_size"} - set(data)
    if missing:
        raise ArtifactError(f"{where}: model has no {', '.join(sorted(missing))}")
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ArtifactError(f"{where}: unknown model config key {unknown[0]!r} (written by a newer gptport, or "
                            "edited by hand)")
    values = dict(data)
    for name, value in values.items():
        kinds, words = _JSON_TYPES[known[name]]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ArtifactError(f"{where}: invalid model config (model.{name} must be {words}, not {value!r})")
        if known[name] == "float":
            values[name] = float(value)
        elif known[name] == "tuple[int, ...]":
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                raise ArtifactError(f"{where}: invalid model config (model.{name} must be {words}, not {value!r})")
            values[name] = tuple(value)
        elif known[name] == "tuple[float, ...]":
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
                raise ArtifactError(f"{where}: invalid model config (model.{name} must be {words}, not {value!r:.60})")
            values[name] = tuple(float(v) for v in value)
    try:
        return ModelConfig(**values)
    except UsageError as e:
        raise ArtifactError(f"{where}: invalid model config ({e})") from e


def check_format_version(data: Mapping[str, Any], where: str) -> None:
    """Refuse a config.json whose format_version this gptport does not read (a newer one's); none is 1."""
    version = data.get("format_version", 1)
    if version not in MODEL_FORMAT_VERSIONS or isinstance(version, bool):
        raise ArtifactError(f"{where}: format_version {version!r} is not one this gptport reads "
                            f"({', '.join(map(str, MODEL_FORMAT_VERSIONS))}); upgrade gptport")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`, or an ArtifactError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(f"{path}: missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: expected a JSON object")
    return data
