"""StaticSlots.append_many over the multi-row append graph: random splits of random sequences appended
several rows at a time give the logits (within the parity bound) and the greedy tokens of one-row steps;
the cache is written in place (the bound buffers' addresses unchanged, no copy warning from onnxruntime);
rows near n_ctx and busy rows whose padding would not fit split the runs; a write past the cache fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptport import contract
from gptport.export.tolerance import Tolerance, compare
from gptport.runtime import append
from gptport.runtime.choice import GraphChoice
from gptport.runtime.loader import open_appender, open_model
from gptport.runtime.onnx_engine import load_cpu
from gptport.runtime.slots import StaticSlots

COPY_WARNING = "in-place optimization not activated"


def session(path: Path, log_warnings: bool = False) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 2 if log_warnings else 3  # 2: onnxruntime's warnings reach stderr
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def graphs(trained_dir: Path) -> tuple[Any, ort.InferenceSession]:
    """The fp32 static-cache graph's engine and the multi-row append graph's session."""
    return load_cpu(trained_dir / "model.static.onnx"), session(trained_dir / "model.append.onnx")


def test_plan_puts_every_row_in_one_run_unless_a_row_is_near_the_end() -> None:
    lengths = np.array([0, 5, 0, 30, 7, 0])  # (S,) n_ctx 40
    runs, alone = append.plan(lengths, 40, [4, 1, 0], [3, 8, 1])
    assert alone == [] and runs == [append.Run(0, 5, (2, 1, 0), 8)]  # span 0..4, rows in slot order
    runs, alone = append.plan(lengths, 40, [3, 1], [2, 11])  # 30 + 11 > 40: slot 3 goes alone
    assert alone == [0] and runs == [append.Run(1, 1, (1,), 11)]
    runs, alone = append.plan(lengths, 40, [1, 4], [2, 11])  # slot 3 (30 held) cannot take 11 of padding
    assert alone == [] and runs == [append.Run(1, 1, (0,), 2), append.Run(4, 1, (1,), 11)]
    runs, alone = append.plan(lengths, 40, [1, 4], [2, 10])  # 30 + 10 fits: one run over 1..4
    assert runs == [append.Run(1, 4, (0, 1), 10)]


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_splits_give_one_row_steps_logits_and_greedy_tokens(graphs: tuple[Any, Any],
                                                                    data: st.DataObject) -> None:
    static, appender = graphs
    cfg = static.config
    S = data.draw(st.integers(1, 5), "slots")
    together, alone = StaticSlots(static.session, cfg, S, appender=appender), StaticSlots(static.session, cfg, S)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), "seed"))
    for step in range(data.draw(st.integers(1, 5), "steps")):
        rows = data.draw(st.lists(st.integers(0, S - 1), min_size=1, max_size=S, unique=True), f"rows{step}")
        rows = [r for r in rows if together.lengths[r] < cfg.n_ctx]
        if not rows:
            continue
        sizes = [data.draw(st.integers(1, min(40, cfg.n_ctx - int(together.lengths[r]))), f"size{step}.{r}")
                 for r in rows]
        chunks = [rng.integers(0, cfg.vocab_size, k, dtype=np.int64) for k in sizes]
        every = data.draw(st.booleans(), f"all{step}")
        got = together.append_many(rows, chunks, all_logits=every)
        want = [alone.append(r, c, all_logits=every) for r, c in zip(rows, chunks, strict=True)]
        for g, w in zip(got, want, strict=True):
            check = compare("logits", g, w, Tolerance())
            assert check.ok, check.describe()
            assert (g.argmax(-1) == w.argmax(-1)).all()
        if data.draw(st.booleans(), f"free{step}"):  # a freed row keeps its cache; the other rows go on
            gone = data.draw(st.integers(0, S - 1), f"gone{step}")
            together.free(gone)
            alone.free(gone)
        assert (together.lengths == alone.lengths).all()
    busy = [r for r in range(S) if 0 < together.lengths[r] <= cfg.n_ctx - 4]
    picks, picks_alone = np.ones(len(busy), dtype=np.int64), np.ones(len(busy), dtype=np.int64)
    for i in range(4 if busy else 0):  # greedy decoding from there, by decode steps and by 1-token appends
        if i % 2:
            logits = np.concatenate(together.append_many(busy, [picks[j:j + 1] for j in range(len(busy))]))
        else:
            logits = together.decode(busy, picks)
        picks, picks_alone = logits.argmax(-1), alone.decode(busy, picks_alone).argmax(-1)
        assert picks.tolist() == picks_alone.tolist()


def test_the_cache_is_written_in_place_without_a_copy(trained_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    static = load_cpu(trained_dir / "model.static.onnx")
    appender = session(trained_dir / "model.append.onnx", log_warnings=True)
    slots = StaticSlots(static.session, static.config, 3, appender=appender)
    slots.append(2, np.arange(1, 6))
    before = [b.copy() for b in slots.buffers]
    slots.append_many([0, 2], [np.arange(1, 8), np.arange(3, 5)])
    binding = slots.appender.binding(0, 3)  # type: ignore[union-attr]
    views = slots.appender._views  # type: ignore[union-attr]
    assert [v.data_ptr() for v in views] == [b.ctypes.data for b in slots.buffers]  # the buffers themselves
    assert binding is slots.appender.binding(0, 3)  # type: ignore[union-attr]  # bound once
    for b, old in zip(slots.buffers, before, strict=True):
        assert not np.array_equal(b[0, :, :7], old[0, :, :7]) and not np.array_equal(b[2, :, 5:7], old[2, :, 5:7])
        assert np.array_equal(b[2, :, :5], old[2, :, :5])  # what the row held stays
    assert COPY_WARNING not in capfd.readouterr().err

    # the same run with present bound elsewhere copies the cache, and onnxruntime says so: the check can see it
    other = appender.io_binding()
    for name, buf in zip(contract.past_names(static.config.n_layer), slots.buffers, strict=True):
        other.bind_cpu_input(name, buf[:1])
    for name in contract.output_names(static.config.n_layer):
        other.bind_output(name, "cpu")
    for name, value in ((contract.INPUT_IDS, [[1]]), (contract.POSITION_IDS, [[7]]), (contract.WRITE_INDEX, [7]),
                        (contract.PACK_INDEX, [[0]]), (contract.UNPACK_INDEX, [0]), (contract.LOGITS_INDEX, [[0]])):
        other.bind_cpu_input(name, np.array(value, dtype=np.int64))
    appender.run_with_iobinding(other)
    assert COPY_WARNING in capfd.readouterr().err


def test_a_write_past_the_cache_fails(graphs: tuple[Any, Any]) -> None:
    static, appender = graphs
    cfg = static.config
    slots = StaticSlots(static.session, cfg, 2, appender=appender)
    slots.append_many([0], [np.arange(cfg.n_ctx - 2)])
    with pytest.raises(ValueError, match=f"slot 0: {cfg.n_ctx - 2} \\+ its tokens exceed n_ctx"):
        slots.append_many([0, 1], [np.arange(3), np.arange(2)])
    with pytest.raises(ValueError, match="distinct slots"):
        slots.append_many([1, 1], [np.arange(3), np.arange(2)])
    with pytest.raises(RuntimeError, match="out of data bounds|exceeds max_sequence_length"):  # the graph refuses it
        slots.appender.run(0, np.array([cfg.n_ctx - 2, 0]), {0: np.arange(3)})  # type: ignore[union-attr]
    assert slots.lengths.tolist() == [cfg.n_ctx - 2, 0]
    out = slots.append_many([0, 1], [np.arange(2), np.arange(5)])  # slot 0 fills the cache in its own run
    assert [o.shape for o in out] == [(1, cfg.vocab_size)] * 2 and slots.lengths.tolist() == [cfg.n_ctx, 5]


def test_open_appender_pairs_only_the_fp32_static_graph(trained_dir: Path) -> None:
    opened = open_model(trained_dir, GraphChoice.parse(cache="static"))
    appender = open_appender(trained_dir, opened.engine)  # type: ignore[arg-type]
    assert appender is not None and appender.cache == contract.CACHE_APPEND
    assert open_appender(trained_dir, open_model(trained_dir, GraphChoice.parse(cache="concat")).engine) is None  # type: ignore[arg-type]
    assert open_appender(trained_dir, open_model(trained_dir,
                                                 GraphChoice.parse(precision="int8", cache="static")).engine) is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="float32"):
        StaticSlots(opened.engine.session, opened.engine.config, 1, np.dtype(np.int8), appender.session)  # type: ignore[attr-defined]
