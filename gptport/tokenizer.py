"""Byte-level BPE with the `tokenizers` library: train, load, encode, decode, save.

The 256 byte symbols are the initial alphabet, pre-tokenization is GPT-2's regex split, decoding is
byte-level, so `decode(encode(s)) == s` for every Unicode string. `<|endoftext|>` is always a special
token. A model directory holds `tokenizer.json` (HF format), the same BPE as GPT-2's `vocab.json` +
`merges.txt`, and `tokenizer_meta.json` with the sha256 of `tokenizer.json` that later stages check.

An imported model's tokenizer.json (import-hf) is any BPE `tokenizers` reads: byte-level (Llama 3, Qwen)
or SentencePiece-style with byte fallback and Metaspace (Llama 2, Mistral). Encoding and decoding go
through `tokenizers` either way; its end-of-text token is the one tokenizer_meta.json's eot_id names.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from gptport import __version__, paths
from gptport.config import read_json
from gptport.corpus import CorpusReader
from gptport.errors import ArtifactError, InputError, UsageError

EOT = "<|endoftext|>"
TOKENIZER_FILE = paths.TOKENIZER
META_FILE = paths.TOKENIZER_META
GPT2_FILES = (paths.GPT2_VOCAB, paths.GPT2_MERGES)
HF_CONFIG_FILE = paths.HF_TOKENIZER_CONFIG
MAX_VOCAB = 1_000_000
HELDOUT_EVERY = 100  # one chunk in a hundred is held out of training to measure compression
HELDOUT_MAX_CHARS = 4 << 20
HELDOUT_MIN_CHUNKS = 10  # below this many chunks, holding one out would starve training: report n/a


@dataclass(frozen=True)
class TrainReport:
    """What training saw and produced, for the summary the CLI prints."""

    vocab_size: int
    documents: int
    corpus_bytes: int
    replaced_bytes: int
    seconds: float
    heldout_bytes: int
    heldout_tokens: int

    @property
    def bytes_per_token(self) -> float | None:
        return self.heldout_bytes / self.heldout_tokens if self.heldout_tokens else None


class BPETokenizer:
    """A trained byte-level BPE tokenizer and the sha256 of its serialized form."""

    def __init__(self, tokenizer: Tokenizer, json_text: str | None = None, eot_id: int | None = None) -> None:
        """`eot_id`: the end-of-text token of an imported tokenizer (None: the id of <|endoftext|>)."""
        self.backend = tokenizer
        self.json = tokenizer.to_str(pretty=True) if json_text is None else json_text
        self.sha256 = hashlib.sha256(self.json.encode("utf-8")).hexdigest()
        eot = tokenizer.token_to_id(EOT) if eot_id is None else eot_id
        if eot is None:
            raise ArtifactError(f"tokenizer has no {EOT} token")
        if not 0 <= eot < self.vocab_size:
            raise ArtifactError(f"tokenizer: end-of-text id {eot} is outside its vocabulary of {self.vocab_size}")
        self.eot_id: int = eot

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @cached_property
    def joins(self) -> bool:
        """Whether any text decodes as its tokens' decodings joined: true for a byte-level decoder; not for a
        SentencePiece-style one (Metaspace, or Strip), which drops the space that starts what it decodes, so
        that a token's text depends on the tokens before it (runtime/detok.py decodes it after them)."""
        decoder = json.loads(self.json).get("decoder") or {}
        parts = decoder.get("decoders", [decoder]) if isinstance(decoder, dict) else []
        return bool(parts) and all(isinstance(d, dict) and d.get("type") == "ByteLevel" for d in parts)

    @property
    def special_tokens(self) -> dict[str, int]:
        """Special token text -> id."""
        return {t.content: i for i, t in self.backend.get_added_tokens_decoder().items() if t.special}

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token text in it maps to the special token."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, encoded in parallel on all cores (without offsets where tokenizers has
        encode_batch_fast: the same ids, sooner)."""
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        return [e.ids for e in encode(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`, special tokens included, so that decode(encode(s)) == s."""
        return self.backend.decode(list(ids), skip_special_tokens=False)


def new_backend() -> Tokenizer:
    """An untrained byte-level BPE pipeline, configured as GPT-2's."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def make_trainer(vocab_size: int, special_tokens: Sequence[str], min_frequency: int,
                 show_progress: bool) -> trainers.BpeTrainer:
    """The BPE trainer: 256 byte symbols as the alphabet, merges until `vocab_size` entries."""
    return trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )


def special_token_list(extra: Sequence[str] = ()) -> list[str]:
    """`<|endoftext|>` first, then the extra special tokens in order, without duplicates."""
    out = [EOT]
    for t in extra:
        if not t:
            raise UsageError("--special-token must not be empty")
        if t not in out:
            out.append(t)
    return out


def check_vocab_size(vocab_size: int, n_special: int) -> None:
    """Refuse a vocabulary that cannot hold the 256 byte symbols and the special tokens."""
    low = 256 + n_special
    if not low <= vocab_size <= MAX_VOCAB:
        raise UsageError(f"--vocab-size {vocab_size} is out of range: it must be between {low} "
                         f"(256 bytes + {n_special} special tokens) and {MAX_VOCAB:,}")


class _HeldOut:
    """Passes chunks through to training, keeping one in HELDOUT_EVERY aside (or, in a corpus too
    small for that, its last chunk if that is at most a tenth): text to measure compression on."""

    def __init__(self, chunks: Iterator[str]) -> None:
        self.chunks = chunks
        self.kept: list[str] = []

    def __iter__(self) -> Iterator[str]:
        pending: str | None = None
        kept_chars = 0
        n = 0
        for n, chunk in enumerate(self.chunks, 1):
            if n % HELDOUT_EVERY == HELDOUT_EVERY // 2 and kept_chars < HELDOUT_MAX_CHARS:
                self.kept.append(chunk)
                kept_chars += len(chunk)
                continue
            if pending is not None:
                yield pending
            pending = chunk
        if pending is not None:
            if not self.kept and n >= HELDOUT_MIN_CHUNKS:
                self.kept.append(pending)
            else:
                yield pending


def train(
    reader: CorpusReader,
    vocab_size: int,
    special_tokens: Sequence[str] = (),
    min_frequency: int = 2,
    show_progress: bool = False,
) -> tuple[BPETokenizer, TrainReport]:
    """Train a byte-level BPE of exactly `vocab_size` entries on the corpus streamed by `reader`."""
    specials = special_token_list(special_tokens)
    check_vocab_size(vocab_size, len(specials))
    if min_frequency < 1:
        raise UsageError(f"--min-frequency must be at least 1, not {min_frequency}")
    t0 = time.perf_counter()
    backend = new_backend()
    held = _HeldOut(reader.chunks())
    known = reader.known_bytes
    backend.train_from_iterator(
        iter(held),
        trainer=make_trainer(vocab_size, specials, min_frequency, show_progress),
        length=None if known is None else max(1, known // reader.chunk_bytes),
    )
    stats = reader.stats
    if stats.bytes == 0:
        raise InputError(f"empty corpus: no text in {', '.join(s.name for s in reader.sources)}")
    got = backend.get_vocab_size(with_added_tokens=True)
    if got != vocab_size:
        raise InputError(
            f"corpus too small for --vocab-size {vocab_size}: BPE ran out of pairs to merge at "
            f"{got} entries (with --min-frequency {min_frequency}); lower --vocab-size or add text")
    tok = BPETokenizer(backend)
    heldout_text = "".join(held.kept)
    heldout_tokens = len(tok.encode(heldout_text)) if heldout_text else 0
    report = TrainReport(
        vocab_size=got,
        documents=stats.documents,
        corpus_bytes=stats.bytes,
        replaced_bytes=stats.replaced_bytes,
        seconds=time.perf_counter() - t0,
        heldout_bytes=len(heldout_text.encode("utf-8")),
        heldout_tokens=heldout_tokens,
    )
    return tok, report


def has_tokenizer(model_dir: str | os.PathLike[str]) -> bool:
    return (Path(model_dir) / TOKENIZER_FILE).exists()


def check_can_write(model_dir: str | os.PathLike[str], force: bool) -> None:
    """Refuse a path that is not a directory, or one that holds a tokenizer already (unless force)."""
    out = Path(model_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory")
    if has_tokenizer(out) and not force:
        raise InputError(f"{out}: already holds {TOKENIZER_FILE}; pass --force to replace it")


def save(tok: BPETokenizer, model_dir: str | os.PathLike[str], report: TrainReport | None = None,
         force: bool = False) -> list[Path]:
    """Write tokenizer.json, vocab.json, merges.txt and tokenizer_meta.json into `model_dir`.

    Every file is staged in a temporary directory inside `model_dir` and renamed into place.
    """
    out = Path(model_dir)
    check_can_write(out, force)
    meta = {
        "format": "gptport-tokenizer",
        "format_version": 1,
        "sha256": tok.sha256,
        "vocab_size": tok.vocab_size,
        "special_tokens": tok.special_tokens,
        "eot_id": tok.eot_id,
        "gptport_version": __version__,
    }
    if report is not None:
        meta["trained_on"] = {"documents": report.documents, "bytes": report.corpus_bytes,
                              "replaced_bytes": report.replaced_bytes,
                              "heldout_bytes_per_token": report.bytes_per_token}
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".tokenizer-", dir=out))
    try:
        (stage / TOKENIZER_FILE).write_text(tok.json, encoding="utf-8")
        tok.backend.model.save(str(stage))
        (stage / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        (stage / HF_CONFIG_FILE).write_text(json.dumps(hf_config(tok), indent=2) + "\n", encoding="utf-8")
        names = (TOKENIZER_FILE, *GPT2_FILES, META_FILE, HF_CONFIG_FILE)
        for name in names:
            os.replace(stage / name, out / name)
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return [out / n for n in names]


def hf_config(tok: BPETokenizer) -> dict[str, object]:
    """tokenizer_config.json: lets transformers' AutoTokenizer (GPT2TokenizerFast over tokenizer.json)
    and onnxruntime-genai load this tokenizer with its special tokens. No prefix space and no clean-up
    of spaces, so that decoding stays exact."""
    extra = [t for t in tok.special_tokens if t != EOT]
    return {"tokenizer_class": "GPT2Tokenizer", "bos_token": EOT, "eos_token": EOT, "unk_token": EOT,
            "add_prefix_space": False, "add_bos_token": False, "clean_up_tokenization_spaces": False,
            "additional_special_tokens": extra, "errors": "replace"}


def check_trained_with(tok: BPETokenizer, model_dir: str | os.PathLike[str], recorded_sha256: object,
                       vocab_size: object = None) -> None:
    """Refuse a tokenizer other than the one the model of `model_dir` was trained with: its config.json
    records the tokenizer's sha256 (`recorded_sha256`) and the model's `vocab_size` (None: not compared).
    The one check of that kind: training, export, the torch engine, the ONNX engines and GGUF use it."""
    if recorded_sha256 != tok.sha256:
        raise ArtifactError(
            f"{Path(model_dir) / TOKENIZER_FILE} (sha256 {tok.sha256[:12]}…) does not match the model: it is not "
            f"the tokenizer this model was trained with ({str(recorded_sha256)[:12]}… in {paths.CONFIG}); retrain "
            "the model or restore the tokenizer")
    if vocab_size is not None and vocab_size != tok.vocab_size:
        raise ArtifactError(f"{Path(model_dir) / paths.CONFIG}: model vocab_size {vocab_size} != the tokenizer's "
                            f"{tok.vocab_size}")


def parse(path: Path) -> tuple[Tokenizer, str]:
    """A tokenizer.json file as `tokenizers` reads it, and its text (whose sha256 is the tokenizer's)."""
    try:
        text = path.read_text(encoding="utf-8")
        return Tokenizer.from_str(text), text
    except Exception as e:  # tokenizers raises a plain Exception on a malformed file
        raise ArtifactError(f"{path}: not a valid tokenizer file ({e})") from e


def load(model_dir: str | os.PathLike[str]) -> BPETokenizer:
    """Load the tokenizer of a model directory, checking it against tokenizer_meta.json if present."""
    path = Path(model_dir) / TOKENIZER_FILE
    if not path.is_file():
        raise ArtifactError(f"{model_dir}: no {TOKENIZER_FILE}; run `gptport train-tokenizer` first")
    meta_path = Path(model_dir) / META_FILE
    meta = read_json(meta_path) if meta_path.is_file() else {}
    eot_id = meta.get("eot_id")
    if eot_id is not None and (not isinstance(eot_id, int) or isinstance(eot_id, bool)):
        raise ArtifactError(f"{meta_path}: eot_id must be an integer, not {eot_id!r}")
    backend, text = parse(path)
    tok = BPETokenizer(backend, text, eot_id)
    if meta_path.is_file():
        expected = meta.get("sha256")
        if not isinstance(expected, str):
            raise ArtifactError(f"{meta_path}: no sha256 of {TOKENIZER_FILE} (a string under 'sha256')")
        if expected != tok.sha256:
            raise ArtifactError(f"{path}: sha256 {tok.sha256[:12]}… does not match {META_FILE} "
                                f"({expected[:12]}…); the file was changed after training")
    return tok


def byte_level(tok: BPETokenizer) -> bool:
    """Whether the tokenizer's token strings are byte-level (one character per byte): its decoder is ByteLevel."""
    decoder = json.loads(tok.json).get("decoder") or {}
    return "ByteLevel" in [d.get("type") for d in decoder.get("decoders", [decoder]) if isinstance(d, dict)]


def token_bytes(tok: BPETokenizer) -> np.ndarray:
    """Bytes of text each token id stands for (special tokens: 0). A byte-level BPE token's string
    has one character per byte, so its length is its byte count; a SentencePiece-style token stands for its
    UTF-8 with "▁" read as a space, a byte-fallback token <0xAB> for one byte."""
    special = set(tok.special_tokens.values())
    out = np.zeros(tok.vocab_size, dtype=np.int64)
    plain = byte_level(tok)
    for token, i in tok.backend.get_vocab().items():
        if i in special or i >= tok.vocab_size:
            continue
        if plain:
            out[i] = len(token)
        elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            out[i] = 1
        else:
            out[i] = len(token.replace("\u2581", " ").encode("utf-8"))
    return out
