"""Tokenizers as transformers models ship them, built locally with `tokenizers` from the test corpus: a
byte-level BPE with begin/end tokens (Llama 3's kind; ChatML's turn tokens for Qwen's) and a SentencePiece-style
BPE with byte fallback over Metaspace pieces (Llama 2's and Mistral's kind), in either of its decoders: Metaspace
(transformers' current conversion) or the legacy Replace + ByteFallback + Fuse + Strip sequence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SP_SPECIALS = ["<unk>", "<s>", "</s>"]


def byte_level(tokenizer_json: Path, specials: list[str], bos: str | None) -> Any:
    """gptport's byte-level BPE (tokenizer.json) with `specials` added and, when `bos` is given, a
    post-processor that puts it first (as Llama 3's does)."""
    from tokenizers import AddedToken, Tokenizer, processors

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def metaspace(corpus: Path, vocab_size: int = 400, legacy: bool = False) -> Any:
    """A BPE with byte fallback over Metaspace pieces trained on `corpus`: <unk>, <s>, </s>, the 256 byte
    tokens <0x00>..<0xFF>, then the merges; <s> put first by its post-processor. `legacy`: Llama 2's first
    tokenizer.json (a Prepend/Replace normalizer, a Strip decoder) instead of the Metaspace pair."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace()
    trained.train([str(corpus)], trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False))
    vocab = {t: i for i, t in enumerate([*SP_SPECIALS, *(f"<0x{b:02X}>" for b in range(256))])}
    for token, _ in sorted(trained.get_vocab().items(), key=lambda kv: kv[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m) for m in json.loads(trained.to_str())["model"]["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if legacy:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SP_SPECIALS])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok
