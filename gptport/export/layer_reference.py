"""The torch model's forward one layer at a time, from weights read by name: the reference of a layer-by-layer
parity check whose memory is the embeddings, one layer and the activations, not the whole model.

`run_layers` builds each `Block` of training/model.py on the meta device, gives it that layer's weights only
(load_state_dict(assign=True)), runs it with GPT.forward's mask and rotation, yields the layer's output and
cache, and drops it. In float32 the operations and their order are GPT.forward's, so the numbers are the
same; in float64 they are float64_reference.py's (its weights, mask floor and inverse frequencies widened).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gptport.config import ModelConfig
from gptport.errors import ArtifactError, InputError
from gptport.export.lazy_weights import Float32
from gptport.export.tolerance import Check, Tolerance, compare
from gptport.weights import shape_of, take

if TYPE_CHECKING:
    import torch

WeightFn = Callable[[str], np.ndarray]  # gptport's tensor name ("h.3.attn.c_attn.weight") -> float32 array
Weights = WeightFn | Mapping[str, np.ndarray]  # a mapping's embedding rows are read alone (gptport.weights.take)
HEAD_ROWS = 8192  # vocabulary rows of the head widened at a time when dtype is not float32 (float64: 64 MiB at d 1024)
HOLD_BYTES = 2 << 30  # the modules a LayerMemo keeps for later passes


@dataclass(frozen=True)
class LayerOut:
    """Layer `index`'s outputs: the residual stream after it (the next layer's input) and its present cache."""

    index: int
    hidden: np.ndarray  # (B, T, D)
    key: np.ndarray  # (B, Hkv, T, hd), rotated, as the model caches it
    value: np.ndarray  # (B, Hkv, T, hd)


def run_layers(cfg: ModelConfig, weights: Weights, input_ids: np.ndarray, attention_mask: np.ndarray | None = None,
               position_ids: np.ndarray | None = None, dtype: torch.dtype | None = None,
               last_only: bool = False, past: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
               logits: bool = True) -> Iterator[LayerOut | np.ndarray]:
    """GPT.forward piece by piece: LayerOut 0 .. n_layer-1 (each layer's keys and values the present cache, past
    included), then the logits (B, T, V), or (B, 1, V) with `last_only` (every row's last position, as
    GPT.forward's). `dtype` float32 (the default) or float64 (the exact reference). Ids and positions (B, T) and
    mask (B, P+T) are integer arrays; mask None is all ones, positions None skip the left padding
    (default_position_ids); `past`: each layer's keys and values (B, Hkv, P, hd) of earlier calls (LayerOut's).
    Logits in float64 are B*T*V*8 bytes: 64 MiB at T 64 and a vocabulary of 128k, so last_only matters only for
    long prompts. Without `logits`, the final norm's output (B, T, D) comes last instead, for head() to finish a
    few rows at a time."""
    import torch

    from gptport.training.layers import make_norm, model_rope, rope_cos_sin, rope_inv_freq
    from gptport.training.model import (
        Block,
        additive,
        attention_mask_4d,
        default_position_ids,
        finished_logits,
        layer_inputs,
        scaled_embeddings,
        sinusoidal,
    )

    dtype = dtype or torch.float32
    weight: WeightFn = weights.__getitem__ if isinstance(weights, Mapping) else weights
    ids = torch.from_numpy(np.asarray(input_ids, dtype=np.int64))  # (B, T)
    B, T = ids.shape
    P = past[0][0].shape[2] if past else 0
    mask = torch.ones(B, P + T, dtype=torch.long) if attention_mask is None else torch.from_numpy(
        np.asarray(attention_mask, dtype=np.int64))  # (B, P+T)
    pos = default_position_ids(mask, T) if position_ids is None else torch.from_numpy(
        np.asarray(position_ids, dtype=np.int64))  # (B, T)
    full = additive(attention_mask_4d(mask, T), dtype)  # (B, 1, T, P+T)
    window = additive(attention_mask_4d(mask, T, cfg.sliding_window), dtype) if cfg.sliding_window else None

    with torch.no_grad():  # never held across a yield: the caller's code between items keeps its grad mode
        x = scaled_embeddings(_rows(weights, "wte.weight", ids, (cfg.vocab_size, cfg.d_model), dtype), cfg)  # (B, T, D)
        rope = local = None
        if cfg.pos_encoding == "learned":
            x = x + _rows(weights, "wpe.weight", pos, (cfg.n_ctx, cfg.d_model), dtype)
        elif cfg.pos_encoding == "sinusoidal":
            x = x + sinusoidal(pos, cfg.d_model).to(x.dtype)
        else:  # rope: the float32 inverse frequencies, widened for float64 (as float64_copy widens the buffer)
            long = rope_inv_freq(cfg, long=True).to(dtype) if cfg.rope_scaling == "longrope" else None
            rope = model_rope(cfg, pos, (rope_inv_freq(cfg).to(dtype), long), x.dtype)  # (B, T, rd) each
            if cfg.rope_local_theta > 0:
                local = rope_cos_sin(pos, rope_inv_freq(cfg, local=True).to(dtype), x.dtype)  # (B, T, hd) each
    for i in range(cfg.n_layer):
        with torch.no_grad():
            block = _module(weights, lambda: Block(cfg), f"h.{i}.", weight, dtype)
            layer_mask, layer_rope = layer_inputs(cfg, i, (full, window), (rope, local))
            held = None if not past else tuple(_tensor(np.asarray(a), dtype) for a in past[i])  # (B, Hkv, P, hd) each
            x, (k, v) = block(x, layer_mask, held, layer_rope)  # (B, T, D); (B, Hkv, P+T, hd) each
            del block
        yield LayerOut(i, x.numpy(), k.contiguous().numpy(), v.contiguous().numpy())
    with torch.no_grad():
        x = _module(weights, lambda: make_norm(cfg, cfg.d_model), "ln_f.", weight, dtype)(x)  # (B, T, D)
        if last_only:
            x = x[:, -1:]  # (B, 1, D)
        if logits:
            x = finished_logits(_head(x, _head_name(cfg), weights, (cfg.vocab_size, cfg.d_model), dtype), cfg)
    yield x.numpy()  # (B, T, V), or (B, T, D) without `logits`


def head(cfg: ModelConfig, weight: WeightFn) -> Callable[[np.ndarray], np.ndarray]:
    """The float32 head loaded once: the final norm's output (..., D) -> the logits (..., V), as run_layers' last."""
    import torch

    from gptport.training.model import finished_logits

    linear = _loaded(lambda: torch.nn.Linear(cfg.d_model, cfg.vocab_size, bias=False), _head_name(cfg), weight,
                     torch.float32)

    def logits(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return finished_logits(linear(torch.from_numpy(np.ascontiguousarray(x))), cfg).numpy()  # (..., V)

    return logits


def _head_name(cfg: ModelConfig) -> str:
    return "wte." if cfg.tie_embeddings else "lm_head."


class LayerMemo(Float32):
    """`weights` read into modules kept between runs: one module of each kind (a layer, the final norm, the head)
    and float type, refilled in place for each layer (ModelWeights.into: no new memory; the second float type
    converted from the first) and not at all while it holds the tensors asked for. So runs advanced in step
    (run_together) read each tensor once for all of them, and passes one after another (reference_greedy's steps)
    reuse the head. While more than HOLD_BYTES are held, moving between the layers and what lies outside them
    drops the other side's modules. (Holding every layer where the model fits was measured: Qwen2.5-0.5B's export
    peaked 0.9 GB higher and was no faster.)"""

    def __init__(self, weights: Mapping[str, np.ndarray]) -> None:
        super().__init__(weights)
        self.modules: dict[tuple[str, torch.dtype], tuple[str, torch.nn.Module]] = {}  # -> (prefix held, module)
        self.rows: dict[torch.dtype, torch.Tensor] = {}  # _head's buffer of HEAD_ROWS rows per float type

    def module(self, prefix: str, dtype: torch.dtype, build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        """The module `build` makes, in `dtype` and eval mode, holding the weights under `prefix`."""
        import torch

        kind = _kind(prefix)
        held = self.modules.get((kind, dtype))
        if held is not None and held[0] == prefix:
            return held[1]
        if held is None:
            if sum(_bytes(m) for _, m in self.modules.values()) > HOLD_BYTES:
                self._drop(kind)
            module = _empty(build, dtype)
        else:
            module = held[1]
        twin = next((m for (k, t), (p, m) in self.modules.items() if k == kind and p == prefix and t != dtype), None)
        if twin is not None:  # the same tensors in another float type: converted from it, not read again
            with torch.no_grad():
                for mine, theirs in zip(module.state_dict().values(), twin.state_dict().values(), strict=True):
                    mine.copy_(theirs)
        else:
            _fill(module, prefix, self.weights)
        self.modules[kind, dtype] = (prefix, module)
        return module

    def head_rows(self, n: int, d: int, dtype: torch.dtype) -> torch.Tensor:
        """A buffer of n rows of d for _head's widened rows, kept for the next pass."""
        import torch

        if dtype not in self.rows or self.rows[dtype].shape != (n, d):
            self.rows[dtype] = torch.empty(n, d, dtype=dtype)
        return self.rows[dtype]

    def _drop(self, kind: str) -> None:
        """The modules of the other side (the layers, or what lies outside them) than `kind`'s."""
        for key in [k for k in self.modules if (k[0] == "h.") != (kind == "h.")]:
            del self.modules[key]
        if kind == "h.":
            self.rows.clear()

    def take(self, name: str, index: np.ndarray) -> np.ndarray:
        return take(self.weights, name, index)


def _bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def _empty(build: Callable[[], torch.nn.Module], dtype: torch.dtype) -> torch.nn.Module:
    """The module `build` makes, in `dtype`, its tensors allocated and not initialized, in eval mode."""
    import torch

    with torch.device("meta"):
        module = build().to(dtype)
    return module.to_empty(device="cpu").eval()


def _fill(module: torch.nn.Module, prefix: str, weights: Mapping[str, np.ndarray]) -> None:
    """Each of the module's tensors overwritten with `weights`' of prefix + its name, refused in one line where the
    shapes differ; read in place where the weights can (ModelWeights.into, which checks the shape itself)."""
    into = getattr(weights, "into", None)
    for name, t in module.state_dict().items():
        out = t.detach().numpy()  # the module's own memory
        if into is not None:
            into(prefix + name, out)
        else:
            np.copyto(out, _checked(weights.__getitem__, prefix + name, tuple(out.shape)), casting="unsafe")


def _module(weights: Weights, make: Callable[[], torch.nn.Module], prefix: str, weight: WeightFn,
            dtype: torch.dtype) -> torch.nn.Module:
    """_loaded's module, kept and refilled (LayerMemo.module) where `weights` is a LayerMemo."""
    if isinstance(weights, LayerMemo):
        return weights.module(prefix, dtype, make)
    return _loaded(make, prefix, weight, dtype)


def _kind(prefix: str) -> str:
    """"h." for any layer's module (they are all alike), else its own prefix."""
    return "h." if _layer_of(prefix + "x") else prefix


def _layer_of(name: str) -> str:
    """"h.3." for a tensor of layer 3, "" for one outside the layers."""
    parts = name.split(".", 2)
    return f"h.{parts[1]}." if len(parts) > 2 and parts[0] == "h" and parts[1].isdigit() else ""


def run_together(cfg: ModelConfig, weights: Mapping[str, np.ndarray], runs: Sequence[Mapping[str, Any]]
                 ) -> list[list[LayerOut | np.ndarray]]:
    """run_layers of each of `runs` (its keyword arguments but cfg and weights), advanced in step through one
    LayerMemo, so that each layer's weights are read and widened once for all of them (a check's cases, in float32
    and float64); each run's outputs listed (its layers', then its logits)."""
    memo = LayerMemo(weights)
    outs: list[list[LayerOut | np.ndarray]] = [[] for _ in runs]
    for items in zip(*(run_layers(cfg, memo, **kw) for kw in runs), strict=True):
        for out, item in zip(outs, items, strict=True):
            out.append(item)
    return outs


def compare_layers(reference: Iterable[LayerOut | np.ndarray], got: Callable[[int], LayerOut],
                   got_logits: np.ndarray, tol: Tolerance, exact: Iterable[LayerOut | np.ndarray] | None = None
                   ) -> list[Check]:
    """Each layer's hidden state, keys and values from `got(i)` (the graph's per-layer outputs) against run_layers'
    `reference`, then the logits; `exact`: run_layers in float64 on the same inputs, consumed in step (so memory
    stays one layer of each). Checks named "layer i hidden", "layer i keys", "layer i values", "logits"."""
    checks: list[Check] = []
    exacts = iter(exact) if exact is not None else None
    for want in reference:
        twin = next(exacts) if exacts is not None else None
        if isinstance(want, np.ndarray):
            checks.append(compare("logits", got_logits, want, tol, twin))  # type: ignore[arg-type]
            continue
        out = got(want.index)
        for field, name in (("hidden", "hidden"), ("key", "keys"), ("value", "values")):
            checks.append(compare(f"layer {want.index} {name}", getattr(out, field), getattr(want, field), tol,
                                  None if twin is None else getattr(twin, field)))
    return checks


def _checked(weight: WeightFn, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """weight(name), refused in one line unless it has `shape`."""
    w = weight(name)
    if tuple(w.shape) != tuple(shape):
        raise ArtifactError(f"weight {name}: shape {tuple(w.shape)}, the config asks for {tuple(shape)}")
    return w


def _tensor(w: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """`w` as a torch tensor of `dtype`: no copy when it is float32 already (a read-only map is only read)."""
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(w).to(dtype)


def _rows(weights: Weights, name: str, index: torch.Tensor, shape: tuple[int, int], dtype: torch.dtype
          ) -> torch.Tensor:
    """An embedding's rows at `index` (B, T) -> (B, T, D), gathered before widening (the same values); from a
    mapping, only those rows are read (gptport.weights.take)."""
    import torch

    if index.numel() and not 0 <= int(index.min()) <= int(index.max()) < shape[0]:
        raise InputError(f"weight {name}: {shape[0]} rows, asked for rows {int(index.min())}..{int(index.max())}")
    if not isinstance(weights, Mapping):
        w = _tensor(_checked(weights, name, shape), torch.float32)  # (N, D)
        return torch.nn.functional.embedding(index, w).to(dtype)  # (B, T, D)
    if tuple(shape_of(weights, name)) != tuple(shape):
        raise ArtifactError(f"weight {name}: shape {tuple(shape_of(weights, name))}, the config asks for "
                            f"{tuple(shape)}")
    return _tensor(take(weights, name, index.numpy()), torch.float32).to(dtype)  # (B, T, D)


def _loaded(make: Callable[[], torch.nn.Module], prefix: str, weight: WeightFn, dtype: torch.dtype) -> torch.nn.Module:
    """The module `make` builds, on the meta device, given the weights prefix + its own names, in `dtype`, in eval
    mode (no dropout): one module's weights in memory, each read array converted as soon as it is read."""
    import torch

    with torch.device("meta"):
        module = make().to(dtype)
    state = {name: _tensor(_checked(weight, prefix + name, tuple(p.shape)), dtype)
             for name, p in module.state_dict().items()}
    module.load_state_dict(state, assign=True)
    return module.eval()


def _head(x: torch.Tensor, prefix: str, weights: Weights, shape: tuple[int, int], dtype: torch.dtype
          ) -> torch.Tensor:
    """The logits x @ w.T: (B, T, D) -> (B, T, V). Float32 as GPT's lm_head, an nn.Linear over the array itself (a
    Parameter: matmul picks its kernel by requires_grad, so a plain tensor rounds otherwise); another dtype
    HEAD_ROWS vocabulary rows at a time, so that no widened copy of the whole matrix is made (from a LayerMemo, the
    float32 head it keeps, through a buffer it keeps)."""
    import torch
    import torch.nn.functional as F

    def make() -> torch.nn.Module:
        return torch.nn.Linear(shape[1], shape[0], bias=False)

    weight: WeightFn = weights.__getitem__ if isinstance(weights, Mapping) else weights
    if dtype == torch.float32:
        return _module(weights, make, prefix, weight, dtype)(x)
    if isinstance(weights, LayerMemo):
        w = weights.module(prefix, torch.float32, make).weight.detach()  # (V, D)
        rows = weights.head_rows(min(HEAD_ROWS, shape[0]), shape[1], dtype)
        parts = []
        for r in range(0, shape[0], HEAD_ROWS):
            part = rows[:min(HEAD_ROWS, shape[0] - r)]
            part.copy_(w[r:r + HEAD_ROWS])
            parts.append(F.linear(x, part))  # (B, T, rows)
        return torch.cat(parts, dim=-1)  # (B, T, V)
    w = _checked(weight, prefix + "weight", shape)  # (V, D)
    return torch.cat([F.linear(x, _tensor(w[r:r + HEAD_ROWS], dtype)) for r in range(0, shape[0], HEAD_ROWS)],
                     dim=-1)  # (B, T, V)
