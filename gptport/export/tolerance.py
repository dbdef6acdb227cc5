"""How far an exported graph's numbers may lie from the reference's, quantity by quantity.

Float32 rounding scales with the values rounded and with how ill-conditioned the computation is: two
correct implementations that add the same products in another order (onnxruntime's AVX2 or AVX-512
kernels, cuBLAS, torch's own) differ by a few units in the last place of their partial sums, a trained
model's keys, values and logits are tens of times larger than a fresh one's, and peaked attention turns a
rounding of its scores into a relative error of its weights. So each compared quantity (the logits, each
layer's keys, each layer's values) is held to a bound made of
- `rtol` times its magnitude (the largest |x| of the reference), for the rounding of its own values;
- `ref_factor` times the reference's own rounding error, measured as torch float32 against torch float64 on
  the same inputs, for the conditioning of the model (large scores, deep stacks);
- `atol`, a floor for quantities near zero.
How each term was chosen, with the figures: docs/design/0031-parity-bounds.md. No torch here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

RTOL = 5e-5  # of the quantity's magnitude
REF_FACTOR = 20.0  # times torch float32's own distance from float64 on the same inputs
ATOL = 1e-6  # the floor: a quantity whose reference is all but zero
# onnxruntime's CUDA provider (TF32 off: providers.py) against torch on the CPU: cuBLAS splits its
# reductions otherwise again; 5x the CPU's relative term, pending a measurement of its own on a GPU
GPU_RTOL = 2.5e-4


@dataclass(frozen=True)
class Tolerance:
    """A bound of `rtol` times a quantity's magnitude, plus `ref_factor` times the reference's own float32
    error (when measured), plus `atol`."""

    rtol: float = RTOL
    atol: float = ATOL
    ref_factor: float = REF_FACTOR

    def bound(self, magnitude: float, ref_error: float = 0.0) -> float:
        return self.atol + self.rtol * magnitude + self.ref_factor * ref_error

    def __str__(self) -> str:
        return f"{self.rtol:g} x magnitude + {self.ref_factor:g} x torch's float32 error + {self.atol:g}"


GPU_TOL = Tolerance(GPU_RTOL)


@dataclass(frozen=True)
class Check:
    """One quantity compared: the largest |got - want|, the reference's magnitude, its own float32 error
    (torch float32 against float64; None when not measured) and the bound it met."""

    quantity: str  # "logits", "layer 3 keys", "layer 3 values"
    diff: float
    magnitude: float
    bound: float
    ref_error: float | None = None  # None: not measured (no torch on that side, as for an .ort file)

    @property
    def ok(self) -> bool:
        return math.isfinite(self.diff) and self.diff <= self.bound

    @property
    def ratio(self) -> float:
        """diff / bound: above 1 fails."""
        return self.diff / self.bound if self.bound > 0 else math.inf

    def describe(self) -> str:
        """'layer 3 values: max |Δ| 4.95e-05 against a bound of 2.10e-05 (magnitude 1.05, torch's float32 error
        1.20e-06)'."""
        measured = "" if self.ref_error is None else f", torch's float32 error {self.ref_error:.2e}"
        return (f"{self.quantity}: max |Δ| {self.diff:.2e} against a bound of {self.bound:.2e} "
                f"(magnitude {self.magnitude:.3g}{measured})")


def compare(quantity: str, got: np.ndarray, want: np.ndarray, tol: Tolerance, exact: np.ndarray | None = None
            ) -> Check:
    """`got` against the reference `want` (same shape); `exact`: the reference computed in float64, whose
    distance from `want` measures the reference's own rounding. A NaN or infinity in `got` is an infinite
    difference."""
    got, want = np.asarray(got, dtype=np.float32), np.asarray(want, dtype=np.float32)
    if got.shape != want.shape:
        raise ValueError(f"{quantity}: shape {got.shape} against the reference's {want.shape}")
    if got.size == 0:
        return Check(quantity, 0.0, 0.0, tol.bound(0.0), None if exact is None else 0.0)
    delta = np.abs(got - want)
    diff = float(delta.max()) if np.isfinite(delta).all() else math.inf
    magnitude = float(np.abs(want).max())
    ref_error = None if exact is None else float(np.abs(want.astype(np.float64) - exact).max())
    return Check(quantity, diff, magnitude, tol.bound(magnitude, ref_error or 0.0), ref_error)


def merge(checks: Iterable[Check], tol: Tolerance) -> Check:
    """Several checks of one quantity (the calls of a decode, the rows of a cache) as one: the largest
    difference against the bound of the largest magnitude and reference error."""
    checks = list(checks)
    diff = max(c.diff for c in checks)
    magnitude = max(c.magnitude for c in checks)
    errors = [c.ref_error for c in checks if c.ref_error is not None]
    ref_error = max(errors) if errors else None
    return Check(checks[0].quantity, diff, magnitude, tol.bound(magnitude, ref_error or 0.0), ref_error)


def cache_quantities(n_layer: int) -> list[str]:
    """The names of the present caches in contract order: layer 0 keys, layer 0 values, layer 1 keys, ..."""
    return [f"layer {i} {kv}" for i in range(n_layer) for kv in ("keys", "values")]


def worst(checks: Iterable[Check]) -> Check:
    """The check that came nearest its bound (or went furthest past it)."""
    return max(checks, key=lambda c: c.ratio)
