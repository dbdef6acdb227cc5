"""fp16 and the int8 KV cache of a model past graph_write.external's size (lowered here by
GPTPORT_EXTERNAL_FROM_BYTES): the fp16 contract graph built op by op into external data, within float16's rounding of
fp32's; the int8-cache graphs written without loading their twin's weights (their data file a hard link of the
twin's), scales calibrated on the torch model run layer by layer, decoding close to the float32 cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gptport import contract
from gptport.config import ModelConfig
from gptport.errors import UsageError
from gptport.export import contract_graph, gqa_graph, graph_write, kv_quant, streamed_steps
from gptport.export.agreement import agrees_top_k
from gptport.export.export_job import Job
from gptport.export.export_report import ExportReport
from gptport.export.tolerance import Tolerance
from gptport.model_card import read_card
from gptport.runtime.onnx_engine import OnnxModel, file_metadata, load_cpu
from gptport.tokenizer import load, token_bytes
from gptport.weights import open_weights
from tests.conftest import build_model_dir, make_text
from tests.export.test_builder import CHOICES, random_model, weights_of
from tests.export.test_layer_check import LLAMA
from tests.support.cli import gptport


@pytest.fixture(scope="module")
def streamed(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    """A Llama-family model trained a little, exported as a model too large for torch would be: int4 and fp16 with
    the int8 cache, unchecked (--no-gate: each decoded in pieces); then fp32 and fp16 with the int8 cache, gated
    (fp16 layer by layer; the int8 cache's gate fits in memory at this size)."""
    out = build_model_dir(tmp_path_factory.mktemp("streamed16") / "m", tokenizer_dir, corpus_file, steps=40, **LLAMA)
    mp = pytest.MonkeyPatch()
    mp.setenv("GPTPORT_EXTERNAL_FROM_BYTES", "1")
    try:
        r = gptport("export", str(out), "--precision", "int4,fp16", "--kv-dtype", "int8", "--no-gate")
        assert r.returncode == 0, r.stderr
        gated = gptport("export", str(out), "--precision", "fp32,fp16", "--kv-dtype", "int8", "--force")
        assert gated.returncode == 0, gated.stderr
    finally:
        mp.undo()
    assert "per-tensor" in gated.stderr and "per-channel" in gated.stderr  # its gate's rows
    return out


def _logits(path: Path, ids: np.ndarray, cfg: ModelConfig, dtype: type) -> np.ndarray:
    """The contract graph's logits (1, T, V) of `ids` (1, T) with no past."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    empty = np.zeros((1, cfg.n_kv_head, 0, cfg.head_dim), dtype)
    feeds = {contract.INPUT_IDS: ids, contract.ATTENTION_MASK: np.ones_like(ids),
             contract.POSITION_IDS: np.arange(ids.shape[1], dtype=np.int64)[None],
             **{n: empty for n in contract.past_names(cfg.n_layer)}}
    return session.run([contract.LOGITS], feeds)[0]


def test_the_fp16_graph_is_external_and_within_float16_rounding_of_fp32(streamed: Path, tmp_path: Path) -> None:
    half = streamed / "model.fp16.onnx"
    assert (streamed / "model.fp16.onnx.data").is_file() and graph_write.weight_bytes(half) > 0
    proto = onnx.load(str(half), load_external_data=False)
    assert {i.data_type for i in proto.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL} == {
        onnx.TensorProto.FLOAT16}
    assert file_metadata(half)[contract.META_GATED] == "true"  # the second export's: gated layer by layer
    config = read_card(streamed).model
    fp32 = tmp_path / "model.onnx"
    graph_write.write(fp32, lambda sink: contract_graph.build(config, open_weights(streamed), sink), {}, True)
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (1, 24))
    want, got = _logits(fp32, ids, config, np.float32), _logits(half, ids, config, np.float16)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()  # float16: 2^-11 a rounding, a few of them
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9


HALF_CHOICES = [*CHOICES, {"pos_encoding": "rope", "norm": "rmsnorm", "qk_norm": True, "qk_norm_span": "all",
                            "pre_norms": False, "post_norms": True},
                {"pos_encoding": "rope", "norm": "rmsnorm", "mlp": "geglu", "post_norms": True, "attn_softcap": 20.0,
                 "final_softcap": 10.0, "sliding_window": 6, "window_layers": (0,), "embed_scale": 8.0},
                {"pos_encoding": "rope", "rotary_dim": 8, "no_rope_layers": (1,), "residual_scale": 0.5,
                 "logits_divisor": 2.0}]


@pytest.mark.parametrize("change", HALF_CHOICES, ids=lambda c: ",".join(c) or "gpt2")
def test_the_fp16_graph_of_each_choice_is_within_float16_rounding_of_torch(change: dict[str, object],
                                                                             tmp_path: Path) -> None:
    """Left-padded rows past a cache of 5: logits and the float16 cache within float16's rounding of torch's."""
    import torch

    model = random_model(**change)
    cfg, path = model.cfg, tmp_path / "model.fp16.onnx"
    graph_write.write(path, lambda sink: contract_graph.build(cfg, weights_of(model), sink, half=True), {}, False)
    onnx.checker.check_model(str(path), full_check=True)
    rng = np.random.default_rng(0)
    ids, mask = rng.integers(0, cfg.vocab_size, (2, 12)), np.ones((2, 12), np.int64)
    mask[1, :3] = 0
    with torch.no_grad():
        want, past = model(torch.from_numpy(ids[:, :5]), attention_mask=torch.from_numpy(mask[:, :5]))
        want, present = model(torch.from_numpy(ids[:, 5:]), attention_mask=torch.from_numpy(mask), past=past)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)[:, 5:]
    feeds = {contract.INPUT_IDS: ids[:, 5:], contract.ATTENTION_MASK: mask, contract.POSITION_IDS: positions,
             **{n: x.numpy().astype(np.float16) for n, x in zip(contract.past_names(cfg.n_layer),
                                                                 [t for kv in past for t in kv], strict=True)}}
    logits, *cache = session.run(None, feeds)
    want = want.numpy()
    assert logits.dtype == np.float32 and cache[0].dtype == np.float16
    assert np.abs(logits - want).max() <= 1e-2 * np.abs(want).max()
    for got, ref in zip(cache, [t.numpy() for kv in present for t in kv], strict=True):
        assert np.abs(got - ref).max() <= 1e-2 * np.abs(ref).max()


@pytest.mark.parametrize(("precision", "gated"), [("int4.", "false"), ("", "true")])
def test_the_int8_cache_graph_has_its_twins_weights_in_a_file_of_its_own(streamed: Path, precision: str,
                                                                         gated: str) -> None:
    """The twin's data file cloned or copied byte for byte, one link each: onnx loads both graphs (it refuses data
    files of several hard links)."""
    twin, kv8 = streamed / f"model.{precision}static.onnx", streamed / f"model.{precision}static.kv8.onnx"
    data, own = twin.with_name(twin.name + ".data"), kv8.with_name(kv8.name + ".data")
    assert own.read_bytes() == data.read_bytes() and own.stat().st_nlink == data.stat().st_nlink == 1
    locations = {e.value for i in onnx.load(str(kv8), load_external_data=False).graph.initializer
                 for e in i.external_data if e.key == "location"}
    assert locations == {own.name}
    for graph in (twin, kv8):
        onnx.load(str(graph))  # its external data read, and checked by onnx
    meta = file_metadata(kv8)
    assert meta[contract.META_GATED] == gated and meta[contract.META_KV_SCALES] in kv_quant.KINDS
    assert not [p for p in streamed.iterdir() if ".tmp-" in p.name]


def test_the_int8_cache_gate_is_refused_where_it_does_not_fit(streamed: Path) -> None:
    card, tok = read_card(streamed), load(streamed)
    job = Job(streamed, tok, None, card, {}, Tolerance(), print, ExportReport(), weights=open_weights(streamed))
    need = streamed_steps.kv_gate_bytes(job)
    assert need > 2 * job.weights_bytes()
    streamed_steps.refuse_options(job, False, "int8", None, True, available=need)
    with pytest.raises(UsageError, match="int8 KV cache's gate .* --no-gate"):
        streamed_steps.refuse_options(job, False, "int8", None, True, available=need - 1)
    streamed_steps.refuse_options(job, False, "int8", None, False, available=need - 1)  # --no-gate


def test_the_int8_cache_decodes_close_to_the_float_cache(streamed: Path) -> None:
    """Teacher-forced over two windows, the int8 cache picks what the float32 cache rates best (or within its
    near-tie) and scores the text within 2% of its bits per byte."""
    tok = load(streamed)
    ids = np.asarray(tok.encode(make_text(20, seed=5)), np.int64)
    windows = np.stack([ids[:24], ids[24:48]])
    ref = kv_quant.decode_scores(load_cpu(streamed / "model.int4.static.onnx"), windows, token_bytes(tok))
    got = kv_quant.decode_scores(load_cpu(streamed / "model.int4.static.kv8.onnx"), windows, token_bytes(tok))
    assert agrees_top_k(*ref[3], got[0]).mean() >= 0.9
    assert abs(got[1] / ref[1] - 1) <= 0.02


def test_generate_runs_the_fp16_and_int8_cache_graphs(streamed: Path) -> None:
    for choice in (["--precision", "fp16", "--kv-cache", "concat"], ["--precision", "int4", "--kv-dtype", "int8"]):
        r = gptport("generate", str(streamed), "ka to", "--max-new-tokens", "6", "--json", *choice)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout.strip().splitlines()[-1])["token_ids"]


def test_calibration_from_the_layer_reference_is_the_static_graphs(tmp_path: Path) -> None:
    model = random_model(**LLAMA)
    weights, cfg = weights_of(model), model.cfg
    path = tmp_path / "model.static.onnx"
    graph_write.write(path, lambda sink: gqa_graph.build(cfg, weights, sink=sink), {}, False)
    static = OnnxModel(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), cfg, "fp32", "")
    windows = np.random.default_rng(1).integers(0, cfg.vocab_size, (3, 20))
    for graph, layers in zip(kv_quant.calibrate(static, windows), kv_quant.calibrate_layers(cfg, weights, windows),
                             strict=True):
        assert graph.shape == layers.shape == (cfg.n_layer, cfg.n_kv_head, cfg.head_dim)
        np.testing.assert_allclose(layers, graph, rtol=1e-4, atol=1e-5)


def test_the_int8_cache_copies_its_twins_data_where_the_filesystem_clones_none(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    model = random_model(**LLAMA)
    weights, cfg = weights_of(model), model.cfg
    twin, kv8 = tmp_path / "model.static.onnx", tmp_path / "model.static.kv8.onnx"
    graph_write.write(twin, lambda sink: gqa_graph.build(cfg, weights, sink=sink), {}, True)
    amax = np.ones((cfg.n_layer, cfg.n_kv_head, cfg.head_dim), np.float32)

    fcntl = pytest.importorskip("fcntl")

    def refuse(fd: int, request: int, arg: int) -> None:
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(fcntl, "ioctl", refuse)
    assert kv_quant.rewrite(twin, kv8, amax, amax, "PER_TENSOR", {}) is False
    data = kv8.with_name(kv8.name + ".data")
    assert data.read_bytes() == twin.with_name(twin.name + ".data").read_bytes()
    assert data.stat().st_ino != twin.with_name(twin.name + ".data").stat().st_ino
    final = tmp_path / "moved.kv8.onnx"
    graph_write.place(kv8, final)  # renamed with its data, and still opens
    assert not data.exists() and final.with_name(final.name + ".data").is_file()
    onnx.load(str(final))
    session = ort.InferenceSession(str(final), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[-1].type == "tensor(int8)"
