"""Reading a local transformers model directory for import-hf: its weights' headers (model.safetensors, or the
shards model.safetensors.index.json lists, checked against it; bf16, fp16 and fp32; pickles refused) and each
tensor's bytes read by its offsets, never a whole shard; its tokenizer.json
as `tokenizers` reads it, its special tokens (tokenizer_config.json, generation_config.json, config.json)
and the files a gptport model directory keeps as they are (tokenizer_config.json with its chat template,
chat_template.jinja and the named templates transformers 5 saves in additional_chat_templates/,
generation_config.json)."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from gptport import safetensors_file
from gptport import tokenizer as bpe
from gptport.arch.base import Specials
from gptport.config import read_json
from gptport.errors import ArtifactError, InputError, escaped
from gptport.paths import CHAT_TEMPLATES_DIR
from gptport.safetensors_file import Entry

__all__ = ["Held", "Specials", "check_index", "kept_files", "read_bytes", "read_headers", "read_tokenizer_json",
           "read_weights", "specials", "weight_files", "weight_map"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
GENERATION_CONFIG = "generation_config.json"
CHAT_TEMPLATE = "chat_template.jinja"
KEPT = (bpe.HF_CONFIG_FILE, CHAT_TEMPLATE, GENERATION_CONFIG)  # copied byte for byte when present
WIDENED = ("BF16", "F16", "F32")  # the float types read


def weight_files(hf_dir: Path) -> list[Path]:
    """model.safetensors, or each shard the index names once (in the directory: no `../`, no absolute path);
    pickles are refused by name."""
    if (hf_dir / SINGLE).is_file():
        return [hf_dir / SINGLE]
    if (hf_dir / INDEX).is_file():
        shards = sorted(set(weight_map(hf_dir).values()))
        missing = [s for s in shards if Path(s).name != s or s in (".", "..") or not (hf_dir / s).is_file()]
        if missing:
            raise ArtifactError(f"{hf_dir / INDEX}: names shard {escaped(missing[0])}, which is not in {hf_dir}")
        return [hf_dir / s for s in shards]
    pickled = [p.name for p in hf_dir.glob("*.bin")]
    hint = f" ({', '.join(pickled)} is a pickle, which gptport does not load)" if pickled else ""
    raise InputError(f"{hf_dir}: no model.safetensors{hint}")


def weight_map(hf_dir: Path) -> dict[str, str]:
    """The index's weight_map: tensor name -> shard file name, each a string."""
    found = read_json(hf_dir / INDEX).get("weight_map")
    if not isinstance(found, dict) or not found:
        raise ArtifactError(f"{hf_dir / INDEX}: no weight_map")
    odd = next((k for k, v in found.items() if not isinstance(v, str)), None)
    if odd is not None:
        raise ArtifactError(f"{hf_dir / INDEX}: weight_map's {escaped(odd)} is {escaped(repr(found[odd]))[:40]}, "
                            "not a file name")
    return found


def check_index(hf_dir: Path, held: dict[str, Path]) -> None:
    """The index agrees with the shards (`held`: each tensor read -> its shard): every tensor it names is in the
    shard it names, and no shard holds a tensor it does not name."""
    if not (hf_dir / INDEX).is_file() or (hf_dir / SINGLE).is_file():
        return
    listed = weight_map(hf_dir)
    for name, shard in listed.items():
        if name not in held or held[name].name != shard:
            raise ArtifactError(f"{hf_dir / INDEX}: names tensor {escaped(name)} in {escaped(shard)}, which does not "
                                "hold it")
    unlisted = sorted(set(held) - set(listed))
    if unlisted:
        raise ArtifactError(f"{held[unlisted[0]]}: holds tensor {escaped(unlisted[0])}, which {INDEX} does not name")


@dataclass(frozen=True)
class Held:
    """One tensor of a shard: its header entry, and where the shard's data section starts."""

    path: Path
    entry: Entry
    start: int  # the file offset of the data section (entry's offsets count from it)


def read_headers(hf_dir: Path) -> dict[str, Held]:
    """Every tensor of the directory's safetensors, by name, each file's header checked against the file
    (safetensors_file.read_header); a tensor in two shards, one the index misplaces or leaves out, or one of a
    type that is no float (a quantized checkpoint), is refused naming it. Headers only: no weight is read."""
    held: dict[str, Held] = {}
    for path in weight_files(hf_dir):
        entries = safetensors_file.read_header(path)
        start = safetensors_file.data_start(path)
        for name, entry in entries.items():
            if entry.dtype not in WIDENED:
                raise InputError(f"{path}: tensor {escaped(name)} is {entry.dtype}, not a float (a quantized "
                                 "checkpoint?); gptport imports bf16, fp16 and fp32 weights")
            if name in held:
                raise ArtifactError(f"{path}: tensor {escaped(name)} is in another shard too")
            held[name] = Held(path, entry, start)
    check_index(hf_dir, {name: h.path for name, h in held.items()})
    return held


def read_bytes(held: Held, begin: int, size: int, f: BinaryIO | None = None) -> np.ndarray:
    """`size` bytes of a tensor from its byte `begin` (uint8), read from the shard (`f`: the shard, opened)."""
    out = np.empty(size, np.uint8)
    view, got = memoryview(out), 0
    try:
        with nullcontext(f) if f is not None else open(held.path, "rb", buffering=0) as file:
            file.seek(held.start + held.entry.begin + begin)
            while got < size:  # a read may return less than asked
                n = file.readinto(view[got:])
                if not n:
                    raise ArtifactError(f"{held.path}: truncated while tensor {escaped(held.entry.name)} was read")
                got += n
    except OSError as e:
        raise ArtifactError(f"{held.path}: unreadable ({e.strerror or e})") from None
    return out


def read_weights(hf_dir: Path) -> dict[str, np.ndarray]:
    """Every tensor of the directory's safetensors as float32 numpy arrays (read_headers' checks first), in memory:
    for tests and the fuzzer; import-hf streams them instead (hf_stream.py)."""
    from gptport.weights import widen

    out = {}
    for name, h in read_headers(hf_dir).items():
        out[name] = widen(read_bytes(h, 0, h.entry.end - h.entry.begin), h.entry.dtype).reshape(h.entry.shape)
    return out


def read_tokenizer_json(hf_dir: Path) -> tuple[Any, str]:
    """tokenizer.json as `tokenizers` reads it, and its text (kept byte for byte: its sha256 is the model's)."""
    path = hf_dir / bpe.TOKENIZER_FILE
    if not path.is_file():
        raise InputError(f"{hf_dir}: no {bpe.TOKENIZER_FILE}")
    backend, text = bpe.parse(path)
    kind = type(backend.model).__name__
    if kind != "BPE":
        raise InputError(f"{path}: a {kind} tokenizer; gptport imports BPE tokenizers (byte-level or with byte "
                         "fallback)")
    return backend, text


def _ids(value: object) -> list[int]:
    """An eos_token_id / bos_token_id field: an int, a list of ints, or null."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _token_id(backend: Any, value: object, where: Path, field: str) -> int | None:
    """The id of a tokenizer_config.json token field (its text, or an AddedToken object with "content")."""
    text = value.get("content") if isinstance(value, dict) else value
    if text is None:
        return None
    if not isinstance(text, str):
        raise ArtifactError(f"{where}: {field} must be a string, not {text!r}")
    tid = backend.token_to_id(text)
    if tid is None:
        raise InputError(f"{where}: {field} {text!r} is not a token of {bpe.TOKENIZER_FILE}")
    return int(tid)


def specials(hf_dir: Path, backend: Any, hf_config: dict[str, Any]) -> Specials:
    """bos and eos from tokenizer_config.json (bos_token, eos_token, add_bos_token), generation_config.json
    (eos_token_id, a list or one) and config.json (bos_token_id, eos_token_id). Without add_bos_token, the
    tokenizer adds bos when its post-processor puts it first (Llama 3's template)."""
    tok_cfg_path, gen_path = hf_dir / bpe.HF_CONFIG_FILE, hf_dir / GENERATION_CONFIG
    tok_cfg = read_json(tok_cfg_path) if tok_cfg_path.is_file() else {}
    gen = read_json(gen_path) if gen_path.is_file() else {}
    bos = _token_id(backend, tok_cfg.get("bos_token"), tok_cfg_path, "bos_token")
    if bos is None:
        bos = next(iter(_ids(gen.get("bos_token_id")) or _ids(hf_config.get("bos_token_id"))), None)
    eos_token = _token_id(backend, tok_cfg.get("eos_token"), tok_cfg_path, "eos_token")
    eos = [*([] if eos_token is None else [eos_token]), *_ids(gen.get("eos_token_id")),
           *_ids(hf_config.get("eos_token_id"))]
    if not eos:
        raise InputError(f"{hf_dir}: no end-of-sequence token (eos_token in {bpe.HF_CONFIG_FILE}, eos_token_id in "
                         f"{GENERATION_CONFIG} or config.json)")
    add_bos = tok_cfg.get("add_bos_token")
    if not isinstance(add_bos, bool):
        first = backend.encode("a", add_special_tokens=True).ids[:1]
        add_bos = bos is not None and first == [bos] and backend.encode("a", add_special_tokens=False).ids[:1] != [bos]
    return Specials(bos, bool(add_bos and bos is not None), tuple(sorted(set(eos))), eos[0])


def kept_files(hf_dir: Path) -> dict[str, bytes]:
    """The files a gptport directory keeps as transformers wrote them, by path relative to the directory:
    KEPT, and each named chat template of additional_chat_templates/ (NAME.jinja, which `gptport serve`
    offers beside the default one)."""
    kept = {name: (hf_dir / name).read_bytes() for name in KEPT if (hf_dir / name).is_file()}
    named = sorted((hf_dir / CHAT_TEMPLATES_DIR).glob("*.jinja")) if (hf_dir / CHAT_TEMPLATES_DIR).is_dir() else []
    kept.update({f"{CHAT_TEMPLATES_DIR}/{p.name}": p.read_bytes() for p in named if p.is_file()})
    return kept
