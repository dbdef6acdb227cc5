"""RoPE's inverse frequencies for a ModelConfig, in numpy (no torch): the float32 values transformers' rope init
functions compute (default, linear, llama3, longrope), the same float32 operations in the same order, so the torch
model (training/) and the graphs (export/) take one set of numbers. One step differs by design: base ** x is
rounded once from float64 (correctly rounded), where torch's float32 pow is Sleef's or libm's and, by the CPU's
vector width, 1 ulp off in about 1.6% of the frequencies (design record 0050); every other step is bit for bit."""

from __future__ import annotations

import math

import numpy as np

from gptport.config import ModelConfig

F32 = np.float32


def _f32(x: float) -> np.float32:
    """A Python number as torch casts a scalar operand of a float32 tensor op: to float32."""
    return F32(x)


def _reciprocal(x: np.ndarray) -> np.ndarray:
    """torch's `scalar / tensor` is tensor.reciprocal() * scalar: the reciprocal, correctly rounded."""
    return (F32(1.0) / x).astype(F32)


def exponents(cfg: ModelConfig) -> np.ndarray:
    """arange(0, dim, 2) / dim in float32, dim the rotated width of a head: (dim / 2,)."""
    dim = cfg.rotary_width
    return (np.arange(0, dim, 2, dtype=np.int64).astype(F32) / F32(dim)).astype(F32)


def _power(base: float, x: np.ndarray) -> np.ndarray:
    """base ** x for float32 x, the base cast to float32 first (as torch casts it), rounded once from float64."""
    return (np.float64(_f32(base)) ** x.astype(np.float64)).astype(F32)


def inv_freq(cfg: ModelConfig, long: bool = False, local: bool = False) -> np.ndarray:
    """The (rotary_width / 2,) float32 inverse frequencies cfg.rope_scaling says; `long`: LongRoPE's set for a
    sequence past rope_original_n_ctx (its short set otherwise, and the only set of every other scaling); `local`:
    the window layers' (rope_local_theta, unscaled: Gemma 3's), where the model has them."""
    shape = exponents(cfg)  # (dim/2,)
    if local and cfg.rope_local_theta > 0:
        return _reciprocal(_power(cfg.rope_local_theta, shape))
    if cfg.rope_scaling == "longrope":  # 1 / (factors * base ** shape)
        factors = np.array(cfg.rope_long_factor if long else cfg.rope_short_factor, dtype=F32)  # (dim/2,)
        return _reciprocal((factors * _power(cfg.rope_theta, shape)).astype(F32))
    freq = _reciprocal(_power(cfg.rope_theta, shape))  # (dim/2,)
    if cfg.rope_scaling == "linear":
        return (freq / _f32(cfg.rope_factor)).astype(F32)
    if cfg.rope_scaling == "llama3":
        return _llama3(cfg, freq)
    return freq


def _llama3(cfg: ModelConfig, freq: np.ndarray) -> np.ndarray:
    """Llama 3.1's smoothing of `freq`, transformers' _compute_llama3_parameters step for step."""
    factor, low, high = _f32(cfg.rope_factor), cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    old = cfg.rope_original_n_ctx
    low_wavelen, high_wavelen = _f32(old / low), _f32(old / high)
    wavelen = (_reciprocal(freq) * _f32(2 * math.pi)).astype(F32)  # (dim/2,)
    # long wavelengths (beyond the pretraining context / low): divided by factor; short ones kept
    llama = np.where(wavelen > low_wavelen, (freq / factor).astype(F32), freq)
    # in between: interpolated between the two with a smooth factor
    smooth = ((_reciprocal(wavelen) * _f32(old)).astype(F32) - _f32(low)) / _f32(high - low)  # (dim/2,)
    smooth = smooth.astype(F32)
    smoothed = (((F32(1.0) - smooth) * llama).astype(F32) / factor).astype(F32) + (smooth * llama).astype(F32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed.astype(F32), llama).astype(F32)


def uses_long(cfg: ModelConfig, longest: int) -> bool:
    """Whether a call whose highest position is `longest` - 1 rotates by LongRoPE's long factors: transformers
    picks them for the whole call when max(position_ids) + 1 > original_max_position_embeddings."""
    return cfg.rope_scaling == "longrope" and longest > cfg.rope_original_n_ctx
