"""export-hf of the Llama family, through the CLI: tiny random transformers models (tests/support/hf_models.py:
weights drawn wide) of Llama (2 kv heads for 4, Llama 3.1's rope scaling, a byte-level BPE adding its begin
token), Qwen2 (q/k/v biases, one kv head, tied head, ChatML), Qwen3 (q/k norm, heads wider than d_model, linear
rope scaling, a SentencePiece-style BPE with byte fallback) and Mistral (imported with its sliding window) go
through `gptport import-hf` and `gptport export-hf`; transformers' AutoModelForCausalLM loads the export as the
source's class with the source's logits, AutoTokenizer encodes and renders the chat template as the source's
does, generation_config.json ends on the same ids, and import-hf of the export gives back the same model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gptport.errors import InputError
from tests.support.cli import assert_one_line_error, gptport
from tests.support.hf_models import HfModel, build

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")
torch = pytest.importorskip("torch")

LLAMA3 = {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 16}}
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("llama", "byte-level", LLAMA3),
    "qwen2": ("qwen2", "chatml", {}),
    "qwen3": ("qwen3", "metaspace", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "mistral": ("llama", "byte-level", {}),  # saved as a MistralForCausalLM below
}
MESSAGES = [{"role": "user", "content": "ka to ri"}, {"role": "assistant", "content": "men sol"},
            {"role": "user", "content": "qua lin 日本"}]
TEXTS = ["ka to ri 日本 🙂", "  spaces\nand lines", "x1y22z333 isn't"]
FLOAT32 = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}


def _ids(value: int | list[int] | None) -> list[int]:
    return [] if value is None else [value] if isinstance(value, int) else list(value)


def _as_mistral(hf: HfModel) -> HfModel:
    """The Llama saved as MistralForCausalLM with a sliding window of 32 (a mask on every layer)."""
    config = transformers.MistralConfig(**{k: v for k, v in hf.model.config.to_dict().items()
                                           if k in ("vocab_size", "hidden_size", "intermediate_size",
                                                    "num_hidden_layers", "num_attention_heads",
                                                    "num_key_value_heads", "max_position_embeddings",
                                                    "bos_token_id", "eos_token_id", "tie_word_embeddings")},
                                        sliding_window=32, head_dim=hf.model.config.head_dim)
    model = transformers.MistralForCausalLM(config).eval()
    model.load_state_dict(hf.model.state_dict())
    generation = (hf.path / "generation_config.json").read_bytes()  # its own end token, kept
    (hf.path / "config.json").unlink()
    model.save_pretrained(str(hf.path))
    (hf.path / "generation_config.json").write_bytes(generation)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(hf.path), **FLOAT32).eval()
    return HfModel(hf.path, reloaded, hf.tokenizer, hf.stop_id, hf.prompt)


@pytest.fixture(scope="module", params=list(CASES))
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path,
             corpus_file: Path) -> tuple[str, HfModel, Path, Path]:
    arch, kind, config = CASES[request.param]
    root = tmp_path_factory.mktemp(f"hfx_{request.param}")
    hf = build(arch, kind, root / "hf", tokenizer_dir, corpus_file, config=config)
    if request.param == "mistral":
        hf = _as_mistral(hf)
    r = gptport("import-hf", str(hf.path), "--out", str(root / "m"))
    assert r.returncode == 0, r.stderr
    r = gptport("export-hf", str(root / "m"), "--out", str(root / "out"))
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stderr
    return request.param, hf, root / "m", root / "out"


def test_transformers_loads_the_sources_class_with_its_logits(exported: tuple[str, HfModel, Path, Path]) -> None:
    case, hf, _, out = exported
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(out), **FLOAT32).eval()
    assert type(theirs).__name__ == type(hf.model).__name__
    source, written = hf.model.config, theirs.config
    for key in ("num_key_value_heads", "rms_norm_eps", "tie_word_embeddings", "bos_token_id", "vocab_size",
                "hidden_size", "intermediate_size"):
        assert getattr(written, key) == getattr(source, key), key
    ends = json.loads((hf.path / "generation_config.json").read_text())["eos_token_id"]
    assert set(_ids(written.eos_token_id)) == {*_ids(source.eos_token_id), *ends}  # every end id, as import read them
    width = source.hidden_size // source.num_attention_heads  # Qwen2's heads, which have no head_dim key
    assert getattr(written, "head_dim", width) == getattr(source, "head_dim", width)
    rope = getattr(source, "rope_parameters", None) or {"rope_theta": source.rope_theta, **(source.rope_scaling or {})}
    rope_out = getattr(written, "rope_parameters", None) or {"rope_theta": written.rope_theta,
                                                             **(written.rope_scaling or {})}
    assert rope_out == rope
    torch.manual_seed(1)
    for length in (1, 9, 64):  # past Mistral's window of 32
        ids = torch.randint(0, source.vocab_size, (2, length))
        with torch.no_grad():
            want, got = hf.model(ids).logits, theirs(ids).logits
        assert want.abs().max() > 1.0  # wide weights: far from uniform logits
        assert float((got - want).abs().max() / want.abs().max()) <= 1e-6, (case, length)


def test_the_tokenizer_and_chat_template_are_the_sources(exported: tuple[str, HfModel, Path, Path]) -> None:
    _, hf, _, out = exported
    theirs = transformers.AutoTokenizer.from_pretrained(str(out))
    for text in [*TEXTS, f"{hf.tokenizer.eos_token}after"]:
        assert theirs(text)["input_ids"] == hf.tokenizer(text)["input_ids"]
        ids = hf.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert theirs.decode(ids) == hf.tokenizer.decode(ids)
    assert (theirs.bos_token, theirs.eos_token) == (hf.tokenizer.bos_token, hf.tokenizer.eos_token)
    rendered = theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert rendered == hf.tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    generation = json.loads((out / "generation_config.json").read_text())
    source_generation = json.loads((hf.path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == source_generation["eos_token_id"]
    assert hf.stop_id in generation["eos_token_id"]


def test_import_hf_of_the_export_gives_back_the_same_model(exported: tuple[str, HfModel, Path, Path],
                                                            tmp_path: Path) -> None:
    case, _, model_dir, out = exported
    r = gptport("import-hf", str(out), "--out", str(tmp_path / "again"))
    assert r.returncode == 0, r.stderr
    first, again = (json.loads((d / "config.json").read_text()) for d in (model_dir, tmp_path / "again"))
    assert again["model"] == first["model"]
    from safetensors.numpy import load_file

    before, after = (load_file(str(d / "model.safetensors")) for d in (model_dir, tmp_path / "again"))
    assert list(after) == list(before) and all((after[k] == before[k]).all() for k in before)  # bit for bit
    assert again["imported_from"]["architecture"] == first["imported_from"]["architecture"]
    assert first["imported_from"]["architecture"] == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                                      "qwen3": "Qwen3ForCausalLM",
                                                      "mistral": "MistralForCausalLM"}[case]


def test_a_model_trained_here_exports_as_a_llama(tmp_path: Path, tokenizer_dir: Path, corpus_file: Path) -> None:
    """A llama-tiny model (no begin token, <|endoftext|> its end) loads in transformers with its torch logits."""
    from gptport import tokenizer as bpe
    from gptport.training.checkpoint import load_model
    from tests.conftest import build_model_dir

    d = build_model_dir(tmp_path / "m", tokenizer_dir, corpus_file, steps=0, norm="rmsnorm", mlp="swiglu",
                        pos_encoding="rope", bias=False, n_kv_head=2, tie_embeddings=False, rope_theta=5000.0)
    r = gptport("export-hf", str(d), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), **FLOAT32).eval()
    assert type(theirs).__name__ == "LlamaForCausalLM"
    ours, _ = load_model(d, bpe.load(d))
    ids = torch.randint(0, ours.cfg.vocab_size, (2, 17))
    with torch.no_grad():
        want, got = ours(ids)[0], theirs(ids).logits
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-5
    eot = bpe.load(d).eot_id
    assert json.loads((tmp_path / "out" / "generation_config.json").read_text())["eos_token_id"] == eot


@pytest.mark.parametrize(("shape", "says"), [
    ({"norm": "layernorm", "pos_encoding": "rope"}, "not an architecture of the Llama family: norm is 'layernorm'"),
    ({"norm": "rmsnorm", "mlp": "swiglu", "pos_encoding": "rope", "qk_norm": True, "mlp_bias": True},
     "q/k norm with these biases"),
    ({"pos_encoding": "sinusoidal"}, "not a GPT-2 architecture (nor the Llama family's): pos_encoding is 'sinusoidal'"),
], ids=["layernorm-with-rope", "qk-norm-with-mlp-bias", "sinusoidal"])
def test_a_model_no_transformers_class_computes_is_refused_in_one_line(tmp_path: Path, tokenizer_dir: Path,
                                                                     corpus_file: Path, shape: dict[str, Any],
                                                                     says: str) -> None:
    from tests.conftest import build_model_dir

    d = build_model_dir(tmp_path / "m", tokenizer_dir, corpus_file, steps=0, bias=False, **shape)
    assert_one_line_error(gptport("export-hf", str(d), "--out", str(tmp_path / "out")), 1, says)
    assert not (tmp_path / "out").exists()


def test_architecture_choice() -> None:
    from gptport.config import ModelConfig
    from gptport.export.hf_llama_export import architecture

    base = {"vocab_size": 100, "d_model": 64, "n_head": 4, "norm": "rmsnorm", "mlp": "swiglu", "pos_encoding": "rope",
            "bias": False}
    assert architecture(ModelConfig(**base), {}) == "llama"
    assert architecture(ModelConfig(**base), {"architecture": "MistralForCausalLM"}) == "mistral"
    assert architecture(ModelConfig(**base, qkv_bias=True), {}) == "qwen2"
    assert architecture(ModelConfig(**base, qkv_bias=True, out_bias=True), {}) == "llama"
    assert architecture(ModelConfig(**base, qk_norm=True, head_dim=32), {}) == "qwen3"
    with pytest.raises(InputError, match="output-projection bias without q/k/v biases"):
        architecture(ModelConfig(**base, out_bias=True), {})
    with pytest.raises(InputError, match="heads 128 wide over d_model 64"):
        architecture(ModelConfig(**base, qkv_bias=True, head_dim=32), {})


def test_named_chat_templates_are_kept_and_written_back(tmp_path: Path, tokenizer_dir: Path,
                                                        corpus_file: Path) -> None:
    """transformers 5's additional_chat_templates/NAME.jinja: import-hf keeps them, serve's renderer offers them
    by name beside the default, export-hf writes them back and transformers reads them as named templates."""
    from gptport.serve.api.chat_template import template_sources

    hf = build("qwen2", "chatml", tmp_path / "hf", tokenizer_dir, corpus_file)
    named = hf.path / "additional_chat_templates"
    named.mkdir()
    tool_use = "{% for m in messages %}<|im_start|>{{ m['role'] }} (tools)\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    (named / "tool_use.jinja").write_text(tool_use, encoding="utf-8")
    assert gptport("import-hf", str(hf.path), "--out", str(tmp_path / "m")).returncode == 0
    assert (tmp_path / "m" / "additional_chat_templates" / "tool_use.jinja").read_text(encoding="utf-8") == tool_use
    sources, _ = template_sources(tmp_path / "m", {})
    assert sources["tool_use"] == tool_use and sources["default"] == hf.tokenizer.chat_template
    assert gptport("export-hf", str(tmp_path / "m"), "--out", str(tmp_path / "out")).returncode == 0
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    source = transformers.AutoTokenizer.from_pretrained(str(hf.path))
    assert theirs.chat_template == source.chat_template and theirs.chat_template["tool_use"] == tool_use
