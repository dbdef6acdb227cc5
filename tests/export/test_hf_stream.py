"""import-hf streamed (hf_stream.py): sharded tiny Llama and Qwen2 directories saved by transformers come out with
exactly transformers' tensors under gptport's names (q|k|v stacked, the vocabulary cut), each in its source's type
(bf16 and fp16 kept, a tensor of mixed sources widened to float32, GPT-2's transposed Conv1D too); the torch model
loaded from a bf16 directory gives transformers' logits, export-hf and the weights reader take bf16; progress is
reported tensor by tensor; a tensor config.json contradicts and a disk without room are refused in one line before
anything is written."""

# ruff: noqa: F811 (the tests take hf_tokenizer_dir, a fixture imported from test_hf_llama.py)
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gptport import safetensors_file
from gptport import tokenizer as bpe
from gptport.errors import InputError
from gptport.export.hf import import_hf
from gptport.safetensors_stream import Written
from gptport.training.checkpoint import load_model
from gptport.weights import ModelWeights
from tests.export.test_hf_llama import (  # noqa: F401 (hf_tokenizer_dir: a fixture)
    RTOL,
    _vocab,
    hf_logits,
    hf_tokenizer_dir,
    make_hf,
    relative_error,
)
from tests.support.cli import assert_one_line_error, gptport

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")
SAFETENSORS_TYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def theirs(hf_dir: Path, vocab: int) -> dict[str, torch.Tensor]:
    """transformers' tensors (as the shards hold them) under gptport's names, as import-hf must write them."""
    from safetensors.torch import load_file

    src: dict[str, torch.Tensor] = {}
    for shard in sorted(hf_dir.glob("*.safetensors")):
        src.update(load_file(str(shard)))
    out = {"wte.weight": src["model.embed_tokens.weight"][:vocab], "ln_f.weight": src["model.norm.weight"]}
    if "lm_head.weight" in src:
        out["lm_head.weight"] = src["lm_head.weight"][:vocab]
    layers = {k.split(".")[2] for k in src if k.startswith("model.layers.")}
    for i in sorted(layers):
        hf, ours = f"model.layers.{i}.", f"h.{i}."
        for kind in ("weight", "bias"):
            parts = [src.get(f"{hf}self_attn.{x}_proj.{kind}") for x in "qkv"]
            if parts[0] is not None:
                dtypes = {p.dtype for p in parts}  # type: ignore[union-attr]
                out[f"{ours}attn.c_attn.{kind}"] = torch.cat(parts if len(dtypes) == 1  # type: ignore[arg-type]
                                                             else [p.float() for p in parts])  # type: ignore[union-attr]
        out[f"{ours}attn.c_proj.weight"] = src[f"{hf}self_attn.o_proj.weight"]
        out[f"{ours}ln_1.weight"] = src[f"{hf}input_layernorm.weight"]
        out[f"{ours}ln_2.weight"] = src[f"{hf}post_attention_layernorm.weight"]
        for theirs_, mine in (("gate_proj", "c_gate"), ("up_proj", "c_fc"), ("down_proj", "c_proj")):
            out[f"{ours}mlp.{mine}.weight"] = src[f"{hf}mlp.{theirs_}.weight"]
    return out


def written(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "model.safetensors"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_sharded_import_holds_transformers_tensors_in_their_type(arch: str, dtype: torch.dtype, tmp_path: Path,
                                                                   hf_tokenizer_dir: Path) -> None:
    vocab = _vocab(hf_tokenizer_dir)
    hf_dir = make_hf(arch, tmp_path / "hf", hf_tokenizer_dir, vocab, dtype, max_shard_size="100KB")
    assert len(list(hf_dir.glob("*.safetensors"))) >= 2
    seen: list[Written] = []
    cfg = import_hf(hf_dir, tmp_path / "m", progress=seen.append)
    want, got = theirs(hf_dir, cfg.vocab_size), written(tmp_path / "m")
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].dtype == dtype and torch.equal(got[name], tensor), name
    header = safetensors_file.read_header(tmp_path / "m" / "model.safetensors")
    assert {e.dtype for e in header.values()} == {SAFETENSORS_TYPE[dtype]}
    assert [w.done for w in seen] == list(range(len(want) + 1)) and seen[-1].total == len(want)
    assert seen[-1].bytes_done == seen[-1].bytes_total == (tmp_path / "m" / "model.safetensors").stat().st_size
    ours, _ = load_model(tmp_path / "m", bpe.load(tmp_path / "m"))  # bf16 widened to float32 on load
    ids = torch.randint(0, vocab, (2, 33))
    with torch.no_grad():
        assert relative_error(ours(ids)[0], hf_logits(hf_dir, ids)) <= RTOL


def test_fp16_is_kept_and_mixed_sources_are_widened(tmp_path: Path, hf_tokenizer_dir: Path) -> None:
    """A directory in fp16 stays fp16; where q, k and v disagree (one bf16), c_attn is float32 holding each exactly."""
    from safetensors.torch import load_file, save_file

    vocab = _vocab(hf_tokenizer_dir)
    hf_dir = make_hf("llama", tmp_path / "hf", hf_tokenizer_dir, vocab, torch.float16)
    state = load_file(str(hf_dir / "model.safetensors"))
    state["model.layers.0.self_attn.k_proj.weight"] = state["model.layers.0.self_attn.k_proj.weight"].bfloat16()
    save_file(state, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    cfg = import_hf(hf_dir, tmp_path / "m")
    got, want = written(tmp_path / "m"), theirs(hf_dir, cfg.vocab_size)
    assert got["h.0.attn.c_attn.weight"].dtype == torch.float32 and got["h.1.attn.c_attn.weight"].dtype == torch.float16
    assert got["wte.weight"].dtype == torch.float16
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_gpt2s_transposed_conv1d_keeps_bf16(tmp_path: Path, tokenizer_dir: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=520, n_positions=64, n_embd=48, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    hf = GPT2LMHeadModel(config).eval().to(torch.bfloat16)
    hf.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    GPT2TokenizerFast(tokenizer_file=str(tokenizer_dir / "tokenizer.json"), eos_token="<|endoftext|>").save_pretrained(
        str(tmp_path / "hf"))
    import_hf(tmp_path / "hf", tmp_path / "m")
    got, src = written(tmp_path / "m"), hf.state_dict()
    assert {t.dtype for t in got.values()} == {torch.bfloat16} and "lm_head.weight" not in got  # tied: stored once
    assert torch.equal(got["h.1.mlp.c_fc.weight"], src["transformer.h.1.mlp.c_fc.weight"].t())
    assert torch.equal(got["h.0.attn.c_attn.bias"], src["transformer.h.0.attn.c_attn.bias"])
    assert torch.equal(got["wte.weight"], src["transformer.wte.weight"][:512])


def test_a_bf16_import_is_read_by_export_hf_and_the_weights_reader(tmp_path: Path, hf_tokenizer_dir: Path) -> None:
    vocab = _vocab(hf_tokenizer_dir)
    hf_dir = make_hf("qwen2", tmp_path / "hf", hf_tokenizer_dir, vocab, torch.bfloat16)
    import_hf(hf_dir, tmp_path / "m")
    model, _ = load_model(tmp_path / "m", bpe.load(tmp_path / "m"))
    weights = ModelWeights.open(tmp_path / "m")
    assert weights.dtype("h.0.attn.c_attn.bias") == "BF16"
    for name, tensor in model.state_dict().items():
        if name in weights:
            assert np.array_equal(weights[name], tensor.numpy()), name
    assert np.array_equal(weights.rows("wte.weight", 5, 9), model.wte.weight[5:9].detach().numpy())
    r = gptport("export-hf", str(tmp_path / "m"), "--out", str(tmp_path / "back"))
    assert r.returncode == 0, r.stderr
    ids = torch.randint(0, vocab, (2, 17))
    assert relative_error(hf_logits(tmp_path / "back", ids), hf_logits(hf_dir, ids)) <= RTOL


def _sharded(tmp_path: Path, hf_tokenizer_dir: Path) -> Path:
    return make_hf("llama", tmp_path / "hf", hf_tokenizer_dir, _vocab(hf_tokenizer_dir), torch.bfloat16,
                   max_shard_size="100KB")


def _nothing_written(tmp_path: Path) -> bool:
    return not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_tensor_config_json_contradicts_is_named_with_its_shard(tmp_path: Path, hf_tokenizer_dir: Path) -> None:
    hf_dir = _sharded(tmp_path, hf_tokenizer_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, "intermediate_size": 128}))
    index = json.loads((hf_dir / "model.safetensors.index.json").read_text())["weight_map"]
    shard = hf_dir / index["model.layers.0.mlp.up_proj.weight"]
    r = gptport("import-hf", str(hf_dir), "--out", str(tmp_path / "out"))
    assert_one_line_error(r, 1, f"{shard}: tensor model.layers.0.mlp.up_proj.weight has shape [96, 64]; "
                                "config.json's model needs [128, 64] (gptport's h.0.mlp.c_fc.weight)")
    assert _nothing_written(tmp_path)


def test_a_tensor_left_over_missing_or_not_a_float_is_named(tmp_path: Path, hf_tokenizer_dir: Path) -> None:
    from safetensors.torch import load_file, save_file

    hf_dir = make_hf("llama", tmp_path / "hf", hf_tokenizer_dir, _vocab(hf_tokenizer_dir))
    state = load_file(str(hf_dir / "model.safetensors"))
    save_file({**state, "model.layers.0.mlp.extra.weight": torch.zeros(2)}, str(hf_dir / "model.safetensors"))
    assert_one_line_error(gptport("import-hf", str(hf_dir), "--out", str(tmp_path / "out")), 1,
                          "tensor model.layers.0.mlp.extra.weight is not one this config.json's model has")
    norm = state.pop("model.norm.weight")
    save_file(state, str(hf_dir / "model.safetensors"))
    assert_one_line_error(gptport("import-hf", str(hf_dir), "--out", str(tmp_path / "out")), 1,
                          "no tensor model.norm.weight, which this config.json's model has")
    save_file({**state, "model.norm.weight": norm.to(torch.int32)}, str(hf_dir / "model.safetensors"))
    assert_one_line_error(gptport("import-hf", str(hf_dir), "--out", str(tmp_path / "out")), 1,
                          f"{hf_dir / 'model.safetensors'}: tensor model.norm.weight is I32, not a float")
    assert _nothing_written(tmp_path)


def test_a_disk_without_room_is_refused_before_anything_is_written(tmp_path: Path, hf_tokenizer_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    hf_dir = _sharded(tmp_path, hf_tokenizer_dir)
    usage: Any = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=4096))
    with pytest.raises(InputError) as e:
        import_hf(hf_dir, tmp_path / "out")
    message = str(e.value)
    assert message.startswith(f"{tmp_path}: importing into {tmp_path / 'out'} needs 0.00 GiB (") and message.endswith(
        "bytes) but its disk has 0.00 GiB (4,096 bytes) free") and "\n" not in message
    assert _nothing_written(tmp_path)
