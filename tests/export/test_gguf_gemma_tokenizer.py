"""import-gguf's tokenizer of a Gemma 3 file, on a small vocabulary built as Gemma's files hold theirs: a
SentencePiece "llama" model without merges (each piece's score minus its place), no space prefix, control tokens
(<pad> <eos> <bos> <unk> <mask> <start_of_turn> <end_of_turn>), runs of spaces, tabs and line breaks as
user-defined tokens spelled with real spaces, 256 byte tokens. The rebuilt tokenizer gives the ids of llama.cpp's
tokenizer (written out below from llama-vocab.cpp: special tokens partitioned out longest first, then its
SentencePiece merging by score) on text with runs longer than any token, bytes outside the vocabulary and chat
turns; it ends on <end_of_turn> as llama.cpp does; the chat template renders as transformers renders it from the
same file. The real file's test is test_gguf_gemma3.py (slow)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from gptport import tokenizer as bpe
from gptport.export.gguf_file import GGUFFile
from gptport.export.gguf_tokenizer import rebuild
from gptport.paths import CHAT_TEMPLATE
from gptport.serve.api.chat_template import renderer
from tests.support import gguf_files as gf

CONTROL, USER_DEFINED, UNKNOWN, BYTE, NORMAL = 3, 4, 2, 6, 1
SPACE = "\u2581"
SPECIALS = [("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", CONTROL), ("<mask>", CONTROL),
            ("[multimodal]", USER_DEFINED), ("<start_of_turn>", CONTROL), ("<end_of_turn>", CONTROL),
            *((n * "\n", USER_DEFINED) for n in range(1, 4)), *((n * " ", USER_DEFINED) for n in range(2, 6)),
            *((n * "\t", USER_DEFINED) for n in range(1, 3))]
EOS, BOS, END_OF_TURN = 1, 2, 7
TEXTS = ["the straß café and solex men, qua ny ring 日本語 наш!", "Hello world",
         "a  b   c    d     e" + " " * 13 + "f", "x\n\n\n\n\n\ny\n", "\t\t\tcode();",
         "<start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\n", "日本語 🙂 naïve café",
         " leading and trailing ", f"a literal {SPACE} mark", "<bos>[multimodal]<mask>x<eos>", ""]
# Gemma 3's chat template as its instruction-tuned files carry it: bos first, a system message folded into the
# first user turn, "model" for the assistant, contents trimmed, roles checked to alternate
TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}")


def gemma_vocab(corpus_file: Path) -> tuple[list[str], list[int], list[float]]:
    """Tokens, token types and scores in the order of Gemma's files: specials, byte tokens, then the pieces of a
    SentencePiece-style BPE (spaces as "▁", none before the text) in the order it learnt them."""
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="never", split=False)
    text = corpus_file.read_text(encoding="utf-8")[:30000]
    trained.train_from_iterator([text], trainers.BpeTrainer(vocab_size=500, show_progress=False))
    tokens = [t for t, _ in SPECIALS] + [f"<0x{b:02X}>" for b in range(256)]
    types = [k for _, k in SPECIALS] + [BYTE] * 256
    scores = [-1000.0] * len(SPECIALS) + [0.0] * 256
    for piece, _ in sorted(trained.get_vocab().items(), key=lambda kv: kv[1]):
        if piece not in tokens:
            tokens.append(piece)
            types.append(NORMAL)
            scores.append(-float(types.count(NORMAL) - 1))
    return tokens, types, scores


def llama_cpp_ids(text: str, tokens: list[str], types: list[int], scores: list[float]) -> list[int]:
    """llama.cpp's ids of `text` for a "llama" vocabulary without a space prefix (llama-vocab.cpp): control,
    user-defined and unknown tokens cut out of the text longest first, then each remaining piece with spaces as
    "▁", its characters merged pairwise, the best-scored token first (the leftmost of equals), a character
    outside the vocabulary as its UTF-8 bytes' tokens."""
    vocab = {t: i for i, t in enumerate(tokens)}
    parts: list[str | int] = [text]
    for sid in sorted((i for i, k in enumerate(types) if k in (CONTROL, USER_DEFINED, UNKNOWN)),
                      key=lambda i: -len(tokens[i])):
        out: list[str | int] = []
        for part in parts:
            if isinstance(part, int):
                out.append(part)
                continue
            pieces = part.split(tokens[sid])
            for j, piece in enumerate(pieces):
                out += ([sid] if j else []) + ([piece] if piece else [])
        parts = out
    ids: list[int] = []
    for part in parts:
        if isinstance(part, int):
            ids.append(part)
            continue
        symbols = list(part.replace(" ", SPACE))
        while True:
            best = max(((scores[vocab[a + b]], -i) for i, (a, b) in enumerate(zip(symbols, symbols[1:], strict=False))
                        if a + b in vocab), default=None)
            if best is None:
                break
            i = -best[1]
            symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
        for s in symbols:
            ids += [vocab[s]] if s in vocab else [vocab[f"<0x{b:02X}>"] for b in s.encode("utf-8")]
    return ids


def write_gemma(path: Path, corpus_file: Path, template: str | None = None) -> Path:
    """A GGUF file of architecture gemma3 with the small vocabulary and Gemma's tokenizer keys, no tensors."""
    tokens, types, scores = gemma_vocab(corpus_file)

    def meta(w: gguf.GGUFWriter) -> None:
        gf.add_tokenizer(w, {"tokens": tokens, "types": types}, model="llama", pre="default", bos=BOS, eos=EOS,
                         add_bos=True, template=template, scores=scores, unk=3)
        w.add_pad_token_id(0)
        w.add_add_space_prefix(False)

    return gf.write(path, "gemma3", meta, [])


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory: pytest.TempPathFactory, corpus_file: Path) -> Path:
    return write_gemma(tmp_path_factory.mktemp("gemma") / "g.gguf", corpus_file, TEMPLATE)


def test_ids_are_llama_cpps(gemma_file: Path, corpus_file: Path) -> None:
    tokens, types, scores = gemma_vocab(corpus_file)
    rebuilt = rebuild(GGUFFile(gemma_file))
    for text in TEXTS:
        want = llama_cpp_ids(text, tokens, types, scores)
        assert rebuilt.tokenizer.encode(text) == want, text
        assert rebuilt.tokenizer.decode(want) == text.replace(SPACE, " ")  # SentencePiece's "▁" is a space
    assert rebuilt.tokenizer.encode(" " * 13) == [tokens.index(" " * 5)] * 2 + [tokens.index(" " * 3)]
    assert len(rebuilt.tokenizer.encode(TEXTS[0])) < len(TEXTS[0]) / 2  # pieces merged, not characters left


def test_the_reference_merges_by_score(corpus_file: Path) -> None:
    """The test above has teeth: scoring the pieces the other way round gives other ids."""
    tokens, types, scores = gemma_vocab(corpus_file)
    backwards = [s if k != NORMAL else -1e6 - s for s, k in zip(scores, types, strict=True)]
    text = TEXTS[0]
    assert llama_cpp_ids(text, tokens, types, scores) != llama_cpp_ids(text, tokens, types, backwards)


def test_specials_and_end_ids(gemma_file: Path) -> None:
    """bos added, <eos> and <end_of_turn> both end generation (llama.cpp finds <end_of_turn> by its text)."""
    rebuilt = rebuild(GGUFFile(gemma_file))
    assert (rebuilt.specials.bos_id, rebuilt.specials.add_bos) == (BOS, True)
    assert rebuilt.specials.eos_ids == (EOS, END_OF_TURN) and rebuilt.tokenizer.eot_id == EOS
    assert {"<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>"} <= set(rebuilt.tokenizer.special_tokens)
    assert rebuilt.config["bos_token"] == "<bos>" and rebuilt.config["add_bos_token"] is True


def test_a_named_eot_is_kept_and_a_plain_end_of_turn_is_not_one(tmp_path: Path, corpus_file: Path) -> None:
    tokens, types, scores = gemma_vocab(corpus_file)
    named = tmp_path / "named.gguf"
    gf.write(named, "gemma3", lambda w: gf.add_tokenizer(w, {"tokens": tokens, "types": types}, model="llama",
                                                         pre=None, bos=BOS, eos=EOS, eot=4, scores=scores), [])
    assert rebuild(GGUFFile(named)).specials.eos_ids == (EOS, 4)
    plain = tmp_path / "plain.gguf"
    types = [NORMAL if t == "<end_of_turn>" else k for t, k in zip(tokens, types, strict=True)]
    gf.write(plain, "gemma3", lambda w: gf.add_tokenizer(w, {"tokens": tokens, "types": types}, model="llama",
                                                         pre=None, bos=BOS, eos=EOS, scores=scores), [])
    assert rebuild(GGUFFile(plain)).specials.eos_ids == (EOS,)


def test_chat_template_renders_as_transformers(gemma_file: Path, tmp_path: Path) -> None:
    """gptport serve's rendering of the imported template, and transformers' from the same file; the ids of the
    rendered text equal transformers' (one <bos>: the template's)."""
    transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency")
    rebuilt = rebuild(GGUFFile(gemma_file))
    bpe.save(rebuilt.tokenizer, tmp_path, force=True)
    (tmp_path / bpe.HF_CONFIG_FILE).write_text(json.dumps(rebuilt.config), encoding="utf-8")
    assert rebuilt.chat_template == TEMPLATE
    (tmp_path / CHAT_TEMPLATE).write_text(rebuilt.chat_template, encoding="utf-8")
    render, _ = renderer(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(str(gemma_file.parent), gguf_file=gemma_file.name)
    chats: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": "Why is the sky blue?"}],
        [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": " hi "},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "And  the sea?"}]]
    for messages in chats:
        text, _ = render(messages)
        assert text == theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert text.startswith("<bos><start_of_turn>user\n") and text.endswith("<start_of_turn>model\n")
        assert rebuilt.tokenizer.encode(text) == theirs(text, add_special_tokens=False)["input_ids"]
        assert rebuilt.tokenizer.encode(text).count(BOS) == 1
