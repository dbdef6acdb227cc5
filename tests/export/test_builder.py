"""The op-by-op builder's pieces: the contract graph of every choice against torch, inline and in external data;
MatMulNBits made per matrix byte for byte as onnxruntime's quantizer makes them; the sink's alignment, its
one-line error on a full disk; model.safetensors read tensor by tensor (weights.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from safetensors.numpy import save_file

from gptport.config import ModelConfig
from gptport.errors import ArtifactError
from gptport.export import contract_graph, graph_write, validate
from gptport.export.nbits import NBits
from gptport.export.tensor_sink import ALIGN, ExternalSink
from gptport.export.tolerance import Tolerance
from gptport.runtime.onnx_engine import OnnxModel
from gptport.training.model import GPT
from gptport.weights import ModelWeights

CHOICES = [{}, {"n_kv_head": 2, "pos_encoding": "rope"}, {"pos_encoding": "sinusoidal", "tie_embeddings": False},
           {"pos_encoding": "rope", "n_kv_head": 2, "norm": "rmsnorm", "mlp": "swiglu", "bias": False,
            "qkv_bias": True}, {"qk_norm": True, "pos_encoding": "rope", "norm": "rmsnorm"}, {"gelu": "exact"}]


def random_model(**change: object) -> GPT:
    """A GPT-2-shaped model with wide random weights (norm gains around 1) and the `change` asked for."""
    cfg = ModelConfig(vocab_size=200, n_ctx=32, d_model=64, n_layer=2, n_head=4, **change)  # type: ignore[arg-type]
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight", "norm.weight"))
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if gain else 0.0))
    return model


def weights_of(model: GPT) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("outside", [False, True], ids=["inline", "external"])
@pytest.mark.parametrize("change", CHOICES, ids=lambda c: ",".join(c) or "gpt2")
def test_the_contract_graph_of_each_choice_passes_parity(change: dict[str, object], outside: bool,
                                                         tmp_path: Path) -> None:
    model = random_model(**change)
    path = tmp_path / "model.onnx"
    graph_write.write(path, lambda sink: contract_graph.build(model.cfg, weights_of(model), sink), {}, outside)
    assert (path.with_name("model.onnx.data").is_file()) == outside
    onnx.checker.check_model(str(path), full_check=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rows = validate.parity(model, OnnxModel(session, model.cfg, "fp32", "").step(), Tolerance())
    assert rows and all(r.ok and r.top1 == 1.0 for r in rows), [r.failure("parity") for r in rows if not r.ok]


def test_a_placed_graph_reads_its_renamed_data(tmp_path: Path) -> None:
    """place() renames the data with the graph and rewrites the graph's references; an earlier export's data of
    the same name is replaced."""
    model = random_model()
    tmp, final = tmp_path / ".model.onnx.tmp-1", tmp_path / "model.onnx"
    (tmp_path / "model.onnx.data").write_bytes(b"an earlier export's")
    graph_write.write(tmp, lambda sink: contract_graph.build(model.cfg, weights_of(model), sink), {}, True)
    graph_write.place(tmp, final)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]
    session = ort.InferenceSession(str(final), providers=["CPUExecutionProvider"])
    assert validate.parity(model, OnnxModel(session, model.cfg, "fp32", "").step(), Tolerance())[0].ok


@pytest.mark.parametrize("bits,block,symmetric", [(4, 32, True), (8, 128, True), (4, 32, False)])
def test_matmulnbits_weights_are_onnxruntimes_own(bits: int, block: int, symmetric: bool) -> None:
    """The builder's quantized matrices are byte for byte what MatMulNBitsQuantizer makes of the same float
    graph (the same kernel on the same matrix), its scales and zero points too, whatever slab size is used."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from gptport.export import nbits

    model = random_model(d_ff=160)  # K = 160: not a multiple of 128 (padded blocks)
    w = weights_of(model)
    theirs = MatMulNBitsQuantizer(contract_graph.build(model.cfg, w), bits=bits, block_size=block,
                                  is_symmetric=symmetric, accuracy_level=4)
    theirs.process()
    old = nbits.SLAB_BYTES
    nbits.SLAB_BYTES = 4 * 160 * 7  # slabs of 7 rows: the chunked path
    try:
        ours = contract_graph.build(model.cfg, w, nbits=NBits(bits, block, 4, symmetric))
    finally:
        nbits.SLAB_BYTES = old
    mine = {i.name: onnx.numpy_helper.to_array(i) for i in ours.graph.initializer}
    other = {i.name: onnx.numpy_helper.to_array(i) for i in theirs.model.model.graph.initializer}
    prefix = "h.1.mlp.c_proj"
    assert np.array_equal(mine[f"{prefix}.weight_Q{bits}"], other[f"{prefix}.weight_t_Q{bits}"])
    assert np.array_equal(mine[f"{prefix}.weight_scales"].reshape(-1), other[f"{prefix}.weight_t_scales"].reshape(-1))
    if not symmetric:
        assert np.array_equal(mine[f"{prefix}.weight_zero_points"].reshape(-1),
                              other[f"{prefix}.weight_t_zero_points"].reshape(-1))
    ort.InferenceSession(ours.SerializeToString(), providers=["CPUExecutionProvider"])  # it loads


def test_the_sink_aligns_large_tensors_and_keeps_small_ones_inline(tmp_path: Path) -> None:
    sink = ExternalSink(tmp_path / "g.data", "g.data")
    small = sink.tensor("small", np.ones(3, np.float32))
    big = [sink.tensor(f"big{i}", np.full((300 + i,), i, np.float32)) for i in range(3)]
    sink.close()
    assert small.data_location == onnx.TensorProto.DEFAULT and not small.external_data
    offsets = [int({e.key: e.value for e in t.external_data}["offset"]) for t in big]
    assert offsets == [0, ALIGN, 2 * ALIGN]
    data = (tmp_path / "g.data").read_bytes()
    assert np.array_equal(np.frombuffer(data[ALIGN:ALIGN + 4 * 301], np.float32), np.full(301, 1, np.float32))


def test_a_full_disk_is_one_line_naming_the_file() -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    sink = ExternalSink(Path("/dev/full"), "full.data")
    with pytest.raises(ArtifactError, match=r"^/dev/full: the disk is full") as e:
        sink.tensor("w", np.ones((1024, 1024), np.float32))
        sink.close()
    assert "\n" not in str(e.value)


def test_model_weights_widen_each_dtype_and_check_shapes(tmp_path: Path) -> None:
    import ml_dtypes

    rng = np.random.default_rng(0)
    values = rng.standard_normal((4, 6)).astype(np.float32)
    path = tmp_path / "model.safetensors"
    save_file({"a": values, "b": values.astype(np.float16), "c": values.astype(ml_dtypes.bfloat16)}, str(path))
    w = ModelWeights(path)
    assert np.array_equal(w["a"], values)
    assert np.array_equal(w["b"], values.astype(np.float16).astype(np.float32))
    assert np.array_equal(w["c"], values.astype(ml_dtypes.bfloat16).astype(np.float32))
    w.check_shapes({"a": (4, 6), "b": (4, 6), "c": (4, 6)})
    with pytest.raises(ArtifactError, match=r"tensor b has shape \[4, 6\], config.json's model says \[6, 4\]"):
        w.check_shapes({"a": (4, 6), "b": (6, 4), "c": (4, 6)})
    with pytest.raises(ArtifactError, match="no tensor d"):
        w.check_shapes({"a": (4, 6), "b": (4, 6), "c": (4, 6), "d": (1,)})
    with pytest.raises(ArtifactError, match="tensor c is not one"):
        w.check_shapes({"a": (4, 6), "b": (4, 6)})
