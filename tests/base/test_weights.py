"""weights.py's ModelWeights: a model directory's tensors by name, each read alone and widened to float32 whatever
the file holds (F32, F16, BF16, as an import keeps its source's type); rows() reads a block of a tensor's rows only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gptport import safetensors_stream as ss
from gptport.errors import ArtifactError
from gptport.paths import WEIGHTS
from gptport.weights import ModelWeights, open_weights, shape_of, take, widen


def _bf16(a: np.ndarray) -> np.ndarray:
    """float32 values cut to bf16's bits (their high halves)."""
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    tensors = {"emb": rng.standard_normal((9, 4)).astype(np.float32), "half": rng.standard_normal(5).astype(np.float16),
               "bf": _bf16(rng.standard_normal((6, 3)))}
    dtypes = {"emb": "F32", "half": "F16", "bf": "BF16"}
    outs = [ss.Out(n, dtypes[n], a.shape, lambda a=a: [a]) for n, a in tensors.items()]
    ss.write(tmp_path / WEIGHTS, ss.ordered(outs), {})
    for name in ("emb", "bf"):
        np.save(tmp_path / f"{name}.npy", tensors[name])
    return tmp_path


def test_each_tensor_read_alone_and_widened(model_dir: Path) -> None:
    w = ModelWeights.open(model_dir)
    assert sorted(w.names) == ["bf", "emb", "half"] and len(open_weights(model_dir)) == 3
    assert (w.dtype("bf"), w.dtype("half"), w.dtype("emb")) == ("BF16", "F16", "F32")
    assert w.shape("bf") == (6, 3) and w.get("missing") is None
    emb = w.get("emb")
    assert emb is not None and emb.dtype == np.float32 and np.array_equal(emb, np.load(model_dir / "emb.npy"))
    bf, half = w["bf"], w["half"]
    assert bf.dtype == half.dtype == np.float32
    assert np.array_equal(_bf16(bf), np.load(model_dir / "bf.npy"))  # the file's 16 bits, widened exactly
    assert not (bf.view(np.uint32) & 0xFFFF).any()
    assert np.array_equal(half.astype(np.float16).astype(np.float32), half)


@pytest.mark.parametrize(("start", "stop"), [(0, 9), (2, 5), (7, 20), (4, 4)])
def test_rows_read_only_a_block(model_dir: Path, start: int, stop: int) -> None:
    w = ModelWeights.open(model_dir)
    assert np.array_equal(w.rows("emb", start, stop), w["emb"][start:stop])
    assert np.array_equal(w.rows("bf", start, stop), w["bf"][start:stop])


@pytest.mark.parametrize("block", [8, 12, 1 << 20])  # bytes: less than a row, a row and a half, every row
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_into_fills_an_array_in_place_a_block_of_rows_at_a_time(model_dir: Path, block: int, dtype: type,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from gptport import weights

    monkeypatch.setattr(weights, "READ_BLOCK", block)
    w = ModelWeights.open(model_dir)
    for name in ("emb", "half", "bf"):
        out = np.full(w.shape(name), np.nan, dtype)
        before = out.ctypes.data
        w.into(name, out)
        assert out.ctypes.data == before and np.array_equal(out, w[name].astype(dtype))
    with pytest.raises(ArtifactError, match=r"tensor emb has shape \[9, 4\], asked for \[4, 9\]"):
        w.into("emb", np.zeros((4, 9), np.float32))


@pytest.mark.parametrize("index", [[[3, 0, 3], [5, 1, 1]], [5], np.zeros((0,), np.int64)])
def test_take_reads_the_rows_asked_in_their_shape(model_dir: Path, index: list[int]) -> None:
    w = ModelWeights.open(model_dir)
    for name in ("emb", "bf"):
        got, want = take(w, name, np.asarray(index)), w[name][np.asarray(index, dtype=np.int64)]
        assert got.dtype == np.float32 and got.shape == want.shape and np.array_equal(got, want)
        assert np.array_equal(take({name: w[name]}, name, np.asarray(index)), want)  # an in-memory mapping's too
    assert shape_of(w, "bf") == (6, 3) and shape_of({"x": np.zeros((2, 5))}, "x") == (2, 5)


def test_bf16_widens_exactly_for_every_bit_pattern() -> None:
    every = np.arange(2**16, dtype=np.uint16)
    assert np.array_equal(widen(every.view(np.uint8), "BF16").view(np.uint32), every.astype(np.uint32) << 16)
