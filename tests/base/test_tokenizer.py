"""The byte-level BPE: exact vocabulary, lossless round trip, files other libraries load."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptport import tokenizer as bpe
from gptport.corpus import CorpusReader, resolve_sources
from gptport.errors import ArtifactError, InputError, UsageError

HARD_STRINGS = [
    "",
    " ",
    "   leading and trailing   ",
    "\t\t\n\n \r\n",
    "line one\r\nline two\r\n",
    "nul \x00 inside\x00",
    "emoji 🙂 and a family 👨‍👩‍👧‍👦 (ZWJ) and a flag 🇫🇷",
    "CJK 日本語のテキスト 中文 한국어",
    "combining: e\u0301 a\u0308 n\u0303, Zalgo: z\u0351\u0352\u0353",
    "RTL: שלום עולם and مرحبا بالعالم",
    "zero width: a\u200bb\u200cc\u200dd\ufeff",
    "<|endoftext|> in the middle <|endoftext|>",
    "\U0010fffd private use and \uffff noncharacter",
]


def test_vocabulary_has_exactly_n_entries_with_the_byte_alphabet(tok: bpe.BPETokenizer,
                                                                   tokenizer_dir: Path) -> None:
    assert tok.vocab_size == 512
    assert tok.special_tokens == {bpe.EOT: tok.eot_id}
    alphabet = bpe.pre_tokenizers.ByteLevel.alphabet()
    assert len(alphabet) == 256
    assert set(alphabet) <= set(tok.backend.get_vocab())
    merges = [m for m in (tokenizer_dir / "merges.txt").read_text().splitlines()
              if m and not m.startswith("#")]
    assert len(merges) == 512 - 256 - 1  # every other entry is a merge


@pytest.mark.parametrize("text", HARD_STRINGS)
def test_round_trip_of_hard_strings(tok: bpe.BPETokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_round_trip_of_any_unicode_string(tok: bpe.BPETokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


def test_encode_batch_matches_encode(tok: bpe.BPETokenizer) -> None:
    assert tok.encode_batch(HARD_STRINGS) == [tok.encode(t) for t in HARD_STRINGS]


def test_model_dir_files_and_sha256(tokenizer_dir: Path, tok: bpe.BPETokenizer) -> None:
    names = {p.name for p in tokenizer_dir.iterdir()}
    assert {"tokenizer.json", "vocab.json", "merges.txt", "tokenizer_meta.json", "tokenizer_config.json"} <= names
    assert not [n for n in names if n.startswith(".")], "temporary files left behind"
    meta = json.loads((tokenizer_dir / "tokenizer_meta.json").read_text())
    assert meta["sha256"] == hashlib.sha256((tokenizer_dir / "tokenizer.json").read_bytes()).hexdigest()
    assert meta["sha256"] == tok.sha256
    assert len(json.loads((tokenizer_dir / "vocab.json").read_text())) == 512


def test_loads_in_tokenizers_and_transformers_with_identical_ids(tokenizer_dir: Path,
                                                                  tok: bpe.BPETokenizer) -> None:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    hf_tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    fast = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_dir / "tokenizer.json"))
    for text in HARD_STRINGS[1:]:
        ids = tok.encode(text)
        assert hf_tok.encode(text).ids == ids
        assert fast(text, add_special_tokens=False)["input_ids"] == ids


def test_gpt2_two_file_format_gives_the_same_ids(tokenizer_dir: Path, tok: bpe.BPETokenizer) -> None:
    from tokenizers import Tokenizer, models

    two_file = bpe.new_backend()
    two_file.model = models.BPE.from_file(str(tokenizer_dir / "vocab.json"),
                                          str(tokenizer_dir / "merges.txt"))
    assert isinstance(two_file, Tokenizer)
    text = "a sentence with ünïcode and 日本 🙂"
    assert two_file.encode(text).ids == tok.encode(text)


def test_extra_special_tokens_are_single_ids(corpus_file: Path, tmp_path: Path) -> None:
    tok, _ = bpe.train(CorpusReader(resolve_sources([corpus_file])), 300, special_tokens=["<|pad|>"])
    assert tok.vocab_size == 300
    assert set(tok.special_tokens) == {bpe.EOT, "<|pad|>"}
    ids = tok.encode("x<|pad|>y")
    assert tok.special_tokens["<|pad|>"] in ids


def test_heldout_compression_is_reported(corpus_file: Path) -> None:
    """The held-out figure, recomputed here from the corpus: the chunks held out are the 50th, 150th, ... of
    the reader's chunks; their UTF-8 bytes over the trained tokenizer's token count of their text is the
    reported bytes per token, exactly; and the tokenizer is the one trained on the other chunks alone."""
    tok, report = bpe.train(CorpusReader(resolve_sources([corpus_file]), chunk_bytes=1024), 400)
    chunks = list(CorpusReader(resolve_sources([corpus_file]), chunk_bytes=1024).chunks())
    assert "".join(chunks) == corpus_file.read_text(encoding="utf-8") and len(chunks) >= 100
    held = [c for n, c in enumerate(chunks, 1) if n % 100 == 50]
    text = "".join(held)
    assert len(text.encode("utf-8")) > len(text)  # the held-out text has non-ASCII: bytes are not characters
    assert report.heldout_bytes == len(text.encode("utf-8"))
    assert report.heldout_tokens == len(tok.encode(text))
    assert report.bytes_per_token == report.heldout_bytes / report.heldout_tokens
    assert report.corpus_bytes == corpus_file.stat().st_size
    trained_without = bpe.new_backend()  # held out of training, not only measured
    trained_without.train_from_iterator(iter([c for n, c in enumerate(chunks, 1) if n % 100 != 50]),
                                        trainer=bpe.make_trainer(400, [bpe.EOT], 2, False))
    assert trained_without.to_str() == tok.backend.to_str()


def test_vocab_size_bounds(corpus_file: Path) -> None:
    reader = CorpusReader(resolve_sources([corpus_file]))
    with pytest.raises(UsageError, match="--vocab-size 256 is out of range"):
        bpe.train(reader, 256)
    with pytest.raises(UsageError, match="1,000,000"):
        bpe.train(reader, 1_000_001)


def test_corpus_too_small_for_the_vocabulary(tmp_path: Path) -> None:
    path = tmp_path / "tiny.txt"
    path.write_text("ab ab ab\n")
    with pytest.raises(InputError, match="corpus too small for --vocab-size 5000"):
        bpe.train(CorpusReader(resolve_sources([path])), 5000)


def test_save_refuses_an_existing_tokenizer_unless_forced(tok: bpe.BPETokenizer, tmp_path: Path) -> None:
    bpe.save(tok, tmp_path)
    with pytest.raises(InputError, match="already holds tokenizer.json"):
        bpe.save(tok, tmp_path)
    bpe.save(tok, tmp_path, force=True)
    assert bpe.load(tmp_path).sha256 == tok.sha256


def test_load_refuses_a_changed_tokenizer_file(tok: bpe.BPETokenizer, tmp_path: Path) -> None:
    bpe.save(tok, tmp_path)
    path = tmp_path / "tokenizer.json"
    path.write_text(path.read_text() + "\n")
    with pytest.raises(ArtifactError, match="does not match tokenizer_meta.json"):
        bpe.load(tmp_path)
    with pytest.raises(ArtifactError, match="no tokenizer.json"):
        bpe.load(tmp_path / "nowhere")


def test_check_trained_with(tok: bpe.BPETokenizer, tmp_path: Path) -> None:
    """The one check that a model's tokenizer is the one it was trained with (config.json's record)."""
    bpe.check_trained_with(tok, tmp_path, tok.sha256, tok.vocab_size)
    bpe.check_trained_with(tok, tmp_path, tok.sha256)  # a config without the model's vocab_size
    with pytest.raises(ArtifactError, match="does not match the model: it is not the tokenizer this model was"):
        bpe.check_trained_with(tok, tmp_path, "0" * 64, tok.vocab_size)
    with pytest.raises(ArtifactError, match=f"model vocab_size {tok.vocab_size + 1} != the tokenizer's"):
        bpe.check_trained_with(tok, tmp_path, tok.sha256, tok.vocab_size + 1)
