"""import-gguf's tokenizer rebuilt from a GGUF file's tokenizer.ggml.* keys: byte-level BPEs whose merges span what
each pre-tokenizer splits apart (numbers, contractions, line breaks), so that the pre-tokenizer a file names must be
the one rebuilt for the ids to agree with the original's; SentencePiece-style BPE with byte fallback, from the
file's merges or from its pieces' scores alone; special and user-defined tokens kept at their ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from gptport.export.gguf_file import GGUFFile
from gptport.export.gguf_tokenizer import rebuild
from tests.support import gguf_files as gf

TEXTS = ["it's 12345 and 2024, isn't it?\n\n  ok", "We'LL see: 7 apples\r\n\tand 1,000,000 pears!",
         "日本語 🙂 naïve café, x1y22z333", "  spaces   everywhere  ", "<|im_start|>user\nhi 42<|im_end|>\n"]
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")  # Llama 3's tokenizer.json
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")  # Qwen2's


def byte_level(split: str | None) -> Any:
    """The pre-tokenizer of each original tokenizer.json: GPT-2's, SmolLM's (digits first), Llama 3's, Qwen2's."""
    if split is None:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if split == "digits":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


PRES = {"gpt-2": None, "smollm": "digits", "llama-bpe": LLAMA3, "qwen2": QWEN2}


@pytest.fixture(scope="module")
def merged_across(corpus_file: Path) -> Tokenizer:
    """A byte-level BPE trained without any split (its merges cross digits, apostrophes, spaces and line breaks),
    with ChatML's special tokens and a user-defined one."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    text = corpus_file.read_text(encoding="utf-8")[:20000] + "\n".join(TEXTS * 50)
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=700, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                       "<|im_end|>"]))
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False)])
    return tok


def tokenizer_only(path: Path, fields: dict[str, Any], **tokenizer: Any) -> GGUFFile:
    """A GGUF file with a tokenizer and no tensors."""
    return GGUFFile(gf.write(path, "llama", lambda w: gf.add_tokenizer(w, fields, **tokenizer), []))


@pytest.mark.parametrize("pre", list(PRES))
def test_each_pre_tokenizer_encodes_as_the_original(pre: str, tmp_path: Path, merged_across: Tokenizer) -> None:
    spec = json.loads(merged_across.to_str())
    spec["model"]["ignore_merges"] = pre == "llama-bpe"  # as Llama 3's tokenizer.json has it
    original = Tokenizer.from_str(json.dumps(spec))
    original.pre_tokenizer = byte_level(PRES[pre])
    fields = gf.tokenizer_fields(merged_across)
    fields["types"][merged_across.token_to_id("<think>")] = 4  # USER_DEFINED, as the converter marks it
    eos = merged_across.token_to_id("<|im_end|>")
    rebuilt = rebuild(tokenizer_only(tmp_path / "t.gguf", fields, pre=pre, eos=eos, bos=1))
    assert rebuilt.specials.add_bos == (pre == "llama-bpe")  # llama.cpp's default where the file does not say
    for text in [*TEXTS, "a<think>b"]:
        ids = original.encode(text, add_special_tokens=False).ids
        assert rebuilt.tokenizer.encode(text) == ids, (pre, text)
        assert rebuilt.tokenizer.decode(ids) == text
    assert rebuilt.tokenizer.vocab_size == merged_across.get_vocab_size(with_added_tokens=True)
    assert rebuilt.specials.eos_ids == (eos,) and rebuilt.tokenizer.eot_id == eos
    assert set(rebuilt.tokenizer.special_tokens) == {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}


def test_the_pre_tokenizers_differ_on_these_texts(merged_across: Tokenizer) -> None:
    """The test above has teeth: each pre-tokenizer splits the sample texts into other ids."""
    encodings = set()
    for split in PRES.values():
        tok = Tokenizer.from_str(merged_across.to_str())
        tok.pre_tokenizer = byte_level(split)
        encodings.add(tuple(tuple(tok.encode(t, add_special_tokens=False).ids) for t in TEXTS))
    assert len(encodings) == len(PRES)


def sentencepiece_style(corpus_file: Path) -> Tokenizer:
    """Llama 2's kind: BPE with byte fallback over Metaspace pieces, <unk> <s> </s> then 256 byte tokens first,
    configured as transformers' LlamaTokenizer is."""
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace()
    trained.train([str(corpus_file)], trainers.BpeTrainer(vocab_size=400, show_progress=False))
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate([*specials, *(f"<0x{b:02X}>" for b in range(256))])}
    for token, _ in sorted(trained.get_vocab().items(), key=lambda kv: kv[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m) for m in json.loads(trained.to_str())["model"]["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


@pytest.mark.parametrize("with_merges", [True, False], ids=["merges", "scores-only"])
def test_sentencepiece_byte_fallback(with_merges: bool, tmp_path: Path, corpus_file: Path) -> None:
    """tokenizer.ggml.model "llama": pieces, byte tokens and special tokens at their ids; merges from the file or,
    as SentencePiece files carry none, from the scores (here the trainer's merge order, the first merged scored
    highest); bos added as the file's add_bos_token (absent: added, as llama.cpp does)."""
    original = sentencepiece_style(corpus_file)
    fields = gf.tokenizer_fields(original)
    fields["types"][0] = gf.UNKNOWN
    if not with_merges:
        fields["merges"] = []
    scores = [-float(i) for i in range(len(fields["tokens"]))]
    f = tokenizer_only(tmp_path / "sp.gguf", fields, model="llama", pre=None, bos=1, eos=2, unk=0, scores=scores)
    rebuilt = rebuild(f)
    for text in ("ka to ri", "日本 🙂 ñ", "line\nbreak", "  two leading spaces", "<s>after"):
        ids = original.encode(text, add_special_tokens=False).ids
        assert rebuilt.tokenizer.encode(text) == ids, text
        assert rebuilt.tokenizer.decode(ids) == original.decode(ids, skip_special_tokens=False)
    assert (rebuilt.specials.bos_id, rebuilt.specials.add_bos) == (1, True)
    assert rebuilt.config["add_bos_token"] is True and rebuilt.config["unk_token"] == "<unk>"
