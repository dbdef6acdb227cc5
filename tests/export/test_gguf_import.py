"""import-gguf of llama.cpp files: tiny random transformers Llamas (weights drawn wide, std 0.3, so that a wrong
permutation or head mapping moves the logits) written as llama.cpp's converter writes them (tests/support/
gguf_files.py: its tensor names, q/k rows permuted, rope_freqs.weight, gguf.quants' quantization). F32 files give
transformers' logits within 1e-4 of their magnitude; quantized ones (Q8_0, Q4_0, Q4_1) give exactly the gguf
package's dequantized values and the logits of a transformers model holding them; a gptport GPT-2 goes through
export-gguf and back unchanged; the weights are streamed into a model.safetensors that config.json's sha256 and
the source's "imported_from" record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from gptport import arch, provenance
from gptport import tokenizer as bpe
from gptport.arch.base import assemble
from gptport.export.gguf_export import export_gguf
from gptport.export.gguf_import import import_gguf
from gptport.training.checkpoint import load_model
from tests.conftest import build_model_dir
from tests.support import gguf_files as gf
from tests.support.cli import assert_one_line_error, gptport

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

SPECIALS = ["<|begin_of_text|>", "<|eot_id|>"]
RTOL = 1e-4
SHAPE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "max_position_embeddings": 64}
CASES: dict[str, dict[str, Any]] = {
    "gqa-untied-llama3": {"num_key_value_heads": 2, "rope_theta": 500000.0, "tie_word_embeddings": False,
                          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 16}},
    "mha-tied-biases": {"num_key_value_heads": 4, "tie_word_embeddings": True, "attention_bias": True},
}
TEMPLATE = "{% for m in messages %}<|begin_of_text|>{{ m['role'] }}: {{ m['content'] }}<|eot_id|>{% endfor %}"


@pytest.fixture(scope="module")
def source_tokenizer(tokenizer_dir: Path) -> Any:
    """The fixture's byte-level BPE with Llama 3's begin-of-text and end-of-turn tokens added."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return tok


def hf_llama(vocab: int, case: str) -> Any:
    """A tiny transformers Llama, every weight N(0, 0.3), norms N(1, 0.3)."""
    config = transformers.LlamaConfig(vocab_size=vocab, **SHAPE, **CASES[case])
    model = transformers.LlamaForCausalLM(config).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("norm.weight") else 0.0))
    return model


def write_llama(path: Path, model: Any, source_tokenizer: Any, qtype: gf.Q = gf.Q.F32) -> Path:
    fields = gf.tokenizer_fields(source_tokenizer)
    bos, eot = (source_tokenizer.token_to_id(t) for t in SPECIALS)
    meta = gf.llama_meta(model.config, fields, bos=bos, eos=source_tokenizer.token_to_id(bpe.EOT), eot=eot,
                         add_bos=True, template=TEMPLATE)
    return gf.write(path, "llama", meta, gf.llama_tensors(model, qtype))


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max())


def logits(model: Any, ids: torch.Tensor, hf: bool = False) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits if hf else model(ids)[0]


@pytest.mark.parametrize("case", list(CASES))
def test_f32_logits_equal_transformers(case: str, tmp_path: Path, source_tokenizer: Any) -> None:
    hf = hf_llama(source_tokenizer.get_vocab_size(), case)
    path = write_llama(tmp_path / "m.gguf", hf, source_tokenizer)
    s = import_gguf(path, tmp_path / "m")
    ours, card = load_model(tmp_path / "m", bpe.load(tmp_path / "m"))
    cfg = card.model
    assert (cfg.n_kv_head, cfg.tie_embeddings, cfg.has_qkv_bias, cfg.has_out_bias) == (
        hf.config.num_key_value_heads, hf.config.tie_word_embeddings, case == "mha-tied-biases",
        case == "mha-tied-biases")
    assert cfg.rope_scaling == ("llama3" if case == "gqa-untied-llama3" else "none")
    assert (s.architecture, s.tensor_types) == ("llama", {"F32": len(gf.llama_tensors(hf, gf.Q.F32))})
    torch.manual_seed(1)
    for length in (1, 7, 33, 64):
        ids = torch.randint(0, cfg.vocab_size, (2, length))
        theirs = logits(hf, ids, hf=True)
        assert theirs.abs().max() > 1.0  # wide weights: logits far from uniform
        assert relative_error(logits(ours, ids), theirs) <= RTOL, length


def test_without_the_permutation_undone_the_logits_differ(tmp_path: Path, source_tokenizer: Any) -> None:
    """The check has teeth: a file whose q/k rows were not permuted as the converter does (so import-gguf's
    un-permuting scrambles them) gives logits far from transformers'."""
    hf = hf_llama(source_tokenizer.get_vocab_size(), "gqa-untied-llama3")
    fields = gf.tokenizer_fields(source_tokenizer)
    tensors = gf.llama_tensors(hf, gf.Q.F32, permuted=False)
    eos = source_tokenizer.token_to_id(bpe.EOT)
    path = gf.write(tmp_path / "m.gguf", "llama", gf.llama_meta(hf.config, fields, eos=eos), tensors)
    import_gguf(path, tmp_path / "m")
    ours, _ = load_model(tmp_path / "m", bpe.load(tmp_path / "m"))
    ids = torch.randint(0, ours.cfg.vocab_size, (2, 33))
    assert relative_error(logits(ours, ids), logits(hf, ids, hf=True)) > 100 * RTOL


@pytest.mark.parametrize("qtype", [gf.Q.Q8_0, gf.Q.Q4_0, gf.Q.Q4_1], ids=lambda q: q.name)
def test_quantized_tensors_are_the_gguf_packages_values(qtype: gf.Q, tmp_path: Path, source_tokenizer: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Every imported tensor is exactly what gguf.quants dequantizes from the stored blocks (mapped to gptport's
    names by import-hf's mapping), and the model gives the logits of transformers' Llama holding those values.
    The embedding, the head and the MLP's matrices are dequantized a few rows at a time (the last piece shorter)."""
    monkeypatch.setattr("gptport.export.gguf_import.CHUNK", 3 * 96 + 5)  # 4 rows of 64 values at a time, 3 of 96
    hf = hf_llama(source_tokenizer.get_vocab_size(), "gqa-untied-llama3")
    path = write_llama(tmp_path / "m.gguf", hf, source_tokenizer, qtype)
    s = import_gguf(path, tmp_path / "m")
    assert s.tensor_types[qtype.name] == 2 + 7 * hf.config.num_hidden_layers  # embedding, head, 7 per layer
    reference = {name: torch.from_numpy(gf.roundtrip(t.float().numpy(), qtype)) if t.ndim == 2 else t
                 for name, t in hf.state_dict().items() if not name.endswith("inv_freq")}
    ours, card = load_model(tmp_path / "m", bpe.load(tmp_path / "m"))
    expected = {p.name: assemble(p, lambda n: reference[n].numpy())  # import-hf's plan of transformers' names
                for p in arch.family("llama").hf_plan(card.model, hf.config.vocab_size)}
    stored = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert set(stored) == set(expected)
    for name, tensor in expected.items():
        assert np.array_equal(stored[name], tensor), name
    assert not np.array_equal(stored["h.0.mlp.c_fc.weight"], hf.state_dict()["model.layers.0.mlp.up_proj.weight"])
    hf.load_state_dict(reference, strict=False)
    ids = torch.randint(0, card.model.vocab_size, (2, 33))
    assert relative_error(logits(ours, ids), logits(hf, ids, hf=True)) <= RTOL


def test_special_tokens_chat_template_and_provenance(tmp_path: Path, source_tokenizer: Any) -> None:
    """bos added (add_bos_token), eos and eot both end a sequence, the chat template kept where transformers and
    `gptport serve` read it, config.json recording the weights' and the source file's sha256."""
    from gptport.serve.api.chat_template import renderer

    hf = hf_llama(source_tokenizer.get_vocab_size(), "mha-tied-biases")
    path = write_llama(tmp_path / "m.gguf", hf, source_tokenizer)
    out = tmp_path / "m"
    import_gguf(path, out)
    _, card = load_model(out, bpe.load(out))
    bos, eot = (source_tokenizer.token_to_id(t) for t in SPECIALS)
    eos = source_tokenizer.token_to_id(bpe.EOT)
    assert (card.model.bos_id, card.model.add_bos, card.model.eos_ids, card.eot_id) == (
        bos, True, tuple(sorted({eos, eot})), eos)
    assert (out / "chat_template.jinja").read_text() == TEMPLATE
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == TEMPLATE
    render, _ = renderer(out)
    assert render([{"role": "user", "content": "hi"}])[0] == "<|begin_of_text|>user: hi<|eot_id|>"
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert hf_tok("ka to")["input_ids"][0] == bos and hf_tok.eos_token == bpe.EOT
    saved = json.loads((out / "config.json").read_text())
    assert saved["imported_from"]["sha256"] == provenance.file_digest(path)
    assert saved["imported_from"]["file"] == "m.gguf"
    assert saved["weights_sha256"] == provenance.file_digest(out / "model.safetensors")


def test_gpt2_round_trip_through_export_gguf(tmp_path: Path, tokenizer_dir: Path, corpus_file: Path) -> None:
    """A gptport GPT-2 written by export-gguf (f32) comes back with the same weights, shape and tokenizer."""
    src = build_model_dir(tmp_path / "src", tokenizer_dir, corpus_file, steps=0, tie_embeddings=False)
    written = export_gguf(src, "f32")
    out = tmp_path / "back"
    s = import_gguf(written.path, out)
    before, card = load_model(src, bpe.load(src))
    after, card2 = load_model(out, bpe.load(out))
    assert s.architecture == "gpt2" and not card2.model.tie_embeddings
    for key in ("n_ctx", "d_model", "n_layer", "n_head", "d_ff", "ln_eps", "bias", "pos_encoding", "vocab_size"):
        assert getattr(card2.model, key) == getattr(card.model, key), key
    for name, tensor in before.state_dict().items():
        assert torch.equal(after.state_dict()[name], tensor), name
    text = "ka to ri 日本 🙂 123 it's\n\n  x"
    assert bpe.load(out).encode(text) == bpe.load(src).encode(text)


def test_into_a_model_directory_only_with_force(tmp_path: Path, source_tokenizer: Any) -> None:
    """Over a model, --force replaces its files (config.json last) and keeps the others; no stage is left."""
    hf = hf_llama(source_tokenizer.get_vocab_size(), "mha-tied-biases")
    path = write_llama(tmp_path / "m.gguf", hf, source_tokenizer)
    out = tmp_path / "m"
    import_gguf(path, out)
    (out / "notes.txt").write_text("mine")
    r = gptport("import-gguf", str(path), "--out", str(out))
    assert r.returncode == 1 and "already holds a model" in r.stderr and "--force" in r.stderr
    r = gptport("import-gguf", str(path), "--out", str(out), "--force")
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stderr and "chat template" in r.stderr
    load_model(out, bpe.load(out))
    assert (out / "notes.txt").read_text() == "mine"
    assert [p.name for p in [*tmp_path.iterdir(), *out.iterdir()] if p.name.startswith(".")] == []


def test_gguf_reader_sees_the_quantized_blocks_it_was_given(tmp_path: Path, source_tokenizer: Any) -> None:
    """The test files are what they claim: gguf's reader finds Q4_0 blocks and the converter's names."""
    hf = hf_llama(source_tokenizer.get_vocab_size(), "gqa-untied-llama3")
    reader = gguf.GGUFReader(write_llama(tmp_path / "m.gguf", hf, source_tokenizer, gf.Q.Q4_0))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == "Q4_0" and types["blk.0.attn_norm.weight"] == "F32"
    assert types["rope_freqs.weight"] == "F32" and "output.weight" in types


def _bad_file(kind: str, path: Path, source_tokenizer: Any) -> Path:
    """A GGUF file with one flaw of `kind` (else as the converter writes it)."""
    hf = hf_llama(source_tokenizer.get_vocab_size(), "gqa-untied-llama3")
    fields = gf.tokenizer_fields(source_tokenizer)
    eos = source_tokenizer.token_to_id(bpe.EOT)
    tensors = gf.llama_tensors(hf, gf.Q.Q8_0)
    tokenizer: dict[str, Any] = {"eos": eos}
    meta = gf.llama_meta(hf.config, fields, **tokenizer)
    arch = "llama"
    if kind == "not-gguf":
        path.write_text("no magic here\n")
        return path
    if kind == "tensor-type":  # Q8_1, llama.cpp's activations' type
        name, w, _ = tensors[1]
        values, size = gguf.GGML_QUANT_SIZES[gf.Q.Q8_1]
        tensors[1] = (name, np.zeros((w.shape[0], w.shape[1] // values * size), np.uint8), gf.Q.Q8_1)
    if kind == "architecture":
        arch = "mamba"
    if kind in ("tokenizer-model", "pre-tokenizer"):
        tokenizer.update({"model": "t5"} if kind == "tokenizer-model" else {"pre": "no-such-pre"})
        meta = gf.llama_meta(hf.config, fields, **tokenizer)
    if kind == "unknown-key":
        def meta(w: gguf.GGUFWriter, base: Any = meta) -> None:
            base(w)
            w.add_uint32("llama.expert_count", 8)
    gf.write(path, arch, meta, tensors)
    if kind.startswith("truncated"):
        data = path.read_bytes()
        path.write_bytes(data[:200] if kind == "truncated-header" else data[:-1000])
    return path


BAD = {
    "truncated-data": "truncated: {size} bytes, but what its header describes reaches byte",
    "truncated-header": "truncated: {size} bytes, but what its header describes reaches byte",
    "not-gguf": "not a GGUF file gptport can read", "tensor-type": "is Q8_1, a type gptport does not import",
    "architecture": "architecture 'mamba' is not one gptport imports",
    "tokenizer-model": "tokenizer.ggml.model 't5' is a tokenizer gptport cannot rebuild",
    "pre-tokenizer": "tokenizer.ggml.pre 'no-such-pre' is a pre-tokenizer gptport does not know",
    "unknown-key": "metadata llama.expert_count is not a key gptport knows",
}


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_files_are_refused_in_one_line_and_nothing_is_written(kind: str, tmp_path: Path,
                                                                  source_tokenizer: Any) -> None:
    path = _bad_file(kind, tmp_path / "bad.gguf", source_tokenizer)
    out = tmp_path / "out"
    says = BAD[kind].format(size=f"{path.stat().st_size:,}")
    assert_one_line_error(gptport("import-gguf", str(path), "--out", str(out)), 1, str(path), says)
    assert [p.name for p in tmp_path.iterdir()] == ["bad.gguf"]
