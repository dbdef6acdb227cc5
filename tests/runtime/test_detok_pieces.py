"""TextStream over a SentencePiece-style tokenizer (byte fallback, Metaspace "▁" for spaces): streamed token
by token, the words keep their spaces and the text printed is the whole decode's, multi-byte characters made
of byte tokens included, in both of its decoders (Metaspace, and Llama 2's legacy Strip sequence); decoding
each token alone loses the spaces, which is what the stream must not do. A byte-level BPE's stream is its
tokens' decodings joined, as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from gptport.runtime.detok import TextStream
from gptport.tokenizer import BPETokenizer
from tests.support import hf_tokenizers

TEXTS = ["ka to ri men sol", "straß café 日本 🙂 end", "  two  spaces\nand a line", "ex pu ny the and ing"]


def streamed(tok: BPETokenizer, ids: list[int], stops: list[str] | None = None) -> tuple[list[str], str]:
    """What each push printed, and the whole printed text with finish()'s."""
    stream = TextStream(tok, stops or [])
    pieces = []
    for i in ids:
        pieces.append(stream.push(i))
        if stream.stopped:
            break
    return pieces, "".join(pieces) + stream.finish()


@pytest.fixture(scope="module", params=[False, True], ids=["metaspace", "legacy-strip"])
def sp(request: pytest.FixtureRequest, corpus_file: Path) -> BPETokenizer:
    backend = hf_tokenizers.metaspace(corpus_file, legacy=request.param)
    return BPETokenizer(backend, backend.to_str(), eot_id=2)


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_words_keep_their_spaces(sp: BPETokenizer, text: str) -> None:
    ids = sp.encode(text)
    assert not sp.joins
    whole = sp.decode(ids)
    assert whole.strip() == text.strip()  # the tokenizer itself round-trips (the first space aside)
    pieces, printed = streamed(sp, ids)
    assert printed == whole
    if " " in text.strip():
        assert "".join(sp.decode([i]) for i in ids) != whole  # tokens decoded alone lose the spaces


def test_pieces_arrive_as_their_tokens_do(sp: BPETokenizer) -> None:
    """Each word's text, its space first, comes with the push of its token (not held to the end)."""
    ids = sp.encode("ka to ri men sol")
    pieces, _ = streamed(sp, ids)
    printed, so_far = "", []
    for i, piece in zip(ids, pieces, strict=True):
        so_far.append(i)
        printed += piece
        assert printed == sp.decode(so_far)


def test_a_multibyte_character_of_byte_tokens_is_held_until_whole(sp: BPETokenizer) -> None:
    ids = sp.encode("a 😀 b")  # not in the corpus: four byte tokens
    assert sum(1 for i in ids if sp.backend.id_to_token(i).startswith("<0x")) >= 4
    pieces, printed = streamed(sp, ids)
    assert printed == sp.decode(ids) and all("\ufffd" not in p for p in pieces)


def test_stop_strings_across_pieces(sp: BPETokenizer) -> None:
    ids = sp.encode("ka to ri men sol")
    assert streamed(sp, ids, ["ri men"])[1] == "ka to "
    assert streamed(sp, ids, [" to"])[1] == "ka"


def test_a_byte_level_stream_is_its_tokens_joined(tok: BPETokenizer) -> None:
    assert tok.joins
    for text in TEXTS:
        ids = tok.encode(text)
        assert streamed(tok, ids)[1] == text == "".join(tok.decode([i]) for i in ids)
