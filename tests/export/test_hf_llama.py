"""import-hf of the Llama family: tiny random Llama (grouped kv heads, Llama 3.1's RoPE scaling), Qwen2 (q/k/v
biases, tied head, one kv head), Qwen3 (q/k norm, heads wider than d_model) and Mistral (bf16, sharded, a
sliding window) built locally with transformers, their weights drawn wide (std 0.3, biases and norms too) so
that a RoPE or head-grouping mistake moves the logits. gptport's torch model gives transformers' logits within
1e-4 of their magnitude at several lengths and through its KV cache, and the same greedy tokens; the same
check fails on a model rotated in interleaved pairs or with its kv heads shifted by one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gptport import tokenizer as bpe
from gptport.export.hf import import_hf
from gptport.runtime.generate import generate
from gptport.runtime.sampling import Sampling
from gptport.training.checkpoint import load_model
from gptport.training.model import GPT
from gptport.training.torch_engine import TorchEngine
from tests.support.cli import assert_one_line_error, gptport

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

SPECIALS = ["<|begin_of_text|>", "<|eot_id|>"]
RTOL = 1e-4
SHAPE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "max_position_embeddings": 64}
ARCHS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {
        "num_key_value_heads": 2, "rope_theta": 500000.0, "tie_word_embeddings": False,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 16}}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 1, "rope_theta": 1e6,
                                                  "tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"num_key_value_heads": 2, "head_dim": 32,
                                                  "tie_word_embeddings": False,
                                                  "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"num_key_value_heads": 2, "sliding_window": 32,
                                                        "tie_word_embeddings": False}),
}


@pytest.fixture(scope="module")
def hf_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    """A byte-level BPE as Llama 3 ships one: tokenizer.json with begin-of-text and end-of-turn tokens, a
    post-processor that puts begin-of-text first, tokenizer_config.json with a chat template, and
    generation_config.json ending on either end token."""
    from tokenizers import AddedToken, Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("hf_tokenizer")
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    bos = tok.token_to_id(SPECIALS[0])
    tok.post_processor = processors.TemplateProcessing(single=f"{SPECIALS[0]} $A", special_tokens=[(SPECIALS[0], bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIALS[0], eos_token=SPECIALS[1])
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}<|eot_id|>{% endfor %}"
    fast.save_pretrained(str(out))
    return out


def _widen(model: torch.nn.Module, std: float = 0.3) -> None:
    """Every weight drawn N(0, std), norms N(1, std), biases N(0, std): nothing near-uniform to hide behind."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * std + (1.0 if name.endswith("norm.weight") else 0.0))


def make_hf(arch: str, out: Path, tokenizer: Path, vocab: int, dtype: torch.dtype = torch.float32,
            **save: Any) -> Path:
    """A tiny random transformers model of `arch` (stored in `dtype`), saved with the tokenizer's files."""
    import shutil

    from transformers import GenerationConfig

    config_cls, model_cls, extra = ARCHS[arch]
    config = getattr(transformers, config_cls)(vocab_size=vocab, bos_token_id=vocab - 2, eos_token_id=vocab - 1,
                                               **SHAPE, **extra)
    model = getattr(transformers, model_cls)(config).eval()
    _widen(model)
    model.to(dtype).save_pretrained(str(out), **save)
    for path in tokenizer.iterdir():
        if path.is_file():
            shutil.copy(path, out / path.name)
    GenerationConfig(eos_token_id=[vocab - 1, 0]).save_pretrained(str(out))
    return out


FLOAT32 = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max())


def hf_logits(hf_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), **FLOAT32).eval()
    with torch.no_grad():
        return model(ids).logits


def imported(arch: str, tmp_path: Path, hf_tokenizer_dir: Path, **save: Any) -> tuple[Path, GPT, Path]:
    hf_dir = make_hf(arch, tmp_path / f"hf_{arch}", hf_tokenizer_dir, _vocab(hf_tokenizer_dir), **save)
    out = tmp_path / "m"
    import_hf(hf_dir, out)
    model, _ = load_model(out, bpe.load(out))
    return hf_dir, model, out


def _vocab(hf_tokenizer_dir: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(hf_tokenizer_dir / "tokenizer.json")).get_vocab_size(with_added_tokens=True)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_imported_logits_equal_transformers(arch: str, tmp_path: Path, hf_tokenizer_dir: Path) -> None:
    hf_dir, model, out = imported(arch, tmp_path, hf_tokenizer_dir)
    torch.manual_seed(1)
    for length in (1, 7, 33, 64):
        ids = torch.randint(0, model.cfg.vocab_size, (2, length))
        theirs = hf_logits(hf_dir, ids)
        with torch.no_grad():
            ours = model(ids)[0]
        assert theirs.abs().max() > 1.0  # wide weights: logits far from uniform
        assert relative_error(ours, theirs) <= RTOL, (arch, length)
    ids = torch.randint(0, model.cfg.vocab_size, (1, 40))
    theirs = hf_logits(hf_dir, ids)
    with torch.no_grad():  # through the KV cache: a prefill of 30, then 10 single steps
        steps, past = model(ids[:, :30])
        chunks = [steps]
        for t in range(30, 40):
            step, past = model(ids[:, t:t + 1], attention_mask=torch.ones(1, t + 1, dtype=torch.long), past=past)
            chunks.append(step)
    assert relative_error(torch.cat(chunks, dim=1), theirs) <= RTOL
    assert past[0][0].shape == (1, model.cfg.n_kv_head, 40, model.cfg.head_dim)


def test_greedy_tokens_equal_transformers(tmp_path: Path, hf_tokenizer_dir: Path) -> None:
    hf_dir, model, _ = imported("llama", tmp_path, hf_tokenizer_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), **FLOAT32).eval()
    prompts = [[5, 17, 200, 3], [9], [44, 45, 46, 47, 48, 49]]  # one left-padded batch in gptport's loop
    got = generate(TorchEngine(model), prompts, 16, Sampling(), eot_id=-1)
    for prompt, row in zip(prompts, got, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            for _ in range(16):
                ids = torch.cat([ids, hf(ids).logits[:, -1:].argmax(-1)], dim=1)
        assert row.new_ids == ids[0, len(prompt):].tolist()


def _interleaved(model: GPT) -> None:
    """Rotate in interleaved pairs (x0, x1), (x2, x3)... instead of halves: the same as permuting each q and
    k head's rows from interleaved to halves order under gptport's rotate_half."""
    cfg = model.cfg
    hd = cfg.head_dim
    order = torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])
    with torch.no_grad():
        for block in model.h:
            w = block.attn.c_attn.weight  # (H*hd + 2*Hkv*hd, D)
            heads = (cfg.n_head + cfg.n_kv_head) * hd  # q and k rows
            w[:heads] = w[:heads].view(-1, hd, w.shape[1])[:, order].reshape(heads, -1)


def _kv_shifted(model: GPT) -> None:
    """Query head h reads kv head (h // group + 1) mod Hkv: the kv heads rolled by one."""
    cfg = model.cfg
    with torch.no_grad():
        for block in model.h:
            w = block.attn.c_attn.weight
            kv = w[cfg.q_width:].view(2, cfg.n_kv_head, cfg.head_dim, -1)  # (k|v, Hkv, hd, D)
            w[cfg.q_width:] = kv.roll(1, dims=1).reshape(2 * cfg.kv_width, -1)


@pytest.mark.parametrize("break_it", [_interleaved, _kv_shifted], ids=["interleaved-rotation", "kv-heads-shifted"])
def test_the_comparison_fails_on_a_wrong_rotation_or_head_mapping(break_it: Callable[[GPT], None], tmp_path: Path,
                                                                  hf_tokenizer_dir: Path) -> None:
    hf_dir, model, _ = imported("llama", tmp_path, hf_tokenizer_dir)
    ids = torch.randint(0, model.cfg.vocab_size, (2, 33))
    theirs = hf_logits(hf_dir, ids)
    break_it(model)
    with torch.no_grad():
        ours = model(ids)[0]
    assert relative_error(ours, theirs) > 100 * RTOL


def test_special_tokens_and_kept_files(tmp_path: Path, hf_tokenizer_dir: Path) -> None:
    """bos from tokenizer_config.json, added because the post-processor puts it first; every end id of
    generation_config.json, config.json and the tokenizer; the chat template and generation config kept
    byte for byte; the tokenizer encodes and decodes as transformers' does."""
    hf_dir, model, out = imported("llama", tmp_path, hf_tokenizer_dir)
    tok, V = bpe.load(out), model.cfg.vocab_size
    bos, eot = tok.backend.token_to_id(SPECIALS[0]), tok.backend.token_to_id(SPECIALS[1])
    assert (model.cfg.bos_id, model.cfg.add_bos, tok.eot_id) == (bos, True, eot)
    assert model.cfg.eos_ids == tuple(sorted({0, V - 1, eot}))
    for name in ("tokenizer_config.json", "generation_config.json", "tokenizer.json"):
        assert (out / name).read_bytes() == (hf_dir / name).read_bytes()
    assert "chat_template" in json.loads((out / "tokenizer_config.json").read_text()) or (
        (out / "chat_template.jinja").read_bytes() == (hf_dir / "chat_template.jinja").read_bytes())
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    for text in ("ka to ri 日本 🙂", "<|eot_id|>after", "  spaces\n"):
        ids = hf_tok(text, add_special_tokens=False)["input_ids"]
        assert tok.encode(text) == ids and tok.decode(ids) == hf_tok.decode(ids)
    saved = json.loads((out / "config.json").read_text())
    assert saved["format_version"] == 3 and saved["eot_id"] == eot


def test_mistral_bf16_sharded_with_a_sliding_window(tmp_path: Path, hf_tokenizer_dir: Path) -> None:
    """Shards listed by model.safetensors.index.json, bf16 widened to float32 (the logits of transformers'
    float32 load of the same file); the sliding window a mask on every layer, the context max_position_embeddings
    (inside and past the window: tests/export/test_windows_hf.py)."""
    vocab = _vocab(hf_tokenizer_dir)
    hf_dir = make_hf("mistral", tmp_path / "hf", hf_tokenizer_dir, vocab, torch.bfloat16, max_shard_size="100KB")
    assert (hf_dir / "model.safetensors.index.json").is_file() and not (hf_dir / "model.safetensors").exists()
    import_hf(hf_dir, tmp_path / "m")
    ours, card = load_model(tmp_path / "m", bpe.load(tmp_path / "m"))
    assert (card.model.n_ctx, card.model.sliding_window, card.model.window_layers) == (64, 32, (0, 1))
    ids = torch.randint(0, vocab, (2, 64))
    with torch.no_grad():
        assert relative_error(ours(ids)[0], hf_logits(hf_dir, ids)) <= RTOL


def test_a_sentencepiece_style_tokenizer_encodes_as_transformers(tmp_path: Path, corpus_file: Path) -> None:
    """Llama 2's kind: BPE with byte fallback over Metaspace pieces; gptport encodes and decodes through
    `tokenizers` as transformers does, and counts a piece's bytes with "▁" as a space, <0xAB> as one byte."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace()
    trained.train([str(corpus_file)], trainers.BpeTrainer(vocab_size=400, show_progress=False))
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate([*specials, *(f"<0x{b:02X}>" for b in range(256))])}
    for token, _ in sorted(trained.get_vocab().items(), key=lambda kv: kv[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m) for m in json.loads(trained.to_str())["model"]["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    src = tmp_path / "sp"
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            add_bos_token=True).save_pretrained(str(src))
    hf_dir = make_hf("llama", tmp_path / "hf", src, tok.get_vocab_size(with_added_tokens=True))
    import_hf(hf_dir, tmp_path / "m")
    ours = bpe.load(tmp_path / "m")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    for text in ("ka to ri", "日本 🙂 ñ", "line\nbreak"):
        ids = hf_tok(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text) == ids and ours.decode(ids) == hf_tok.decode(ids)
    sizes = bpe.token_bytes(ours)
    assert sizes[vocab["<0x0A>"]] == 1 and sizes[vocab["<s>"]] == 0
    pieces = [t for t in vocab if t.startswith("\u2581") and len(t) > 1]
    assert pieces and all(sizes[vocab[t]] == len(t[1:].encode()) + 1 for t in pieces)


def _broken(tmp_path: Path, hf_tokenizer_dir: Path, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Path:
    hf_dir = tmp_path / "hf"
    if not hf_dir.exists():
        make_hf("llama", hf_dir, hf_tokenizer_dir, _vocab(hf_tokenizer_dir))
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps(change(config)))
    return hf_dir


BAD = [
    (lambda c: {**c, "rope_thetta": 1.0}, "key 'rope_thetta' is not one gptport knows for a llama model"),
    (lambda c: {**c, "model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]},
     "architecture GPTNeoXForCausalLM is not one gptport imports"),
    (lambda c: {**c, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
     "rope type 'yarn' is not one gptport has"),
    (lambda c: {**c, "hidden_act": "gelu"}, "hidden_act 'gelu' is not silu"),
    # absurd sizes from a stranger's config.json: refused before anything is sized by them
    (lambda c: {**c, "vocab_size": 2**40}, "vocab_size must be at most 16,777,216, not 1,099,511,627,776"),
    (lambda c: {**c, "num_attention_heads": 0}, "num_attention_heads must be positive, not 0"),
    (lambda c: {**c, "num_hidden_layers": 10**9}, "num_hidden_layers must be at most 4,096, not 1,000,000,000"),
    (lambda c: {**c, "hidden_size": 64.5}, "hidden_size must be an integer, not 64.5"),
    (lambda c: {**{k: v for k, v in c.items() if k not in ("attention_bias", "mlp_bias")}, "model_type": "mistral",
                "architectures": ["MistralForCausalLM"], "sliding_window": -4},
     "sliding_window must be positive, not -4"),
]


@pytest.mark.parametrize(("change", "says"), BAD, ids=["unknown-key", "architecture", "rope-type", "activation",
                                                       "vocab-2-40", "zero-heads", "layers-1e9", "float-width",
                                                       "negative-window"])
def test_bad_input_is_refused_in_one_line_and_nothing_is_written(change: Callable[[dict[str, Any]], dict[str, Any]],
                                                                 says: str, tmp_path: Path,
                                                                 hf_tokenizer_dir: Path) -> None:
    hf_dir = _broken(tmp_path, hf_tokenizer_dir, change)
    out = tmp_path / "out"
    assert_one_line_error(gptport("import-hf", str(hf_dir), "--out", str(out)), 1, "config.json", says)
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


LLAMA31_8B = {  # Llama 3.1 8B's config.json as transformers 4.x writes it (rope_theta + rope_scaling)
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.43.0",
    "use_cache": True, "vocab_size": 128256}
QWEN25 = {  # Qwen2.5 0.5B's
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
    "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.40.1",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
MISTRAL_V01 = {  # Mistral 7B v0.1's: a 4096-token sliding window
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000}


def test_released_configs_map_to_the_model_they_describe() -> None:
    """config.json of released checkpoints (4.x's key layout) read without their weights."""
    from gptport.arch import family
    from gptport.arch.base import Specials

    def model_config(hf: dict[str, Any], model_type: str, vocab: int, tokens: Specials, where: Path) -> Any:
        return family(model_type).model_config(hf, vocab, tokens, where)

    tokens = Specials(None, False, (2,), 2)
    llama = model_config(LLAMA31_8B, "llama", 128256, tokens, Path("config.json"))
    assert (llama.n_head, llama.n_kv_head, llama.head_dim, llama.d_ff, llama.n_ctx) == (32, 8, 128, 14336, 131072)
    assert (llama.rope_scaling, llama.rope_factor, llama.rope_original_n_ctx, llama.rope_theta) == (
        "llama3", 8.0, 8192, 500000.0)
    assert not (llama.has_qkv_bias or llama.has_out_bias or llama.has_mlp_bias or llama.tie_embeddings)
    assert 8.0e9 < llama.n_params() < 8.1e9  # Llama 3.1 8B's 8.03B
    qwen = model_config(QWEN25, "qwen2", 151665, tokens, Path("config.json"))
    assert (qwen.n_ctx, qwen.has_qkv_bias, qwen.has_out_bias, qwen.tie_embeddings, qwen.head_dim) == (
        32768, True, False, True, 64)  # use_sliding_window false: no window
    mistral = model_config(MISTRAL_V01, "mistral", 32000, tokens, Path("config.json"))
    assert (mistral.n_ctx, mistral.sliding_window, mistral.rope_scaling) == (32768, 4096, "none")
    assert model_config({**MISTRAL_V01, "head_dim": None, "sliding_window": None}, "mistral", 32000, tokens,
                        Path("c")).sliding_window == 0


def test_into_a_model_directory_only_with_force_and_no_stage_left(tmp_path: Path, hf_tokenizer_dir: Path) -> None:
    """A new --out is written whole; over a model, --force replaces its files (config.json last) and keeps the
    others; no staging directory is left beside or inside it."""
    hf_dir, _, out = imported("qwen3", tmp_path, hf_tokenizer_dir)
    (out / "notes.txt").write_text("mine")
    assert_one_line_error(gptport("import-hf", str(hf_dir), "--out", str(out)), 1, "already holds a model", "--force")
    import_hf(make_hf("llama", tmp_path / "hf2", hf_tokenizer_dir, _vocab(hf_tokenizer_dir)), out, force=True)
    _, card = load_model(out, bpe.load(out))
    assert not card.model.qk_norm and (out / "notes.txt").read_text() == "mine"
    assert [p.name for p in [*tmp_path.iterdir(), *out.iterdir()] if p.name.startswith(".")] == []


def test_export_hf_and_gguf_name_what_keeps_a_llama_model_from_gpt2() -> None:
    """mismatches names each difference that keeps a Llama-family model from GPT-2 (export-hf then writes it
    as its Llama-family class: tests/export/test_hf_export_llama.py)."""
    from gptport.config import ModelConfig
    from gptport.export.hf import mismatches

    cfg = ModelConfig(vocab_size=100, d_model=64, n_head=4, n_kv_head=2, head_dim=32, norm="rmsnorm", mlp="swiglu",
                      pos_encoding="rope", bias=False, qk_norm=True)
    said = "; ".join(mismatches(cfg))
    for needle in ("pos_encoding is 'rope'", "norm is 'rmsnorm'", "mlp is 'swiglu'", "n_kv_head is 2",
                   "n_head * head_dim is 128", "qk_norm is true", "bias is false"):
        assert needle in said
    assert mismatches(ModelConfig(vocab_size=100, d_model=64, n_head=4)) == []
