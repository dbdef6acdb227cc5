"""export-gguf: a GGUF of llama.cpp's gpt2 read back with gguf.GGUFReader (names, shapes, values, tokenizer),
the refusals, --force, atomic writes; and, where GPTPORT_LLAMA_CPP_BIN names llama.cpp's binaries, llama.cpp's
greedy tokens against `gptport generate`'s."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from gptport import provenance
from gptport import tokenizer as bpe
from gptport.errors import ArtifactError, InputError, UsageError
from gptport.export.gguf_export import export_gguf
from tests.conftest import build_model_dir
from tests.support import server_proc
from tests.support.cli import assert_one_line_error, gptport
from tests.support.server_proc import free_port

LLAMA_ENV = "GPTPORT_LLAMA_CPP_BIN"
PROMPTS = ["ka to", "the sol ve", "Qua lin dor ex", "straß café 日本"]


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("gguf") / "tied", tokenizer_dir, corpus_file, steps=0)


@pytest.fixture(scope="module")
def untied_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("gguf") / "untied", tokenizer_dir, corpus_file, steps=0,
                           tie_embeddings=False, n_layer=3, d_ff=96)


def copy_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.gguf", "data", "optimizer.safetensors"))
    return dst


def field(reader: gguf.GGUFReader, key: str) -> Any:
    return reader.fields[key].contents()


def tensors(reader: gguf.GGUFReader) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in reader.tensors}


def expected_names(n_layer: int, tied: bool) -> set[str]:
    names = {"token_embd.weight", "position_embd.weight", "output_norm.weight", "output_norm.bias"}
    names |= set() if tied else {"output.weight"}
    for i in range(n_layer):
        for part in ("attn_norm", "attn_qkv", "attn_output", "ffn_norm", "ffn_up", "ffn_down"):
            names |= {f"blk.{i}.{part}.weight", f"blk.{i}.{part}.bias"}
    return names


def gptport_weights(model_dir: Path) -> dict[str, np.ndarray]:
    """model.safetensors by GGUF name, the renaming written out independently of gguf_export's table."""
    ren = {"wte": "token_embd", "wpe": "position_embd", "ln_f": "output_norm", "lm_head": "output",
           "ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
           "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    out = {}
    for name, array in load_file(str(model_dir / "model.safetensors")).items():
        module, kind = name.rsplit(".", 1)
        if module.startswith("h."):
            _, block, sub = module.split(".", 2)
            out[f"blk.{block}.{ren[sub]}.{kind}"] = array
        else:
            out[f"{ren[module]}.{kind}"] = array
    return out


def test_f32_holds_the_exact_weights_and_hyperparameters(tied_dir: Path, tmp_path: Path) -> None:
    s = export_gguf(tied_dir, "f32", tmp_path / "m.gguf")
    assert s.path == tmp_path / "m.gguf" and s.tensor_types == {"F32": len(expected_names(2, True))}
    r = gguf.GGUFReader(s.path)
    cfg = json.loads((tied_dir / "config.json").read_text())["model"]
    assert field(r, "general.architecture") == "gpt2"
    assert field(r, "general.file_type") == gguf.LlamaFileType.ALL_F32
    assert field(r, "gpt2.block_count") == cfg["n_layer"] == 2
    assert field(r, "gpt2.context_length") == cfg["n_ctx"]
    assert field(r, "gpt2.embedding_length") == cfg["d_model"]
    assert field(r, "gpt2.feed_forward_length") == cfg["d_ff"]
    assert field(r, "gpt2.attention.head_count") == cfg["n_head"]
    assert field(r, "gpt2.attention.layer_norm_epsilon") == pytest.approx(cfg["ln_eps"])
    got, want = tensors(r), gptport_weights(tied_dir)
    assert set(got) == set(want) == expected_names(2, tied=True)  # tied: llama.cpp reuses token_embd
    for name, array in want.items():
        assert got[name].tensor_type == gguf.GGMLQuantizationType.F32, name
        assert got[name].data.shape == array.shape, name
        np.testing.assert_array_equal(got[name].data, array, err_msg=name)


def test_tokenizer_fields_are_what_convert_hf_to_gguf_reads(tied_dir: Path, tmp_path: Path) -> None:
    r = gguf.GGUFReader(export_gguf(tied_dir, "f32", tmp_path / "m.gguf").path)
    tok = bpe.load(tied_dir)
    vocab = tok.backend.get_vocab(with_added_tokens=True)
    assert field(r, "tokenizer.ggml.model") == "gpt2"
    assert field(r, "tokenizer.ggml.pre") == "gpt-2"
    tokens = field(r, "tokenizer.ggml.tokens")
    assert len(tokens) == tok.vocab_size and all(vocab[t] == i for i, t in enumerate(tokens))
    types = field(r, "tokenizer.ggml.token_type")
    assert types[tok.eot_id] == gguf.TokenType.CONTROL
    assert sum(t == gguf.TokenType.NORMAL for t in types) == tok.vocab_size - 1
    # gguf's own reader of a transformers directory (what convert_hf_to_gguf.py uses) agrees
    special = gguf.SpecialVocab(tied_dir, load_merges=True)
    assert field(r, "tokenizer.ggml.merges") == special.merges and len(special.merges) > 200
    assert special.special_token_ids == {"bos": tok.eot_id, "eos": tok.eot_id, "unk": tok.eot_id}
    for kind in ("bos", "eos"):
        assert field(r, f"tokenizer.ggml.{kind}_token_id") == tok.eot_id
    assert field(r, "tokenizer.ggml.unknown_token_id") == tok.eot_id
    assert "tokenizer.ggml.padding_token_id" not in r.fields
    assert field(r, "tokenizer.ggml.add_bos_token") is False


def test_q8_0_untied_dequantizes_close(untied_dir: Path) -> None:
    s = export_gguf(untied_dir, "q8_0")
    assert s.path == untied_dir / "model.q8_0.gguf"
    r = gguf.GGUFReader(s.path)
    assert field(r, "general.file_type") == gguf.LlamaFileType.MOSTLY_Q8_0
    got, want = tensors(r), gptport_weights(untied_dir)
    assert set(got) == set(want) == expected_names(3, tied=False)
    q8 = {n for n, t in got.items() if t.tensor_type == gguf.GGMLQuantizationType.Q8_0}
    assert q8 == {n for n in want if n.endswith(".weight") and "norm" not in n and n != "position_embd.weight"}
    assert "output.weight" in q8 and "blk.2.ffn_down.weight" in q8
    assert s.tensor_types == {"Q8_0": len(q8), "F32": len(want) - len(q8)}
    for name, array in want.items():
        t = got[name]
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        assert values.shape == array.shape, name
        if name in q8:  # one f16 scale per 32 values: error at most half a step of max|w|/127
            np.testing.assert_allclose(values, array, rtol=0, atol=float(np.abs(array).max()) / 127, err_msg=name)
            assert not np.array_equal(values, array)
        else:
            np.testing.assert_array_equal(values, array, err_msg=name)


def test_f16_rounds_the_matrices_only(untied_dir: Path, tmp_path: Path) -> None:
    r = gguf.GGUFReader(export_gguf(untied_dir, "f16", tmp_path / "m.gguf").path)
    assert field(r, "general.file_type") == gguf.LlamaFileType.MOSTLY_F16
    got = tensors(r)
    for name, array in gptport_weights(untied_dir).items():
        t = got[name]
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        matrix = array.ndim == 2 and name != "position_embd.weight"
        assert t.tensor_type == (gguf.GGMLQuantizationType.F16 if matrix else gguf.GGMLQuantizationType.F32)
        np.testing.assert_array_equal(values, array.astype(np.float16).astype(np.float32) if matrix else array)


@pytest.mark.parametrize(("change", "needles"), [
    ({"pos_encoding": "sinusoidal"}, ["pos_encoding is 'sinusoidal'"]),
    ({"gelu": "exact"}, ["gelu is 'exact'"]),
    ({"bias": False, "gelu": "exact"}, ["bias is false", "gelu is 'exact'"]),
])
def test_refuses_what_is_not_gpt2(tied_dir: Path, tmp_path: Path, change: dict[str, Any], needles: list[str]) -> None:
    model_dir = copy_dir(tied_dir, tmp_path / "m")
    config = json.loads((model_dir / "config.json").read_text())
    config["model"].update(change)
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError) as e:
        export_gguf(model_dir)
    for needle in [str(model_dir / "config.json"), "not GPT-2's architecture", *needles]:
        assert needle in str(e.value)
    assert not list(model_dir.glob("*.gguf")) and not list(model_dir.glob(".*tmp*"))


def record_weights(model_dir: Path) -> None:
    """config.json records the sha256 of the model.safetensors now in place, as train does when it writes."""
    config = json.loads((model_dir / "config.json").read_text())
    config[provenance.WEIGHTS_SHA] = provenance.file_digest(model_dir / "model.safetensors")
    (model_dir / "config.json").write_text(json.dumps(config))


def test_bad_inputs_name_the_file_or_option(tied_dir: Path, tmp_path: Path) -> None:
    model_dir = copy_dir(tied_dir, tmp_path / "m")
    with pytest.raises(UsageError, match="--outtype"):
        export_gguf(model_dir, "q4_0")
    with pytest.raises(UsageError, match="is a directory"):
        export_gguf(model_dir, out=tmp_path)
    with pytest.raises(InputError, match="not a directory"):
        export_gguf(tmp_path / "nowhere")
    weights = model_dir / "model.safetensors"
    state = load_file(str(weights))
    state.pop("h.1.mlp.c_fc.bias")
    save_file(state, str(weights))
    record_weights(model_dir)  # past the sha256 check (tests/cli/test_weights_sha.py), to the file's own checks
    with pytest.raises(ArtifactError, match=r"model\.safetensors: does not fit config\.json.*h\.1\.mlp\.c_fc\.bias"):
        export_gguf(model_dir)
    weights.write_bytes(b"not safetensors")
    record_weights(model_dir)
    with pytest.raises(ArtifactError, match=r"model\.safetensors: not a safetensors file, or truncated"):
        export_gguf(model_dir)
    weights.unlink()
    with pytest.raises(ArtifactError, match="no model.safetensors"):
        export_gguf(model_dir)
    (model_dir / "tokenizer.json").write_text((model_dir / "tokenizer.json").read_text() + " ")
    with pytest.raises(ArtifactError, match=r"tokenizer\.json"):
        export_gguf(model_dir)
    assert not list(model_dir.glob("*.gguf"))


def test_force_and_no_half_written_file(tied_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = copy_dir(tied_dir, tmp_path / "m")
    out = export_gguf(model_dir).path
    assert out == model_dir / "model.f32.gguf"
    before = out.read_bytes()
    with pytest.raises(InputError, match="exists; pass --force"):
        export_gguf(model_dir)

    def fail(self: gguf.GGUFWriter, *args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", fail)
    with pytest.raises(OSError, match="No space"):
        export_gguf(model_dir, force=True)
    with pytest.raises(OSError, match="No space"):
        export_gguf(model_dir, "q8_0")
    assert out.read_bytes() == before  # the old file stays whole
    assert sorted(p.name for p in model_dir.iterdir() if "gguf" in p.name) == ["model.f32.gguf"]  # no temp left
    monkeypatch.undo()
    config = json.loads((model_dir / "config.json").read_text())
    w = load_file(str(model_dir / "model.safetensors"))
    w["wte.weight"] = w["wte.weight"] + 1
    save_file(w, str(model_dir / "model.safetensors"))
    record_weights(model_dir)  # as train does: config.json changes in the weights' sha256 alone
    assert json.loads((model_dir / "config.json").read_text()) == {
        **config, provenance.WEIGHTS_SHA: provenance.file_digest(model_dir / "model.safetensors")}
    export_gguf(model_dir, force=True)
    assert out.read_bytes() != before


def test_module_loads_no_torch() -> None:
    code = "import sys, gptport.export.gguf_export, gptport.export.hf; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


def test_cli(tied_dir: Path, tmp_path: Path) -> None:
    model_dir = copy_dir(tied_dir, tmp_path / "m")
    r = gptport("export-gguf", str(model_dir), "--outtype", "q8_0")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert f"wrote {model_dir / 'model.q8_0.gguf'}" in r.stderr and "q8_0" in r.stderr and "merges" in r.stderr
    assert_one_line_error(gptport("export-gguf", str(model_dir), "--outtype", "q8_0"), 1, "model.q8_0.gguf",
                           "--force")
    assert gptport("export-gguf", str(model_dir), "--outtype", "q8_0", "--force").returncode == 0
    r = gptport("export-gguf", str(model_dir), "--outtype", "q4")
    assert r.returncode == 2 and "--outtype" in r.stderr
    config = json.loads((model_dir / "config.json").read_text())
    config["model"]["pos_encoding"] = "sinusoidal"
    (model_dir / "config.json").write_text(json.dumps(config))
    assert_one_line_error(gptport("export-gguf", str(model_dir), "--out", str(tmp_path / "x.gguf")), 1,
                           "config.json", "pos_encoding")
    assert not (tmp_path / "x.gguf").exists()


# ---- llama.cpp itself, where it is installed ----------------------------------------------------------------

def llama_bin() -> Path:
    folder = os.environ.get(LLAMA_ENV)
    if not folder:
        pytest.skip(f"set {LLAMA_ENV} to a folder with llama.cpp's llama-server (or llama-simple) to run this")
    for name in ("llama-server", "llama-simple"):
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    pytest.fail(f"{LLAMA_ENV}={folder}: no llama-server or llama-simple there")


@pytest.fixture(scope="module")
def trained_gguf(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    """A model trained far enough that greedy text is not one token repeated, exported to GGUF f32."""
    llama_bin()  # skip before training when llama.cpp is not there
    out = build_model_dir(tmp_path_factory.mktemp("llama") / "m", tokenizer_dir, corpus_file, steps=200, n_ctx=96)
    export_gguf(out, "f32")
    return out


def gptport_greedy(model_dir: Path, n: int) -> list[dict[str, Any]]:
    r = gptport("generate", str(model_dir), *PROMPTS, "--engine", "torch", "--max-new-tokens", str(n), "--json")
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def post(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return dict(json.loads(resp.read()))


def llama_server_greedy(binary: Path, gguf_path: Path, n: int) -> list[dict[str, Any]]:
    """Greedy completions from llama-server's /completion (token ids returned), its log beside the model."""
    port, log = free_port(), gguf_path.with_suffix(".server.log")
    cmd = [str(binary), "-m", str(gguf_path), "--host", "127.0.0.1", "--port", str(port), "-np", "1", "-t", "2"]
    with server_proc.running(cmd, server_proc.url_of(port), log, limit=60, stop_timeout=10):
        out = []
        for prompt in PROMPTS:
            r = post(port, "/completion", {"prompt": prompt, "n_predict": n, "temperature": 0, "top_k": 1,
                                           "return_tokens": True, "cache_prompt": False})
            prompt_ids = post(port, "/tokenize", {"content": prompt})["tokens"]
            out.append({"token_ids": r["tokens"], "text": r["content"], "prompt_ids": prompt_ids})
        return out


def llama_simple_greedy(binary: Path, gguf_path: Path, n: int) -> list[dict[str, Any]]:
    out = []
    for prompt in PROMPTS:
        r = subprocess.run([str(binary), "-m", str(gguf_path), "-n", str(n), prompt], capture_output=True,
                           text=True, check=True, timeout=120)
        assert r.stdout.startswith(prompt), r.stdout
        out.append({"text": r.stdout[len(prompt):].rstrip("\n")})
    return out


def test_llama_cpp_greedy_equals_gptport(trained_gguf: Path) -> None:
    binary, n = llama_bin(), 40
    ours = gptport_greedy(trained_gguf, n)
    assert len({tuple(o["token_ids"]) for o in ours}) == len(PROMPTS)  # not degenerate
    gguf_path = trained_gguf / "model.f32.gguf"
    if binary.name == "llama-server":
        theirs = llama_server_greedy(binary, gguf_path, n)
        tok = bpe.load(trained_gguf)
        for prompt, o, t in zip(PROMPTS, ours, theirs, strict=True):
            assert t["prompt_ids"] == tok.encode(prompt), prompt
            assert t["token_ids"] == o["token_ids"], prompt
            assert t["text"] == o["text"], prompt
    else:
        theirs = llama_simple_greedy(binary, gguf_path, n)
        for prompt, o, t in zip(PROMPTS, ours, theirs, strict=True):
            assert t["text"] == o["text"], prompt
