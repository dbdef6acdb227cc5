"""The device static cache (cuda_slots.py, cuda_engine.py) run on the CPU over host memory, the same code
that runs on a CUDA device: the IO-bound decode gives today's greedy tokens (fp32 decode graph beside the
multi-row append graph, fp16 GroupQueryAttention), the cache stays where it was bound, decode steps are
bucketed with a graph id per bucket, only the rows asked are read back, the slots give StaticSlots'
logits through every slot operation serve uses, and the scheduler gives StaticSlots' greedy tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gptport import contract
from gptport.errors import ArtifactError
from gptport.runtime import cuda_engine, loader
from gptport.runtime.choice import CacheLayout, GraphChoice
from gptport.runtime.cuda_memory import Memory
from gptport.runtime.cuda_slots import DeviceSlots, bucket, buckets
from gptport.runtime.generate import generate
from gptport.runtime.onnx_engine import load_cpu
from gptport.runtime.sampling import Sampling
from gptport.runtime.slots import StaticSlots
from gptport.serve.engine.scheduler import Choice, Failure
from tests.support.scheduling import Run

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25]]


def device_model(model_dir: Path, precision: str, graphs: bool = True) -> cuda_engine.DeviceModel:
    """The engine CUDA would open, on the CPU provider (host memory), its decode steps named by graph ids."""
    path = cuda_engine.graph_path(model_dir, precision, required=True)
    assert path is not None
    twin = model_dir / contract.onnx_file("fp32", contract.CACHE_APPEND)
    model = cuda_engine.on_device(load_cpu(path), load_cpu(twin) if precision == "fp32" else None, cuda_graph=False)
    model.graphs = graphs  # run options carry gpu_graph_id as on CUDA (the CPU provider ignores them)
    model.bursts = 0  # one decode step a run (bursts of greedy steps: test_burst.py)
    return model


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_io_bound_decode_gives_todays_greedy_tokens(cuda_dir: Path, precision: str) -> None:
    today = load_cpu(cuda_dir / contract.onnx_file(precision, contract.CACHE_STATIC))  # the CPU's static graph
    want = generate(today, PROMPTS, 40, Sampling(), -1)
    engine = device_model(cuda_dir, precision)
    for _ in range(2):  # the second run reuses the slots (and, on CUDA, the captured graph)
        got = generate(engine, PROMPTS, 40, Sampling(), -1)
        assert [g.new_ids for g in got] == [w.new_ids for w in want]
    past = engine.empty_past(len(PROMPTS))
    assert isinstance(past, cuda_engine.SlotsPast)
    slots = past.slots
    assert slots.graph_ids.keys() == {3} and slots.graph_ids[3] > 0  # batch 3: one bucket, one graph


def test_the_cache_is_written_where_it_was_bound(cuda_dir: Path) -> None:
    engine = device_model(cuda_dir, "fp32")
    past = engine.empty_past(2)
    slots = past.slots
    where = [b.data_ptr() for b in slots.buffers]
    step = engine.step(last_only=True)
    ids, mask = np.array([[0, 5, 6], [7, 8, 9]]), np.array([[0, 1, 1], [1, 1, 1]])
    step(ids, mask, np.zeros_like(ids), past)
    for tok in (3, 4, 5):
        step(np.array([[tok], [tok]]), mask, np.zeros((2, 1), dtype=np.int64), past)
    assert [b.data_ptr() for b in slots.buffers] == where and list(slots.lengths) == [5, 6]
    cpu_static = load_cpu(cuda_dir / contract.onnx_file("fp32", contract.CACHE_STATIC))
    want = cpu_static.step(last_only=True)
    ref = cpu_static.empty_past(2)
    _, ref = want(ids, mask, np.clip(np.cumsum(mask, 1) - 1, 0, None), ref)
    for tok in (3, 4, 5):
        mask = np.concatenate([mask, np.ones((2, 1), dtype=np.int64)], axis=1)
        _, ref = want(np.array([[tok], [tok]]), mask, np.cumsum(mask, 1)[:, -1:] - 1, ref)
    key = ref[0].numpy()  # (2, H, C, hd): layer 0's keys, rows from position 0
    for row, length in enumerate((5, 6)):
        np.testing.assert_allclose(slots.cache_rows(0, row, length), key[row, :, :length], atol=1e-5)
    engine.empty_past(2)  # hands the slots out again: the old cache may no longer step
    with pytest.raises(ValueError, match="handed out again"):
        step(np.array([[1], [1]]), mask, np.zeros((2, 1), dtype=np.int64), past)


def test_buckets_and_their_choice() -> None:
    assert buckets(1) == [1] and buckets(8) == [1, 2, 4, 8] and buckets(12) == [1, 2, 4, 8, 12]
    assert [bucket(n, buckets(16)) for n in (1, 2, 3, 5, 9, 16)] == [1, 2, 4, 8, 16, 16]
    with pytest.raises(ValueError, match="17 rows exceed the largest bucket"):
        bucket(17, buckets(16))


class CountingMemory(Memory):
    """Host memory that records the bytes each read copies back."""

    def __init__(self) -> None:
        self.reads: list[int] = []

    def read(self, src: int, out: np.ndarray) -> None:
        self.reads.append(out.nbytes)
        super().read(src, out)


def slots_pair(model_dir: Path, precision: str, n: int, mem: Memory | None = None) -> tuple[DeviceSlots, StaticSlots]:
    """Device slots of the CUDA graphs (host memory) and StaticSlots of the CPU's static graph, same weights."""
    engine = device_model(model_dir, precision)
    device = DeviceSlots(engine.session, engine.config, n, engine.kv_dtype, mem or Memory(), engine.appender,
                         graphs=True)
    static = load_cpu(model_dir / contract.onnx_file(precision, contract.CACHE_STATIC))
    twin = load_cpu(model_dir / contract.onnx_file("fp32", contract.CACHE_APPEND)) if precision == "fp32" else None
    return device, StaticSlots(static.session, static.config, n, static.kv_dtype, twin.session if twin else None)


def test_a_decode_step_reads_back_only_the_rows_asked(cuda_dir: Path) -> None:
    mem = CountingMemory()
    device, _ = slots_pair(cuda_dir, "fp32", 8, mem)
    for s in range(4):
        device.append(s, np.array([3 + s, 4, 5]))
    mem.reads.clear()
    logits = device.decode([1, 2], np.array([7, 8]))  # bucket 4: rows 0..3 run, rows 1 and 2 come back
    vocab = device.vocab_size
    assert logits.shape == (2, vocab) and mem.reads == [2 * vocab * 4]
    assert device.graph_ids.keys() == {4}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_device_slots_give_static_slots_logits(cuda_dir: Path, precision: str) -> None:
    """Prefills together and alone, decode steps over buckets with idle and free rows in them, a copied
    prefix, appends of several rows, a rolled-back row: every call's logits are StaticSlots'."""
    device, static = slots_pair(cuda_dir, precision, 6)
    rng = np.random.default_rng(0)
    vocab = device.vocab_size
    tol = 1e-4 if precision == "fp32" else 2e-2

    def both(call: str, *args: Any) -> None:
        got, want = getattr(device, call)(*args), getattr(static, call)(*args)
        got, want = (np.concatenate(x) if isinstance(x, list) else x for x in (got, want))
        np.testing.assert_allclose(got, want, atol=tol * max(1.0, float(np.abs(want).max())))
        assert (np.argmax(got, -1) == np.argmax(want, -1)).all(), call

    def ids(n: int) -> np.ndarray:
        return rng.integers(1, vocab, n)

    both("prefill_many", 0, [ids(7), ids(3)])
    both("append", 3, ids(5))
    both("decode", [0, 1, 3], ids(3))  # bucket 4: row 2 is empty
    both("decode", [3], ids(1))  # bucket 4: rows 0 and 1 wait
    for slots in (static, device):
        slots.free(1)
        slots.copy(0, 5, 4)
    both("append", 5, ids(3), True)
    if precision == "fp32":  # the multi-row append graph is fp32's
        both("append_many", [1, 2], [ids(4), ids(2)], True)
    else:
        both("append", 1, ids(4))
        both("append", 2, ids(2))
    both("decode", [0, 1, 2, 3, 5], ids(5))  # bucket 6
    for slots in (static, device):
        slots.truncate(0, 5)
    both("decode", [0], ids(1))  # bucket 1
    assert sorted(device.graph_ids) == [1, 4, 6] and len(set(device.graph_ids.values())) == 3


def greedy_replies(slots: Any, tok: Any, prompts: list[list[int]]) -> list[list[int]]:
    """The greedy tokens of `prompts` served together by one scheduler over `slots`."""
    run = Run(slots, tok)
    choices = [Choice(p, 24, Sampling(), out=i) for i, p in enumerate(prompts)]
    run.serve(choices, 500)
    assert not [e for _, e in run.events if isinstance(e, Failure)]
    return [c.new_ids for c in choices]


def test_the_scheduler_serves_device_slots_as_static_slots(cuda_dir: Path) -> None:
    tok = loader.load_tokenizer(cuda_dir)
    prompts = [*PROMPTS, PROMPTS[2][:9], [30, 31]]
    device, static = slots_pair(cuda_dir, "fp32", 4)
    assert greedy_replies(device, tok, prompts) == greedy_replies(static, tok, prompts)


def test_cuda_picks_the_device_graphs(cuda_dir: Path, tmp_path: Path) -> None:
    """--provider cuda opens export --cuda's graphs (auto and static), the contract graph for a precision
    without one; the CPU provider's choices are unchanged."""
    def name(precision: str, provider: str, cache: str = CacheLayout.AUTO) -> str:
        return loader.graph_path(cuda_dir, GraphChoice.parse(precision, cache), provider).name

    assert name("fp32", "cuda") == contract.onnx_file("fp32", contract.CACHE_DECODE)
    assert name("fp16", "cuda") == name("fp16", "cuda", "static") == contract.onnx_file("fp16", contract.CACHE_STATIC)
    assert name("int8", "cuda") == contract.onnx_file("int8") and name("fp32", "cuda", "concat") == "model.onnx"
    assert name("fp32", "cpu") == contract.onnx_file("fp32", contract.CACHE_STATIC)
    with pytest.raises(ArtifactError, match="int8 has no static-cache graph on CUDA"):
        name("int8", "cuda", "static")
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(ArtifactError, match="--cuda` first"):
        cuda_engine.graph_path(bare, "fp32", required=True)
    assert loader.graph_path(cuda_dir, GraphChoice.parse("fp16"), "tensorrt").name == contract.onnx_file("fp16")
