"""The tokenizer of a GGUF file rebuilt as a tokenizer.json that `tokenizers` (and so gptport and transformers)
reads, from its vocabulary, merges, token types, pre-tokenizer and special tokens (llama.cpp's tokenizer.ggml.*
keys), as transformers' GGUF converter rebuilds it (integrations/gguf/gguf_tokenizer_mapping.py):

- tokenizer.ggml.model "gpt2": byte-level BPE over the file's merges, split first by the regex its
  tokenizer.ggml.pre names (PRE below; a name gptport does not know is refused rather than guessed), the Llama 3
  group with llama.cpp's ignore_merges and its bos added unless the file says otherwise;
- "llama" (SentencePiece): BPE with byte fallback over Metaspace pieces, merges from the file or, when it has
  none, from the pieces' scores (the best-scored piece merges first, as SentencePiece's BPE does). Gemma's
  files too: their runs of spaces, tabs and line breaks are user-defined tokens, matched whole in the text,
  leftmost and longest first, as llama.cpp matches them (transformers' GGUF loader instead merges spaces
  pairwise: it differs from llama.cpp on runs of more than 31 spaces).

Every token keeps its id: each is an entry of the BPE vocabulary, and control tokens (and user-defined ones) are
added tokens too, matched whole in text. Also tokenizer_config.json (bos, eos, add_bos_token and the chat
template, which `gptport serve` renders) and the special ids the model's config takes. No torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gptport import tokenizer as bpe
from gptport.errors import ArtifactError, InputError
from gptport.export.gguf_file import GGUFFile
from gptport.export.hf_files import Specials

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp's token types
MODELS = ("gpt2", "llama")  # tokenizer.ggml.model values gptport rebuilds
# The end-of-turn token llama.cpp finds by its text where a file names no eot_token_id (llama-vocab.cpp's
# "auto-detect special tokens by text"): Gemma's, whose files name only <eos>; llama.cpp ends generation on both
EOT_TEXTS = ("<end_of_turn>",)
SPACE = "\u2581"  # SentencePiece's "▁"

GPT2 = "gpt2"  # ByteLevel's own regex, GPT-2's
DIGITS = "digits"  # each digit apart, then GPT-2's regex (SmolLM's and StarCoder's tokenizer.json)
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")
_CASED = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_SUFFIX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_CASED}*{_LOWER}+{_SUFFIX}|[^\r\n\p{{L}}\p{{N}}]?{_CASED}+{_LOWER}*{_SUFFIX}"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_CASED}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_CASED}+{_LOWER}*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE: dict[str, str] = {  # tokenizer.ggml.pre -> how its text is split before BPE
    **dict.fromkeys(("gpt-2", "gpt2", "default", "mpt", "olmo", "jais", "trillion", "exaone4"), GPT2),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"), DIGITS),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "dbrx", "smaug-bpe"), LLAMA3),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"), QWEN2),
    **dict.fromkeys(("gpt-4o", "llama4", "minimax-m2"), GPT4O),
    "tekken": TEKKEN,
}
# llama.cpp's Llama 3 group and tekken: a word found whole in the vocabulary is taken as it is (ignore_merges, as
# Llama 3's tokenizer.json says too), and bos is added unless the file says otherwise (its add_bos default)
LLAMA3_LIKE = (*(k for k, v in PRE.items() if v == LLAMA3 and k not in ("dbrx", "smaug-bpe")), "tekken")


@dataclass(frozen=True)
class Rebuilt:
    """The tokenizer, its special ids for ModelConfig, and tokenizer_config.json's object."""

    tokenizer: bpe.BPETokenizer
    specials: Specials
    config: dict[str, Any]
    chat_template: str | None


def _ids(f: GGUFFile, tokens: list[str], types: list[int]) -> dict[str, int | None]:
    """The special ids the file names (None where it names none), each checked to be a token; the end-of-turn
    token found by its text (EOT_TEXTS) where the file names none, as llama.cpp finds it."""
    n = len(tokens)
    out: dict[str, int | None] = {}
    for name in ("bos", "eos", "eot", "eom", "unknown", "padding"):
        key = f"tokenizer.ggml.{name}_token_id"
        value = f.integer(key) if f.has(key) else None
        if value is not None and not 0 <= value < n:
            raise ArtifactError(f"{f.path}: {key} {value} is not a token id (the vocabulary has {n})")
        out[name] = value
    if out["eot"] is None:
        out["eot"] = next((i for i, t in enumerate(tokens) if t in EOT_TEXTS and types[i] == CONTROL), None)
    return out


def _merges(f: GGUFFile, tokens: list[str], types: list[int]) -> list[tuple[str, str]]:
    """The file's merges as pairs; a SentencePiece file without merges gets them from its pieces' scores: every
    split of a piece into two pieces of the vocabulary, the best-scored result first."""
    key = "tokenizer.ggml.merges"
    merges = f.strings(key)
    if merges is not None:
        pairs = [tuple(m.split(" ")) for m in merges]
        bad = next((m for m, p in zip(merges, pairs, strict=True) if len(p) != 2), None)
        if bad is not None:
            raise ArtifactError(f"{f.path}: merge {bad!r} in {key} is not two tokens")
        return pairs  # type: ignore[return-value]
    scores = f.value("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise ArtifactError(f"{f.path}: neither {key} nor one tokenizer.ggml.scores per token")
    vocab = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, BYTE, UNUSED)}
    found = []
    for piece, i in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                found.append((-float(scores[i]), vocab[left], vocab[right], left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def _backend(f: GGUFFile, model: str, tokens: list[str], types: list[int], ids: dict[str, int | None]) -> Any:
    """The `tokenizers` Tokenizer of the file's vocabulary."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if token in vocab:
            raise ArtifactError(f"{f.path}: token {token!r} is both id {vocab[token]} and id {i}")
        vocab[token] = i
    pre = f.text("tokenizer.ggml.pre", "default") or "default"
    try:
        if model == "gpt2":
            if pre not in PRE:
                raise InputError(f"{f.path}: tokenizer.ggml.pre {pre!r} is a pre-tokenizer gptport does not know "
                                 f"(it knows {', '.join(sorted(PRE))})")
            tok = Tokenizer(models.BPE(vocab, _merges(f, tokens, types), ignore_merges=pre in LLAMA3_LIKE))
            split = PRE[pre]
            byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split in (GPT2, DIGITS))
            tok.pre_tokenizer = (byte_level if split == GPT2 else
                                 pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                                 if split == DIGITS else
                                 pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                          byte_level]))
            tok.decoder = decoders.ByteLevel()
        else:
            unk = ids["unknown"]
            tok = Tokenizer(models.BPE(vocab, _merges(f, tokens, types), unk_token=None if unk is None else tokens[unk],
                                       byte_fallback=True, fuse_unk=True))
            prefix = f.value("tokenizer.ggml.add_space_prefix", True) is not False
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first" if prefix
                                                         else "never", split=False)
            steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
            tok.decoder = decoders.Sequence([*steps, *([decoders.Strip(" ", 1, 0)] if prefix else [])])
    except Exception as e:  # tokenizers raises plain Exceptions on a vocabulary or merges it cannot take
        if isinstance(e, InputError):
            raise
        raise ArtifactError(f"{f.path}: its vocabulary and merges do not make a BPE tokenizer ({e})") from None
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t in (CONTROL, UNKNOWN)])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                    for i, t in enumerate(types) if t == USER_DEFINED])
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise ArtifactError(f"{f.path}: the rebuilt tokenizer has {tok.get_vocab_size(with_added_tokens=True)} "
                            f"tokens, not the file's {len(tokens)}")
    return tok


def rebuild(f: GGUFFile) -> Rebuilt:
    """The file's tokenizer as a gptport tokenizer (tokenizer.json rebuilt), its special ids and
    tokenizer_config.json; a tokenizer model other than MODELS is refused naming it."""
    model = f.text("tokenizer.ggml.model")
    if model is None:
        raise InputError(f"{f.path}: no tokenizer (tokenizer.ggml.model)")
    if model not in MODELS:
        raise InputError(f"{f.path}: tokenizer.ggml.model {model!r} is a tokenizer gptport cannot rebuild (it "
                         f"rebuilds {' and '.join(MODELS)}: byte-level BPE and SentencePiece BPE)")
    tokens = f.strings("tokenizer.ggml.tokens")
    if not tokens:
        raise ArtifactError(f"{f.path}: no tokenizer.ggml.tokens")
    types = f.value("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if not isinstance(types, list) or len(types) != len(tokens):
        raise ArtifactError(f"{f.path}: tokenizer.ggml.token_type does not give one type per token")
    ids = _ids(f, tokens, types)
    from tokenizers import processors

    backend = _backend(f, model, tokens, types, ids)
    eos = ids["eos"]
    if eos is None:
        raise InputError(f"{f.path}: no end-of-sequence token (tokenizer.ggml.eos_token_id)")
    bos = ids["bos"]
    pre = f.text("tokenizer.ggml.pre", "default") if model == "gpt2" else None
    default_bos = model == "llama" or pre in LLAMA3_LIKE  # llama.cpp's, where the file does not say
    add_bos = bos is not None and f.value("tokenizer.ggml.add_bos_token", default_bos) is True
    if add_bos:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A {tokens[bos]} $B", special_tokens=[(tokens[bos], bos)])
    elif model == "gpt2":
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    eos_ids = tuple(sorted({i for i in (eos, ids["eot"], ids["eom"]) if i is not None}))
    template = f.text("tokenizer.chat_template")
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
        "add_bos_token": add_bos, "add_eos_token": False,
        **{f"{name}_token": tokens[i] for name, i in (("bos", bos), ("eos", eos), ("unk", ids["unknown"]),
                                                        ("pad", ids["padding"])) if i is not None},
        **({"chat_template": template} if template else {}),
    }
    tok = bpe.BPETokenizer(backend, backend.to_str(pretty=True), eos)
    return Rebuilt(tok, Specials(bos, add_bos, eos_ids, eos), config, template or None)
