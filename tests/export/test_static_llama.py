"""The static-cache graphs of the Llama family: `gptport import-hf` of tiny random transformers models — Llama
(4 query heads over 2 key/value heads, Llama 3.1's rope scaling), Qwen2 (q/k/v biases, one key/value head, tied
head) and Qwen3 (q/k norm, heads 32 wide over d_model 64) — then `gptport export` writes model.static.onnx and
model.append.onnx through their parity gates against torch; `gptport generate --kv-cache static` gives the
tokens transformers' generate gives; a scheduler appending waves of prompts with the multi-row append graph
gives each request transformers' greedy tokens; and a graph rotating q and k the wrong way (interleaved pairs,
or cos and sin swapped) is refused by those gates. The weights are drawn wide (tests/support/hf_models.py), so
a rotation or head-grouping mistake cannot hide behind near-uniform logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest

from gptport import contract
from gptport import tokenizer as bpe
from gptport.errors import ValidationError
from gptport.export import append_check, validate
from gptport.export.tolerance import Tolerance
from gptport.runtime.choice import GraphChoice
from gptport.runtime.loader import open_appender, open_model
from gptport.runtime.onnx_engine import load_cpu
from gptport.runtime.sampling import Sampling
from gptport.runtime.slots import StaticSlots
from gptport.serve.engine.scheduler import Choice, Finish
from tests.support.cli import gptport
from tests.support.hf_models import HfModel, build, greedy
from tests.support.scheduling import Run

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")
torch = pytest.importorskip("torch")

LLAMA3_ROPE = {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 16}}  # n_ctx 64: every band of the scaling used
CASES = [("llama", "byte-level", LLAMA3_ROPE), ("qwen2", "chatml", {}), ("qwen3", "metaspace", {})]
NEW_TOKENS = 24


@pytest.fixture(scope="module", params=CASES, ids=[a for a, _, _ in CASES])
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path,
             corpus_file: Path) -> tuple[HfModel, Path, str]:
    arch, kind, config = request.param
    root = tmp_path_factory.mktemp(f"static_{arch}")
    hf = build(arch, kind, root / "hf", tokenizer_dir, corpus_file, config=config)
    out = root / "m"
    r = gptport("import-hf", str(hf.path), "--out", str(out))
    assert r.returncode == 0, r.stderr
    r = gptport("export", str(out))
    assert r.returncode == 0, r.stderr
    return hf, out, r.stderr


def gqa_nodes(path: Path) -> list[onnx.NodeProto]:
    return [n for n in onnx.load(str(path)).graph.node if n.op_type == "GroupQueryAttention"]


def test_export_writes_both_static_graphs_through_their_gates(exported: tuple[HfModel, Path, str]) -> None:
    hf, out, said = exported
    config = json.loads((out / "config.json").read_text())["model"]
    assert "no static-cache graph" not in said
    for cache in (contract.CACHE_STATIC, contract.CACHE_APPEND):
        graph = load_cpu(out / contract.onnx_file("fp32", cache))
        assert graph.meta[contract.META_GATED] == "true" and graph.cache == cache
    nodes = gqa_nodes(out / "model.static.onnx")
    assert len(nodes) == config["n_layer"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert (attrs["num_heads"], attrs["kv_num_heads"]) == (config["n_head"], config["n_kv_head"])
    assert (attrs["do_rotary"], attrs["rotary_interleaved"]) == (1, 0)
    packed = nodes[0].input[1] == ""  # the fused q|k|v, or q, k and v apart after the q/k norm
    assert packed != config["qk_norm"]
    assert config["n_kv_head"] < config["n_head"]


def test_generate_with_the_static_cache_gives_transformers_tokens(exported: tuple[HfModel, Path, str]) -> None:
    hf, out, _ = exported
    prompt_ids = hf.tokenizer(hf.prompt)["input_ids"]
    want = greedy(hf.model, prompt_ids, NEW_TOKENS)  # ends on generation_config.json's own end token
    assert want[-1] == hf.stop_id
    r = gptport("generate", str(out), hf.prompt, "--max-new-tokens", str(NEW_TOKENS), "--json", "--kv-cache", "static")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["kv_cache"] == "static" and got["token_ids"] == want[:-1] and got["finish_reason"] == "eot"


def continuation(model: Any, ids: list[int], n: int) -> list[int]:
    """transformers' greedy continuation of `ids`, `n` tokens, no end token."""
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return [int(t) for t in out[0, len(ids):]]


def test_waves_appended_together_give_transformers_tokens(exported: tuple[HfModel, Path, str]) -> None:
    """Six prompts sharing a prefix arrive together, then six more (rests after the kept prefix, a new turn of
    an earlier conversation, fresh prompts): each wave's prompts are appended to several slots in one run of
    the multi-row append graph, and every request gets transformers' greedy tokens."""
    hf, out, _ = exported
    opened = open_model(out, GraphChoice.parse(cache="static"))
    appender = open_appender(out, opened.engine)
    assert appender is not None
    engine = StaticSlots(opened.engine.session, opened.engine.config, 8, appender=appender.session)
    rows_per_run: list[int] = []
    inner = engine.append_many

    def counted(slots: Any, chunks: Any, **kw: Any) -> Any:
        rows_per_run.append(len(slots))
        return inner(slots, chunks, **kw)

    engine.append_many = counted  # type: ignore[method-assign]
    run = Run(engine, opened.tok, prefill_chunk=64)
    system = list(range(5, 25))
    first = [Choice(system + [40 + i, 41 + 2 * i], 5, Sampling(), ignore_eos=True, out=f"a{i}") for i in range(6)]
    run.serve(first, 500)
    turn = first[1].prompt_ids + first[1].new_ids + [7, 8]
    second = [Choice(turn, 5, Sampling(), ignore_eos=True, out="turn")]
    second += [Choice(system + [60 + i, 61, 62 + i], 5, Sampling(), ignore_eos=True, out=f"b{i}") for i in range(3)]
    second += [Choice([200 + i, 201, 202, 203], 5, Sampling(), ignore_eos=True, out=f"f{i}") for i in range(2)]
    run.serve(second, 500)
    assert max(rows_per_run) >= 4, rows_per_run  # several rows per run of the append graph
    assert any(c.cached for c in second)  # rests after a kept prefix
    for c in first + second:
        assert c.new_ids == continuation(hf.model, c.prompt_ids, 5), c.out
        assert any(isinstance(e, Finish) for e in run.of(c.out))


def rewired(path: Path, dst: Path, wrong: str) -> Path:
    """The graph at `path` rotating q and k the wrong way: `interleaved` pairs, or cos and sin `swapped`."""
    proto = onnx.load(str(path))
    for node in proto.graph.node:
        if node.op_type not in ("GroupQueryAttention", "RotaryEmbedding"):
            continue
        if wrong == "interleaved":
            for a in node.attribute:
                if a.name in ("rotary_interleaved", "interleaved"):
                    a.i = 1
        else:  # GroupQueryAttention's cos_cache and sin_cache are inputs 7 and 8, RotaryEmbedding's 1 and 2
            i = 7 if node.op_type == "GroupQueryAttention" else 1
            node.input[i], node.input[i + 1] = node.input[i + 1], node.input[i]
    onnx.save(proto, str(dst))
    return dst


@pytest.mark.parametrize("wrong", ["interleaved", "swapped"])
def test_a_wrong_rotation_fails_the_gates(exported: tuple[HfModel, Path, str], tmp_path: Path, wrong: str) -> None:
    from gptport.training.checkpoint import load_model

    _, out, _ = exported
    model, _ = load_model(out, bpe.load(out))
    static = load_cpu(rewired(out / "model.static.onnx", tmp_path / "static.onnx", wrong))
    rows = validate.static_parity(model, static, Tolerance())
    assert not any(r.ok for r in rows), rows
    with pytest.raises(ValidationError, match="static-cache graph parity failed"):
        validate.refuse("static-cache graph parity", rows)
    appender = load_cpu(rewired(out / "model.append.onnx", tmp_path / "append.onnx", wrong))
    rows = append_check.append_parity(model, load_cpu(out / "model.static.onnx"), appender.session, Tolerance())
    assert not any(r.ok for r in rows), rows


CHOICES = [{"pos_encoding": "rope"}, {"norm": "rmsnorm", "bias": False}, {"mlp": "swiglu"}, {"n_kv_head": 1},
           {"head_dim": 32}, {"qk_norm": True, "pos_encoding": "rope"},
           {"pos_encoding": "rope", "rope_scaling": "linear", "rope_factor": 4.0},
           {"bias": False, "qkv_bias": True, "out_bias": True, "mlp_bias": True, "mlp": "swiglu"}]


@pytest.mark.parametrize("change", CHOICES, ids=lambda c: ",".join(c))
def test_each_choice_alone_passes_both_gates(change: dict[str, object]) -> None:
    """Each of the family's choices on an otherwise GPT-2-shaped model of wide random weights: both graphs,
    built in memory, pass the parity gates export applies."""
    import onnxruntime as ort

    from gptport.config import ModelConfig
    from gptport.export import gqa_graph, scatter_graph
    from gptport.runtime.onnx_engine import OnnxModel
    from gptport.training.model import GPT

    cfg = ModelConfig(vocab_size=200, n_ctx=32, d_model=64, n_layer=2, n_head=4, **change)  # type: ignore[arg-type]
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight",
                                                                       "norm.weight")) else 0.0))
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}

    def session(proto: onnx.ModelProto) -> ort.InferenceSession:
        return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])

    static = OnnxModel(session(gqa_graph.build(cfg, weights)), cfg, "fp32", "", cache=contract.CACHE_STATIC)
    rows = validate.static_parity(model, static, Tolerance())
    rows += append_check.append_parity(model, static, session(scatter_graph.build(cfg, weights)), Tolerance())
    assert all(r.ok and r.top1 == 1.0 for r in rows), rows


def test_the_cuda_fp16_graph_fuses_each_residual_and_keeps_the_numbers(exported: tuple[HfModel, Path, str],
                                                                      tmp_path: Path) -> None:
    """export --cuda's fp16 static-cache graph writes each residual sum and the RMSNorm after it as one
    SkipSimplifiedLayerNormalization, and (on the CPU's float16 kernels) gives the fp32 static graph's logits."""
    import numpy as np
    import onnxruntime as ort

    from gptport.export import cuda_graphs
    from gptport.training.checkpoint import load_model

    hf, out, _ = exported
    model, card = load_model(out, bpe.load(out))
    weights = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    cuda_graphs.fp16_static(card.model, weights, tmp_path / "half.onnx")
    ops = [n.op_type for n in onnx.load(str(tmp_path / "half.onnx")).graph.node]
    assert ops.count("SkipSimplifiedLayerNormalization") == 2 * card.model.n_layer - 1  # not the first ln_1
    ids = np.array(hf.tokenizer(hf.prompt)["input_ids"], dtype=np.int64)
    session = ort.InferenceSession(str(tmp_path / "half.onnx"), providers=["CPUExecutionProvider"])
    half = StaticSlots(session, card.model, 1, np.dtype(np.float16))
    full = StaticSlots(load_cpu(out / "model.static.onnx").session, card.model, 1)
    got, want = half.prefill_many(0, [ids])[0], full.prefill_many(0, [ids])[0]  # (V,) each
    assert got.argmax() == want.argmax()
    assert np.abs(got - want).max() < 0.02 * np.abs(want).max(), np.abs(got - want).max()
