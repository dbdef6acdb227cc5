"""A model's tokenizer as GGUF's tokenizer.ggml.* keys, as llama.cpp's convert_hf_to_gguf.py writes them (the
inverse of gguf_tokenizer.py, which import-gguf rebuilds a tokenizer.json with):

- a byte-level BPE: tokenizer.ggml.model "gpt2", its merges, and tokenizer.ggml.pre naming how its text is split
  before BPE, read from tokenizer.json's pre-tokenizer (GPT-2's regex: "gpt-2"; each digit apart first:
  "smollm"; Llama 3's regex with ignore_merges: "llama-bpe"; Qwen2's: "qwen2"; GPT-4o's; tekken). A
  pre-tokenizer llama.cpp has no name for is refused, rather than written under a name that splits otherwise;
- a SentencePiece-style BPE with byte fallback over Metaspace pieces: tokenizer.ggml.model "llama", each
  token's score from its merge's rank (llama.cpp's SentencePiece tokenizer merges the best-scored pair first,
  so the earliest merge wins, as in BPE), <0xAB> pieces typed BYTE, the space prefix as the tokenizer adds it;
  the merges are written too, for transformers' GGUF loader and import-gguf.

Special ids: the begin token (the tokenizer's end-of-text where the model has none, as GPT-2's and ChatML
models' files have it) and whether prompts start with it; the model's end ids as eos, eot and eom; unknown and
padding from tokenizer_config.json. The chat template (chat_template.jinja, else tokenizer_config.json's) as
tokenizer.chat_template, its named ones as tokenizer.chat_template.NAME. No torch."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf

from gptport import tokenizer as bpe
from gptport.config import read_json
from gptport.errors import ArtifactError, InputError
from gptport.export.gguf_tokenizer import GPT4O, LLAMA3, LLAMA3_LIKE, QWEN2, SPACE, TEKKEN
from gptport.export.model_read import ModelFiles
from gptport.paths import CHAT_TEMPLATE, CHAT_TEMPLATES_DIR

SPLITS = {LLAMA3: ("llama-bpe", "smaug-bpe"), QWEN2: ("qwen2", "qwen2"), GPT4O: ("gpt-4o", "gpt-4o"),
          TEKKEN: ("tekken", "tekken")}  # a Split regex -> its name with ignore_merges, without
BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")
T = gguf.TokenType


@dataclass(frozen=True)
class Vocab:
    """The tokenizer as GGUF holds it."""

    model: str  # tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece-style)
    pre: str
    tokens: list[str]
    types: list[int]
    merges: list[str]
    scores: list[float] | None = None  # "llama" only
    add_space_prefix: bool = False  # the SentencePiece-style "▁" before the text (never for byte-level BPE)
    ids: dict[str, int] = field(default_factory=dict)  # bos, eos, eot, eom, unk, pad
    add_bos: bool = False
    templates: dict[str, str] = field(default_factory=dict)  # "default" and named ones


def _step(spec: Any, kind: str, **want: Any) -> bool:
    return isinstance(spec, dict) and spec.get("type") == kind and all(spec.get(k, v) == v for k, v in want.items())


def pre_name(spec: dict[str, Any], path: Path) -> str:
    """tokenizer.ggml.pre of a byte-level BPE's tokenizer.json, or InputError naming its pre-tokenizer."""
    pre, ignore = spec.get("pre_tokenizer") or {}, bool((spec.get("model") or {}).get("ignore_merges", False))
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    name = None
    if len(steps) == 1 and _step(steps[0], "ByteLevel", use_regex=True, add_prefix_space=False):
        name = "gpt-2"
    elif len(steps) == 2 and _step(steps[1], "ByteLevel", use_regex=True, add_prefix_space=False) \
            and _step(steps[0], "Digits", individual_digits=True):
        name = "smollm"
    elif len(steps) == 2 and _step(steps[1], "ByteLevel", use_regex=False, add_prefix_space=False) \
            and _step(steps[0], "Split", behavior="Isolated", invert=False):
        regex = (steps[0].get("pattern") or {}).get("Regex")
        name = SPLITS[regex][0 if ignore else 1] if regex in SPLITS else None
    if name is None:
        raise InputError(f"{path}: pre-tokenizer {json.dumps(pre)[:160]} is not one llama.cpp names (GPT-2's, "
                         "SmolLM's digits, Llama 3's, Qwen2's, GPT-4o's or tekken's split before byte-level BPE)")
    if (name in LLAMA3_LIKE) != ignore:
        raise InputError(f"{path}: ignore_merges is {str(ignore).lower()}, but llama.cpp's {name!r} pre-tokenizer "
                         f"{'ignores' if name in LLAMA3_LIKE else 'applies'} merges to whole words in the vocabulary")
    normalizer = spec.get("normalizer")
    if normalizer is not None and not _step(normalizer, "NFC"):
        raise InputError(f"{path}: normalizer {json.dumps(normalizer)[:120]} is not one llama.cpp applies")
    return name


def _space_prefix(spec: dict[str, Any], path: Path) -> bool:
    """Whether a SentencePiece-style tokenizer puts "▁" before the text (Metaspace, or Llama 2's normalizer)."""
    pre, norm = spec.get("pre_tokenizer"), spec.get("normalizer")
    if _step(pre, "Metaspace", replacement=SPACE) and norm is None:
        return pre.get("prepend_scheme", "always") != "never"
    steps = (norm or {}).get("normalizers", [norm]) if _step(norm, "Sequence") else [norm]
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
    if pre is None and steps[-1] == replace and all(_step(s, "Prepend", prepend=SPACE) for s in steps[:-1]):
        return len(steps) == 2
    raise InputError(f"{path}: a BPE with byte fallback, but not over Metaspace pieces (pre-tokenizer "
                     f"{json.dumps(pre)[:80]}, normalizer {json.dumps(norm)[:80]}), which llama.cpp's tokenizer "
                     "\"llama\" splits")


def _scores(tokens: list[str], merges: list[str]) -> list[float]:
    """Each token's score: minus the rank of the first merge that makes it; 0 for the others."""
    rank: dict[str, int] = {}
    for i, merge in enumerate(merges):
        rank.setdefault(merge.replace(" ", ""), i)
    return [-float(rank[t]) if t in rank else 0.0 for t in tokens]


def _end_ids(eos_ids: tuple[int, ...], eot_id: int, path: Path) -> dict[str, int]:
    """The model's end ids as GGUF's eos, eot and eom (llama.cpp ends generation on any of them)."""
    ends = list(eos_ids) or [eot_id]
    first = eot_id if eot_id in ends else ends[0]
    rest = [i for i in ends if i != first]
    if len(rest) > 2:
        raise InputError(f"{path}: the model ends on {len(ends)} tokens ({', '.join(map(str, ends))}); GGUF names "
                         "three at most (eos, eot, eom)")
    return {"eos": first, **dict(zip(("eot", "eom"), rest, strict=False))}


def _token(backend: Any, config: dict[str, Any], name: str) -> int | None:
    value = config.get(name)
    text = value.get("content") if isinstance(value, dict) else value
    tid = backend.token_to_id(text) if isinstance(text, str) else None
    return None if tid is None else int(tid)


def chat_templates(model_dir: Path, config: dict[str, Any]) -> dict[str, str]:
    """The default chat template and the named ones, as transformers reads them: chat_template.jinja and
    additional_chat_templates/NAME.jinja, else tokenizer_config.json's chat_template (a string or a list of
    {name, template})."""
    if (model_dir / CHAT_TEMPLATE).is_file():
        named = model_dir / CHAT_TEMPLATES_DIR
        out = {p.stem: p.read_text(encoding="utf-8") for p in sorted(named.glob("*.jinja"))} if named.is_dir() else {}
        return {**out, "default": (model_dir / CHAT_TEMPLATE).read_text(encoding="utf-8")}
    source = config.get("chat_template")
    if isinstance(source, list):
        return {t["name"]: t["template"] for t in source if isinstance(t, dict) and isinstance(t.get("name"), str)
                and isinstance(t.get("template"), str)}
    return {"default": source} if isinstance(source, str) and source else {}


def read_vocab(files: ModelFiles) -> Vocab:
    """The GGUF form of `files`' tokenizer, its special ids and chat templates (refused in one line naming what
    llama.cpp's tokenizers cannot take)."""
    tok, cfg, path = files.tok, files.cfg, files.path / bpe.TOKENIZER_FILE
    spec = json.loads(tok.json)
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise InputError(f"{path}: a {model.get('type')} tokenizer; GGUF's gpt2 and llama tokenizers are BPE")
    by_id = {i: t for t, i in tok.backend.get_vocab(with_added_tokens=True).items()}
    if sorted(by_id) != list(range(len(by_id))):
        raise ArtifactError(f"{path}: token ids are not 0..{len(by_id) - 1} without gaps")
    tokens = [by_id[i] for i in range(len(by_id))]
    added = tok.backend.get_added_tokens_decoder()
    special = {i for i, t in added.items() if t.special}
    config_path = files.path / bpe.HF_CONFIG_FILE
    config = read_json(config_path) if config_path.is_file() else {}
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    sentencepiece = bool(model.get("byte_fallback"))
    unk = _token(tok.backend, config, "unk_token")
    if sentencepiece:
        unk = tok.backend.token_to_id(model["unk_token"]) if isinstance(model.get("unk_token"), str) else unk
        prefix, pre, scores = _space_prefix(spec, path), "default", _scores(tokens, merges)
    else:
        prefix, pre, scores = False, pre_name(spec, path), None
    types = []
    for i, t in enumerate(tokens):
        kind = T.CONTROL if i in special else T.USER_DEFINED if i in added else T.NORMAL
        if sentencepiece and i == unk:
            kind = T.UNKNOWN
        elif sentencepiece and kind == T.NORMAL and BYTE_PIECE.fullmatch(t):
            kind = T.BYTE
        types.append(int(kind))
    ids = {"bos": tok.eot_id if cfg.bos_id is None else cfg.bos_id, **_end_ids(cfg.eos_ids, tok.eot_id, path)}
    pad = _token(tok.backend, config, "pad_token")
    ids.update({k: v for k, v in (("unk", unk), ("pad", pad)) if v is not None})
    return Vocab("llama" if sentencepiece else "gpt2", pre, tokens, types, merges, scores, prefix, ids,
                 cfg.add_bos, chat_templates(files.path, config))


def add_to(writer: gguf.GGUFWriter, vocab: Vocab) -> None:
    """tokenizer.ggml.* and tokenizer.chat_template* into `writer`."""
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    adders = {"bos": writer.add_bos_token_id, "eos": writer.add_eos_token_id, "eot": writer.add_eot_token_id,
              "eom": writer.add_eom_token_id, "unk": writer.add_unk_token_id, "pad": writer.add_pad_token_id}
    for name, value in vocab.ids.items():
        adders[name](value)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_space_prefix(vocab.add_space_prefix)
    if set(vocab.templates) == {"default"}:
        writer.add_chat_template(vocab.templates["default"])
    elif vocab.templates:
        writer.add_chat_template([{"name": k, "template": v} for k, v in vocab.templates.items()])
