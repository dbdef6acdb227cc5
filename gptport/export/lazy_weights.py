"""The builder's view of the weights: float32, each tensor read only when its initializer is made, and its shape
known without reading it. A graph whose weights an earlier graph of the same export already wrote
(tensor_sink.ExternalSink's `earlier`) then copies their bytes instead of reading, converting or quantizing them
again. No torch here."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np

from gptport.weights import shape_of

Thunk = Callable[[], np.ndarray]  # an array made when it is asked for


class Float32(Mapping[str, np.ndarray]):
    """`weights` read as float32, each tensor when it is asked for (a lazy reader stays lazy)."""

    def __init__(self, weights: Mapping[str, np.ndarray]) -> None:
        self.weights = weights

    def __getitem__(self, name: str) -> np.ndarray:
        return np.asarray(self.weights[name], dtype=np.float32)

    def __contains__(self, name: object) -> bool:
        return name in self.weights

    def __iter__(self) -> Iterator[str]:
        return iter(self.weights)

    def __len__(self) -> int:
        return len(self.weights)

    def shape(self, name: str) -> tuple[int, ...]:
        """Tensor `name`'s shape, nothing read where the weights come from a file."""
        return shape_of(self.weights, name)


class Joined(Mapping[str, np.ndarray]):
    """Tensors of `weights` stacked along their rows under new names (`parts`: new name -> the names stacked, in
    order), made when asked for: SwiGLU's [gate | up] as one matrix."""

    def __init__(self, weights: Mapping[str, np.ndarray], parts: Mapping[str, list[str]]) -> None:
        self.weights, self.parts = weights, dict(parts)

    def __getitem__(self, name: str) -> np.ndarray:
        return np.concatenate([self.weights[p] for p in self.parts[name]])

    def __contains__(self, name: object) -> bool:
        return name in self.parts

    def __iter__(self) -> Iterator[str]:
        return iter(self.parts)

    def __len__(self) -> int:
        return len(self.parts)

    def shape(self, name: str) -> tuple[int, ...]:
        shapes = [shape(self.weights, p) for p in self.parts[name]]
        return (sum(s[0] for s in shapes), *shapes[0][1:])


def shape(weights: Mapping[str, np.ndarray], name: str) -> tuple[int, ...]:
    """Tensor `name`'s shape: from the header or the parts where `weights` can tell without reading it."""
    if isinstance(weights, (Float32, Joined)):
        return weights.shape(name)
    return tuple(np.shape(weights[name]))


def later(weights: Mapping[str, np.ndarray], name: str, transpose: bool = False) -> Thunk:
    """Tensor `name` of `weights` (transposed with `transpose`), read when the thunk is called."""
    return (lambda: weights[name].T) if transpose else (lambda: weights[name])
