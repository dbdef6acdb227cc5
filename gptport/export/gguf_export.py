"""A model directory as a GGUF file of llama.cpp's GPT-2 architecture (`gpt2`), so that llama.cpp runs it.

Weights are read with safetensors' numpy API and written with the `gguf` package (GGUFWriter, and its
numpy quantizers for f16 and q8_0); no torch. gptport's Linear weights are (out, in), which is what
llama.cpp's gpt2 wants once GGUF reverses the shape, so nothing is transposed (transformers' Conv1D
checkpoints need the transpose that llama.cpp's convert_hf_to_gguf.py applies). The tokenizer goes in
as llama.cpp's `gpt2` BPE with the GPT-2 pre-tokenizer; `<|endoftext|>` is BOS, EOS and unknown, as
convert_hf_to_gguf.py writes for a GPT-2 directory (no padding token, no BOS added to prompts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

from gptport import atomic, provenance
from gptport import tokenizer as bpe
from gptport.config import ModelConfig, check_format_version, model_config_from_dict, read_json
from gptport.errors import ArtifactError, InputError, UsageError
from gptport.export.hf import mismatches
from gptport.paths import CONFIG, WEIGHTS

ARCH = "gpt2"
TOKENIZER_PRE = "gpt-2"
OUTTYPES = ("f32", "f16", "q8_0")
TIED_KEY = "lm_head.weight"  # absent from model.safetensors when the head is tied (as in checkpoint.py)

# gptport (= GPT-2) module names -> GGUF tensor names of llama.cpp's gpt2 (gguf.TENSOR_NAMES)
GLOBAL_NAMES = {"wte": "token_embd", "wpe": "position_embd", "ln_f": "output_norm", "lm_head": "output"}
BLOCK_NAMES = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
               "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}


def default_out(model_dir: Path, outtype: str) -> Path:
    """Where export-gguf writes without --out: MODEL_DIR/model.<outtype>.gguf."""
    return model_dir / f"model.{outtype}.gguf"


def gguf_name(name: str) -> str:
    """The GGUF name of a gptport tensor: 'h.3.attn.c_attn.weight' -> 'blk.3.attn_qkv.weight'."""
    module, _, kind = name.rpartition(".")
    if module in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[module]}.{kind}"
    head, _, rest = module.partition(".")
    block, _, sub = rest.partition(".")
    if head == "h" and block.isdecimal() and sub in BLOCK_NAMES:
        return f"blk.{int(block)}.{BLOCK_NAMES[sub]}.{kind}"
    raise KeyError(name)


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The tensors model.safetensors must hold for `cfg`, by gptport name (a GPT-2: every bias present)."""
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    out: dict[str, tuple[int, ...]] = {"wte.weight": (v, d), "wpe.weight": (cfg.n_ctx, d),
                                       "ln_f.weight": (d,), "ln_f.bias": (d,)}
    if not cfg.tie_embeddings:
        out[TIED_KEY] = (v, d)
    per_block = {"ln_1": (d,), "attn.c_attn": (3 * d, d), "attn.c_proj": (d, d), "ln_2": (d,),
                 "mlp.c_fc": (f, d), "mlp.c_proj": (d, f)}
    for i in range(cfg.n_layer):
        for sub, shape in per_block.items():
            out[f"h.{i}.{sub}.weight"] = shape
            out[f"h.{i}.{sub}.bias"] = (shape[0],)
    return out


@dataclass(frozen=True)
class Vocab:
    """The tokenizer as GGUF wants it: token strings and types by id, merges as 'a b' strings."""

    tokens: list[str]
    types: list[int]
    merges: list[str]
    eot_id: int


@dataclass(frozen=True)
class Summary:
    """What export_gguf wrote."""

    path: Path
    outtype: str
    n_bytes: int
    n_params: int
    tensor_types: dict[str, int] = field(default_factory=dict)  # GGML type name -> count
    vocab_size: int = 0
    n_merges: int = 0


def read_vocab(model_dir: Path, cfg: ModelConfig, tokenizer_sha256: str) -> Vocab:
    """tokenizer.json's vocabulary, token types and merges, checked against config.json."""
    tok = bpe.load(model_dir)  # checks tokenizer_meta.json's sha256
    bpe.check_trained_with(tok, model_dir, tokenizer_sha256, cfg.vocab_size)
    path = model_dir / bpe.TOKENIZER_FILE
    spec = json.loads(tok.json)
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    if model.get("type") != "BPE":
        raise InputError(f"{path}: a {model.get('type')} tokenizer; llama.cpp's gpt2 needs byte-level BPE")
    if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) or pre.get("add_prefix_space"):
        raise InputError(f"{path}: pre-tokenizer {json.dumps(pre)} is not GPT-2's (ByteLevel, its regex, "
                         "no prefix space), which GGUF's tokenizer.ggml.pre = gpt-2 stands for")
    by_id = {i: t for t, i in tok.backend.get_vocab(with_added_tokens=True).items()}
    if sorted(by_id) != list(range(len(by_id))):
        raise ArtifactError(f"{path}: token ids are not 0..{len(by_id) - 1} without gaps")
    special = {i for i, t in tok.backend.get_added_tokens_decoder().items() if t.special}
    added = set(tok.backend.get_added_tokens_decoder()) - special
    types = [int(gguf.TokenType.CONTROL if i in special else
                 gguf.TokenType.USER_DEFINED if i in added else gguf.TokenType.NORMAL) for i in range(len(by_id))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return Vocab([by_id[i] for i in range(len(by_id))], types, merges, tok.eot_id)


def read_weights(model_dir: Path, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """model.safetensors as float32 numpy arrays, checked name by name and shape by shape."""
    from safetensors import SafetensorError, safe_open

    path = model_dir / WEIGHTS
    if not path.is_file():
        raise ArtifactError(f"{model_dir}: no {WEIGHTS}; train a model first (`gptport train`)")
    provenance.check_weights(model_dir)
    try:
        with safe_open(str(path), framework="np") as f:
            state = {k: np.asarray(f.get_tensor(k), dtype=np.float32) for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, TypeError, ValueError) as e:
        raise ArtifactError(f"{path}: unreadable ({e})") from e
    want = expected_shapes(cfg)
    missing, unexpected = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or unexpected:
        raise ArtifactError(f"{path}: does not fit {CONFIG} (missing {missing[:3]}, unexpected {unexpected[:3]})")
    for name, shape in want.items():
        if state[name].shape != shape:
            raise ArtifactError(f"{path}: {name} has shape {state[name].shape}, {CONFIG} implies {shape}")
    return state


def read_model(model_dir: Path) -> tuple[ModelConfig, str]:
    """config.json's model and tokenizer sha256, refused unless it is GPT-2's architecture."""
    if not model_dir.is_dir():
        raise InputError(f"{model_dir}: not a directory")
    path = model_dir / CONFIG
    if not path.is_file():
        raise ArtifactError(f"{model_dir}: no {CONFIG}; train a model first (`gptport train`)")
    data = read_json(path)
    for key in ("model", "tokenizer_sha256"):
        if key not in data:
            raise ArtifactError(f"{path}: missing {key!r}")
    check_format_version(data, str(path))
    cfg = model_config_from_dict(data["model"], str(path))
    problems = mismatches(cfg)
    if problems:
        raise InputError(f"{path}: not GPT-2's architecture, which llama.cpp's gpt2 runs: {'; '.join(problems)}")
    return cfg, str(data["tokenizer_sha256"])


def tensor_type(name: str, array: np.ndarray, outtype: str) -> gguf.GGMLQuantizationType:
    """The GGML type a tensor is written as: what convert_hf_to_gguf.py picks for gpt2. Norms, biases,
    1-D tensors and the position table stay float32; the rest take the output type."""
    if array.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight") \
            or name.startswith("position_embd."):
        return gguf.GGMLQuantizationType.F32
    return {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
            "q8_0": gguf.GGMLQuantizationType.Q8_0}[outtype]


def encode_tensor(name: str, array: np.ndarray, outtype: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """The bytes (as numpy) and GGML type of one tensor; q8_0 falls back to f16 for rows not a
    multiple of its block, as convert_hf_to_gguf.py does."""
    qtype = tensor_type(name, array, outtype)
    try:
        return gguf.quants.quantize(array, qtype), qtype
    except gguf.QuantError:
        return gguf.quants.quantize(array, gguf.GGMLQuantizationType.F16), gguf.GGMLQuantizationType.F16


def check_out(out: Path, force: bool) -> None:
    """Refuse a directory as --out, and an existing file unless `force`."""
    if out.is_dir():
        raise UsageError(f"--out {out}: is a directory; name the .gguf file to write")
    if out.exists() and not force:
        raise InputError(f"{out}: exists; pass --force to replace it")


def export_gguf(model_dir: Path, outtype: str = "f32", out: Path | None = None, force: bool = False) -> Summary:
    """Write MODEL_DIR's model and tokenizer as one GGUF file (atomically: temp name, then rename)."""
    if outtype not in OUTTYPES:
        raise UsageError(f"--outtype must be one of {', '.join(OUTTYPES)}, not {outtype!r}")
    cfg, sha = read_model(model_dir)
    out = default_out(model_dir, outtype) if out is None else out
    check_out(out, force)
    vocab = read_vocab(model_dir, cfg, sha)
    state = read_weights(model_dir, cfg)
    tensors = [(gguf_name(k), *encode_tensor(gguf_name(k), v, outtype)) for k, v in sorted(state.items())]

    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic.atomic_path(out) as tmp:
        writer = gguf.GGUFWriter(tmp, arch=ARCH)
        try:
            _write_metadata(writer, cfg, vocab, outtype, model_dir.resolve().name)
            for name, data, qtype in tensors:
                writer.add_tensor(name, data, raw_dtype=qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
    counts: dict[str, int] = {}
    for _, _, qtype in tensors:
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
    return Summary(out, outtype, out.stat().st_size, sum(int(v.size) for v in state.values()), counts,
                   len(vocab.tokens), len(vocab.merges))


def _write_metadata(writer: gguf.GGUFWriter, cfg: ModelConfig, vocab: Vocab, outtype: str, name: str) -> None:
    """Hyperparameters under gpt2.*, and the tokenizer under tokenizer.ggml.*."""
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype]
    writer.add_name(name)
    writer.add_block_count(cfg.n_layer)
    writer.add_context_length(cfg.n_ctx)
    writer.add_embedding_length(cfg.d_model)
    writer.add_feed_forward_length(cfg.d_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_layer_norm_eps(cfg.ln_eps)
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(TOKENIZER_PRE)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.eot_id)
    writer.add_eos_token_id(vocab.eot_id)
    writer.add_unk_token_id(vocab.eot_id)
    writer.add_add_bos_token(False)  # tokenizer_config.json's add_bos_token: gptport prompts start bare
