"""export-gguf of the Llama family, through the CLI: tiny random transformers models (tests/support/hf_models.py,
weights drawn wide) imported with `gptport import-hf`, then written as llama.cpp's converter writes them: a Llama
with 2 kv heads for 4 and Llama 3.1's rope scaling (architecture llama: q/k rows permuted, rope_freqs.weight), a
plain Llama, Qwen2 (q/k/v biases: qwen2) and Qwen3 (q/k norm, heads wider than d_model, linear scaling, a
SentencePiece-style tokenizer: qwen3 with tokenizer model "llama"). `gptport import-gguf` of each F32 file gives
back the same tensors, config and tokenizer (so the same logits); Q8_0 and F16 files give the gguf package's values;
transformers' GGUF loader (`from_pretrained(dir, gguf_file=...)`) gives the source model's logits for what it reads
(the plain Llama and Qwen2: it reads neither rope scaling nor Qwen3's head width)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.support.cli import assert_one_line_error, gptport
from tests.support.hf_models import HfModel, build

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")
torch = pytest.importorskip("torch")
pytest.importorskip("accelerate", reason="transformers loads a GGUF file only with accelerate: pip install accelerate")

LLAMA3 = {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 16}}
CASES: dict[str, tuple[str, str, dict[str, Any], str]] = {  # arch, tokenizer, config, GGUF architecture
    "llama3": ("llama", "byte-level", LLAMA3, "llama"),
    "llama": ("llama", "byte-level", {}, "llama"),
    "qwen2": ("qwen2", "chatml", {}, "qwen2"),
    "qwen3": ("qwen3", "metaspace", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "qwen3"),
}
TRANSFORMERS_READS = ("llama", "qwen2")
TEXTS = ["ka to ri 日本 🙂", "  spaces\nand lines", "x1y22z333 isn't", "men sol ve qua lin dor"]
FLOAT32 = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}


@pytest.fixture(scope="module", params=list(CASES))
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path,
             corpus_file: Path) -> tuple[str, HfModel, Path]:
    arch, kind, config, _ = CASES[request.param]
    root = tmp_path_factory.mktemp(f"gguf_{request.param}")
    hf = build(arch, kind, root / "hf", tokenizer_dir, corpus_file, config=config)
    r = gptport("import-hf", str(hf.path), "--out", str(root / "m"))
    assert r.returncode == 0, r.stderr
    for outtype in ("f32", "q8_0"):
        r = gptport("export-gguf", str(root / "m"), "--outtype", outtype)
        assert r.returncode == 0, r.stderr
        assert f"{CASES[request.param][3]}, {outtype})" in r.stderr
    return request.param, hf, root / "m"


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    return reader.fields[key].contents()


def _import(gguf_path: Path, out: Path) -> Path:
    r = gptport("import-gguf", str(gguf_path), "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


def test_the_file_is_what_the_converter_writes(exported: tuple[str, HfModel, Path]) -> None:
    case, hf, model_dir = exported
    r = gguf.GGUFReader(model_dir / "model.f32.gguf")
    arch = CASES[case][3]
    cfg = hf.model.config
    assert _field(r, "general.architecture") == arch
    assert _field(r, f"{arch}.attention.head_count_kv") == cfg.num_key_value_heads
    assert _field(r, f"{arch}.rope.freq_base") == pytest.approx(cfg.rope_parameters["rope_theta"])
    assert _field(r, f"{arch}.attention.layer_norm_rms_epsilon") == pytest.approx(cfg.rms_norm_eps)
    names = {t.name for t in r.tensors}
    assert ("rope_freqs.weight" in names) == (case == "llama3")
    if case == "llama3":  # Llama 3's factors, computed independently as the converter does
        from tests.support.gguf_files import llama3_freqs

        freqs = next(t for t in r.tensors if t.name == "rope_freqs.weight").data
        np.testing.assert_allclose(freqs, llama3_freqs(cfg), rtol=1e-6, atol=0)
        assert len(set(np.round(freqs, 4))) >= 2 and freqs.max() == 8.0  # smoothed, and divided by the factor
    assert ("blk.0.attn_q.bias" in names) == (case == "qwen2")
    assert ("blk.1.attn_k_norm.weight" in names) == (case == "qwen3")
    assert ("output.weight" in names) == (not cfg.tie_word_embeddings)
    if case == "qwen3":
        assert _field(r, "qwen3.attention.key_length") == 32
        assert _field(r, "qwen3.rope.scaling.type") == "linear" and _field(r, "qwen3.rope.scaling.factor") == 2.0
    tok = hf.tokenizer
    assert _field(r, "tokenizer.ggml.model") == ("llama" if case == "qwen3" else "gpt2")
    assert _field(r, "tokenizer.ggml.pre") == ("default" if case == "qwen3" else "gpt-2")
    assert _field(r, "tokenizer.ggml.tokens") == tok.convert_ids_to_tokens(list(range(len(tok))))
    assert _field(r, "tokenizer.ggml.eos_token_id") == tok.eos_token_id
    assert _field(r, "tokenizer.ggml.eot_token_id") == hf.stop_id  # generation_config.json's own end token
    assert _field(r, "tokenizer.ggml.add_bos_token") == (tok("a")["input_ids"][0] == tok.bos_token_id)
    assert _field(r, "tokenizer.chat_template") == tok.chat_template


def test_llama_q_and_k_rows_are_permuted_as_the_converter_does(exported: tuple[str, HfModel, Path]) -> None:
    """The converter's permutation written independently (tests/support/gguf_files.permute), on transformers'
    own q_proj and k_proj; qwen2 and qwen3 (llama.cpp rotates halves there) keep transformers' rows."""
    from tests.support.gguf_files import permute

    case, hf, model_dir = exported
    r = {t.name: t for t in gguf.GGUFReader(model_dir / "model.f32.gguf").tensors}
    cfg, attn = hf.model.config, hf.model.model.layers[1].self_attn
    permuted = CASES[case][3] == "llama"
    for x, heads in (("q", cfg.num_attention_heads), ("k", cfg.num_key_value_heads), ("v", 0)):
        w = getattr(attn, f"{x}_proj").weight.detach().numpy()
        want = permute(w, heads) if permuted and heads else w
        np.testing.assert_array_equal(np.asarray(r[f"blk.1.attn_{x}.weight"].data), want)


def test_import_gguf_gives_back_the_same_model(exported: tuple[str, HfModel, Path], tmp_path: Path) -> None:
    from gptport import tokenizer as bpe

    case, hf, model_dir = exported
    again = _import(model_dir / "model.f32.gguf", tmp_path / "again")
    before, after = (load_file(str(d / "model.safetensors")) for d in (model_dir, again))
    assert sorted(after) == sorted(before) and all(np.array_equal(after[k], before[k]) for k in before)
    first, second = (json.loads((d / "config.json").read_text())["model"] for d in (model_dir, again))
    if first["bos_id"] is None:  # no begin token: the file names end-of-text, which prompts never start with
        assert second["bos_id"] is not None and not second["add_bos"]
        second["bos_id"] = None
    assert second == first
    ours, theirs = bpe.load(again), hf.tokenizer
    for text in TEXTS:
        assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], (case, text)
    assert (again / "chat_template.jinja").read_text(encoding="utf-8") == theirs.chat_template


def test_q8_0_imports_as_the_gguf_packages_values(exported: tuple[str, HfModel, Path], tmp_path: Path) -> None:
    _, _, model_dir = exported
    again = _import(model_dir / "model.q8_0.gguf", tmp_path / "q8")
    before, after = (load_file(str(d / "model.safetensors")) for d in (model_dir, again))
    for name, w in before.items():
        quantized = w.ndim == 2 and "norm" not in name
        q8 = gguf.GGMLQuantizationType.Q8_0
        want = gguf.quants.dequantize(gguf.quants.quantize(w, q8), q8).reshape(w.shape) if quantized else w
        np.testing.assert_array_equal(after[name], want, err_msg=name)


@pytest.mark.parametrize("exported", TRANSFORMERS_READS, indirect=True)
def test_transformers_gguf_loader_gives_the_sources_logits(exported: tuple[str, HfModel, Path]) -> None:
    """The cases transformers' GGUF mappings take (its llama and qwen2 ones read no rope scaling, nor a head
    width other than d_model / n_head)."""
    _, hf, model_dir = exported
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), gguf_file="model.f32.gguf",
                                                               **FLOAT32).eval()
    ids = torch.randint(0, hf.model.config.vocab_size, (2, 40))
    with torch.no_grad():
        want, got = hf.model(ids).logits, theirs(ids).logits
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-5


@pytest.mark.parametrize(("shape", "says"), [
    ({"qk_norm": True, "qkv_bias": True, "out_bias": True}, "q/k norm with biases"),
    ({"qk_norm": True, "rope_scaling": "llama3", "rope_factor": 8.0, "rope_original_n_ctx": 16},
     "Llama 3's rope scaling with q/k norm"),
    ({"norm": "layernorm"}, "not an architecture of the Llama family"),
], ids=["qk-norm-with-biases", "qk-norm-with-llama3-scaling", "layernorm"])
def test_a_model_no_llama_cpp_architecture_has_is_refused_in_one_line(tmp_path: Path, tokenizer_dir: Path,
                                                                    corpus_file: Path, shape: dict[str, Any],
                                                                    says: str) -> None:
    from tests.conftest import build_model_dir

    d = build_model_dir(tmp_path / "m", tokenizer_dir, corpus_file, steps=0, bias=False, pos_encoding="rope",
                        **{"norm": "rmsnorm", "mlp": "swiglu", **shape})
    assert_one_line_error(gptport("export-gguf", str(d)), 1, "config.json", says)
    assert not list(d.glob("*.gguf"))


def test_a_tokenizer_llama_cpp_cannot_split_is_refused_in_one_line(tmp_path: Path, tokenizer_dir: Path,
                                                                  corpus_file: Path) -> None:
    """A byte-level BPE whose pre-tokenizer llama.cpp has no name for (a prefix space added)."""
    import shutil

    from tests.conftest import build_model_dir

    tok_dir = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, tok_dir)
    spec = json.loads((tok_dir / "tokenizer.json").read_text())
    spec["pre_tokenizer"]["add_prefix_space"] = True
    (tok_dir / "tokenizer.json").write_text(json.dumps(spec))
    (tok_dir / "tokenizer_meta.json").unlink()  # a tokenizer.json of its own
    d = build_model_dir(tmp_path / "m", tok_dir, corpus_file, steps=0, bias=False, pos_encoding="rope",
                        norm="rmsnorm", mlp="swiglu")
    assert_one_line_error(gptport("export-gguf", str(d)), 1, "tokenizer.json", "pre-tokenizer",
                          "not one llama.cpp names")
    assert not list(d.glob("*.gguf"))


def test_architecture_choice() -> None:
    from gptport.config import ModelConfig
    from gptport.export.gguf_llama import architecture

    base = {"vocab_size": 100, "d_model": 64, "n_head": 4, "norm": "rmsnorm", "mlp": "swiglu", "pos_encoding": "rope",
            "bias": False}
    llama3 = {"rope_scaling": "llama3", "rope_factor": 8.0, "rope_original_n_ctx": 16}
    assert architecture(ModelConfig(**base)) == "llama"
    assert architecture(ModelConfig(**base, qkv_bias=True)) == "qwen2"
    assert architecture(ModelConfig(**base, qkv_bias=True, **llama3)) == "llama"  # llama takes biases and rope_freqs
    assert architecture(ModelConfig(**base, qkv_bias=True, out_bias=True, mlp_bias=True)) == "llama"
    assert architecture(ModelConfig(**base, qk_norm=True, head_dim=32)) == "qwen3"


# ---- llama.cpp itself, where it is installed (as tests/export/test_gguf.py) ------------------------------------

LLAMA_ENV = "GPTPORT_LLAMA_CPP_BIN"
# none starts with a space: llama.cpp's SentencePiece tokenizer puts its "▁" before such a text too, as SentencePiece
# does, where tokenizers' Metaspace (transformers' conversion) does not double it (docs/guide/real-models.md)
LLAMA_CPP_TEXTS = ["ka to ri 日本 🙂", "spaces  \nand  lines\n\n", "x1y22z333 isn't", "tab\there"]


def _post(port: int, path: str, body: dict[str, Any]) -> Any:
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def test_llama_cpp_tokenizes_and_decodes_as_the_source(exported: tuple[str, HfModel, Path]) -> None:
    """llama-server on the F32 file: /tokenize gives the source tokenizer's ids; greedy decoding from the prompt's
    ids gives transformers' greedy tokens, ending on generation_config.json's own end token."""
    import os

    from tests.support import server_proc
    from tests.support.hf_models import greedy

    folder = os.environ.get(LLAMA_ENV)
    if not folder:
        pytest.skip(f"set {LLAMA_ENV} to a folder with llama.cpp's llama-server to run this")
    binary = Path(folder) / "llama-server"
    assert binary.is_file(), f"{LLAMA_ENV}={folder}: no llama-server there"
    _, hf, model_dir = exported
    path = model_dir / "model.f32.gguf"
    port, log = server_proc.free_port(), model_dir / "llama-server.log"
    cmd = [str(binary), "-m", str(path), "--host", "127.0.0.1", "--port", str(port), "-np", "1", "-t", "2"]
    prompt = hf.tokenizer(hf.prompt)["input_ids"]
    want = greedy(hf.model, prompt, 24)
    with server_proc.running(cmd, server_proc.url_of(port), log, limit=60, stop_timeout=10):
        for text in LLAMA_CPP_TEXTS:
            got = _post(port, "/tokenize", {"content": text, "add_special": False})["tokens"]
            assert got == hf.tokenizer(text, add_special_tokens=False)["input_ids"], text
        assert _post(port, "/tokenize", {"content": hf.prompt, "add_special": True})["tokens"] == prompt
        r = _post(port, "/completion", {"prompt": prompt, "n_predict": 24, "temperature": 0, "top_k": 1,
                                        "return_tokens": True, "cache_prompt": False})
    assert want[-1] == hf.stop_id
    assert r["tokens"] == want and r["stop_type"] == "eos"  # the end token included, as transformers gives it
