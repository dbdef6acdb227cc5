"""Moving models to and from the Hugging Face transformers format, without transformers itself. Out
(export-hf): GPT-2, a config.json and a safetensors file whose Conv1D weights are the transposes of
gptport's Linear weights, and the Llama family as its architecture's class (hf_llama_export.py). In
(import-hf): GPT-2, and the Llama family (hf_llama.py maps it), read by hf_files.py; config.json records
the source's architecture class under imported_from. Only safetensors are read (no pickles). torch is
imported inside the functions that need it, so that `mismatches` (which export-gguf reuses) stays
torch-free."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptport import atomic
from gptport import tokenizer as bpe
from gptport.config import LARGEST, ModelConfig, read_json
from gptport.errors import ArtifactError, InputError, UsageError
from gptport.export import hf_files, hf_llama
from gptport.export.model_read import IMPORTED_FROM
from gptport.paths import CONFIG, WEIGHTS

if TYPE_CHECKING:
    import torch

    from gptport.training.model import GPT

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
GELU_NAMES = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "exact"}
HF_BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers older checkpoints carry
GPT2_KEYS = {"n_ctx": "n_positions", "d_model": "n_embd", "n_layer": "n_layer", "n_head": "n_head", "d_ff": "n_inner",
             "ln_eps": "layer_norm_epsilon"}  # ModelConfig's field -> GPT-2's config.json key


def mismatches(cfg: ModelConfig) -> list[str]:
    """What keeps a gptport model from being a transformers GPT-2 (empty when it is one)."""
    out = []
    if cfg.pos_encoding != "learned":
        out.append(f"pos_encoding is {cfg.pos_encoding!r} (GPT-2 learns its positions)")
    if cfg.gelu != "tanh":
        out.append(f"gelu is {cfg.gelu!r} (GPT-2 uses the tanh approximation)")
    if not cfg.bias:
        out.append("bias is false (GPT-2 has biases in every Linear and LayerNorm)")
    for name, gpt2 in (("norm", "layernorm"), ("mlp", "gelu")):
        if getattr(cfg, name) != gpt2:
            out.append(f"{name} is {getattr(cfg, name)!r} (GPT-2's is {gpt2!r})")
    if cfg.n_kv_head != cfg.n_head:
        out.append(f"n_kv_head is {cfg.n_kv_head} (GPT-2 has a key and value head per query head)")
    if cfg.q_width != cfg.d_model:
        out.append(f"n_head * head_dim is {cfg.q_width}, not d_model {cfg.d_model}")
    if cfg.qk_norm:
        out.append("qk_norm is true (GPT-2 does not normalise q and k)")
    return out


def gpt2_config(cfg: ModelConfig, eot_id: int) -> dict[str, Any]:
    """transformers' GPT2Config of a gptport model (also what transformers.js reads of export-web's bundle)."""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.vocab_size,
        "n_positions": cfg.n_ctx, "n_embd": cfg.d_model, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
        "n_inner": cfg.d_ff, "activation_function": "gelu_new", "layer_norm_epsilon": cfg.ln_eps,
        "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.dropout,
        "initializer_range": 0.02, "scale_attn_weights": True, "use_cache": True,
        "tie_word_embeddings": cfg.tie_embeddings, "bos_token_id": eot_id, "eos_token_id": eot_id,
    }


def export_hf(model_dir: Path, out: Path, force: bool = False) -> list[Path]:
    """Write a transformers checkpoint of the model's architecture: GPT2LMHeadModel for GPT-2's layers, the
    Llama family's class for its layers (hf_llama_export.py); any other is refused naming what differs."""
    from gptport.export import hf_llama_export
    from gptport.export.model_read import read_model

    files = read_model(model_dir)
    cfg = files.cfg
    family = hf_llama_export.mismatches(cfg)
    if mismatches(cfg) and family:
        if len(family) < 3:  # rope, RMSNorm or SwiGLU: said as what keeps it from the Llama family
            raise InputError(f"{model_dir}: not an architecture of the Llama family: {'; '.join(family)}")
        raise InputError(f"{model_dir}: not a GPT-2 architecture (nor the Llama family's): "
                         f"{'; '.join(mismatches(cfg))}")
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not force:
        raise InputError(f"{out}: exists and is not empty; pass --force to write into it")
    if not family:
        return hf_llama_export.export(files, out)
    return _export_gpt2(model_dir, out)


def _export_gpt2(model_dir: Path, out: Path) -> list[Path]:
    """A transformers GPT-2 checkpoint (config.json, model.safetensors, tokenizer files): Conv1D weights are
    the transposes of gptport's Linear weights."""
    from safetensors.torch import save_file

    from gptport.training import checkpoint

    tok = bpe.load(model_dir)
    model, card = checkpoint.load_model(model_dir, tok)
    cfg = card.model
    state = {}
    for name, tensor in model.state_dict().items():
        if cfg.tie_embeddings and name == "lm_head.weight":
            continue
        t = tensor.t() if name.endswith(CONV1D) else tensor
        state[name if name == "lm_head.weight" else f"transformer.{name}"] = t.contiguous()
    hf_config = gpt2_config(cfg, tok.eot_id)
    out.mkdir(parents=True, exist_ok=True)
    with atomic.atomic_path(out / "model.safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    atomic.write_text(out / "config.json", json.dumps(hf_config, indent=2) + "\n")
    for name in (bpe.TOKENIZER_FILE, *bpe.GPT2_FILES, bpe.HF_CONFIG_FILE):
        atomic.write_bytes(out / name, (model_dir / name).read_bytes())
    return [out / n for n in ("config.json", "model.safetensors", bpe.TOKENIZER_FILE, bpe.HF_CONFIG_FILE)]


def _hf_tokenizer(hf_dir: Path) -> bpe.BPETokenizer:
    """The byte-level BPE of a GPT-2 directory: tokenizer.json, else vocab.json + merges.txt."""
    from tokenizers import AddedToken, Tokenizer, models

    path = hf_dir / bpe.TOKENIZER_FILE
    if path.is_file():
        try:
            backend = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a plain Exception on a malformed file
            raise ArtifactError(f"{path}: not a valid tokenizer file ({e})") from e
        if type(backend.model).__name__ != "BPE":
            raise InputError(f"{path}: a {type(backend.model).__name__} tokenizer, not byte-level BPE")
    elif (hf_dir / "vocab.json").is_file() and (hf_dir / "merges.txt").is_file():
        backend = bpe.new_backend()
        backend.model = models.BPE.from_file(str(hf_dir / "vocab.json"), str(hf_dir / "merges.txt"))
    else:
        raise InputError(f"{hf_dir}: no tokenizer.json, nor vocab.json + merges.txt")
    if backend.token_to_id(bpe.EOT) is None:
        raise InputError(f"{hf_dir}: the tokenizer has no {bpe.EOT} token")
    backend.add_special_tokens([AddedToken(bpe.EOT, special=True, normalized=False)])
    return bpe.BPETokenizer(backend)


def architecture(hf: dict[str, Any], where: Path) -> str:
    """"gpt2" or the Llama-family architecture config.json declares; any other is refused naming it."""
    if hf.get("model_type") == "gpt2" or "GPT2LMHeadModel" in (hf.get("architectures") or []):
        return "gpt2"
    arch = hf_llama.family(hf)
    if arch is None:
        kind = ", ".join(map(str, hf.get("architectures") or [])) or hf.get("model_type") or "unknown"
        raise InputError(f"{where}: architecture {kind} is not one gptport imports (GPT2LMHeadModel, "
                         f"{', '.join(hf_llama.FAMILY.values())})")
    return arch


def _model_config(hf: dict[str, Any], vocab_size: int, where: Path) -> ModelConfig:
    act = hf.get("activation_function", "gelu_new")
    if act not in GELU_NAMES:
        raise InputError(f"{where}: activation_function {act!r} is not a GELU gptport has")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
        if hf.get(flag):
            raise InputError(f"{where}: {flag} is set; gptport's GPT does not have it")
    shape = {key: hf_llama.number(hf, key, where, positive=True) for key in ("n_positions", "n_embd", "n_layer",
                                                                                "n_head")}
    d_ff = hf_llama.number(hf, "n_inner", where, 4 * shape["n_embd"], positive=True)
    try:
        return ModelConfig(vocab_size=vocab_size, n_ctx=shape["n_positions"], d_model=shape["n_embd"],
                           n_layer=shape["n_layer"], n_head=shape["n_head"], d_ff=d_ff, dropout=0.0, bias=True,
                           pos_encoding="learned", tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
                           ln_eps=hf_llama.number(hf, "layer_norm_epsilon", where, 1e-5, kind=float),
                           gelu=GELU_NAMES[act])  # type: ignore[arg-type]
    except UsageError as e:  # a shape gptport's model cannot have, said by ModelConfig with config.json's keys
        raise hf_llama.refused(e, GPT2_KEYS, where) from e


def _gpt2_weights(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """transformers' GPT-2 tensors under gptport's names: Conv1D transposed, a padded vocabulary cut."""
    mapped = {}
    for name, tensor in state.items():
        key = name.removeprefix("transformer.")
        if key.endswith(HF_BUFFERS):
            continue
        if key in ("wte.weight", "lm_head.weight"):
            tensor = tensor[: cfg.vocab_size]  # a padded vocabulary keeps the tokenizer's rows
        mapped[key] = tensor.t() if key.endswith(CONV1D) else tensor
    if cfg.tie_embeddings:
        mapped.pop("lm_head.weight", None)
    return mapped


def import_hf(hf_dir: Path, out: Path, force: bool = False) -> ModelConfig:
    """Turn a local transformers directory (GPT-2 or the Llama family) into a gptport model directory. Every
    check runs before anything is written; the directory is then written in one move (write_model_dir)."""
    config_path = hf_dir / "config.json"
    if not config_path.is_file():
        raise InputError(f"{hf_dir}: no config.json")
    hf_files.weight_files(hf_dir)  # no weights, or pickles only: said before anything is read
    if (out / bpe.TOKENIZER_FILE).exists() and not force:
        raise InputError(f"{out}: already holds a model; pass --force to replace it")
    hf = read_json(config_path)
    arch = architecture(hf, config_path)
    kept: dict[str, bytes] = {}
    if arch == "gpt2":
        tok = _hf_tokenizer(hf_dir)
    else:
        backend, text = hf_files.read_tokenizer_json(hf_dir)
        tokens = hf_files.specials(hf_dir, backend, hf)
        tok = bpe.BPETokenizer(backend, text, tokens.eot_id)
        kept = hf_files.kept_files(hf_dir)
    model_vocab = hf_llama.number(hf, "vocab_size", config_path, positive=True)
    if model_vocab > LARGEST["vocab_size"]:
        raise InputError(f"{config_path}: vocab_size must be at most {LARGEST['vocab_size']:,}, not {model_vocab:,}")
    if tok.vocab_size > model_vocab:
        raise InputError(f"{hf_dir}: the tokenizer has {tok.vocab_size} tokens but the model's vocabulary only "
                         f"{model_vocab}: the tokenizer does not fit the model")
    cfg = (_model_config(hf, tok.vocab_size, config_path) if arch == "gpt2"
           else hf_llama.model_config(hf, arch, tok.vocab_size, tokens, config_path))
    state = hf_files.read_weights(hf_dir)
    mapped = _gpt2_weights(state, cfg) if arch == "gpt2" else hf_llama.gptport_weights(state, cfg, hf_dir)
    from gptport.training.model import GPT

    model = GPT(cfg)
    try:
        missing, unexpected = model.load_state_dict(mapped, strict=False)
    except RuntimeError as e:  # a tensor of another shape than config.json says
        raise ArtifactError(f"{hf_dir}: its weights do not fit its config.json ({str(e).splitlines()[-1].strip()})"
                            ) from e
    missing = [k for k in missing if not (cfg.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ArtifactError(f"{hf_dir}: its weights do not fit its config.json "
                            f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    archs = hf.get("architectures")
    named = {"gpt2": "GPT2LMHeadModel", **hf_llama.FAMILY}[arch]
    source = {"format": "transformers", "directory": hf_dir.resolve().name,
              "architecture": archs[0] if isinstance(archs, list) and archs else named}
    write_model_dir(out, tok, model, cfg, kept, source)
    return cfg


def _write_config(model_dir: Path, cfg: ModelConfig, tok: bpe.BPETokenizer, sha: str,
                  source: dict[str, Any] | None) -> None:
    """model_card.write_config's config.json, with the source recorded under imported_from when given."""
    from gptport.model_card import write_config

    write_config(model_dir, cfg, tok, 0, sha)
    if source is not None:
        data = read_json(model_dir / CONFIG)
        atomic.write_text(model_dir / CONFIG, json.dumps({**data, IMPORTED_FROM: source}, indent=2) + "\n")


def write_model_dir(out: Path, tok: bpe.BPETokenizer, model: GPT, cfg: ModelConfig, kept: dict[str, bytes],
                    source: dict[str, Any] | None = None) -> None:
    """The tokenizer's files, `kept` (transformers' files kept byte for byte, by path: tokenizer_config.json
    and additional_chat_templates/NAME.jinja among them), the weights and config.json (recording `source`
    under imported_from), staged in a temporary directory. A new (or empty) `out` is that
    directory renamed into place: nothing half-written is ever seen. Into a directory holding other files,
    the staged files move in one by one, config.json last and accepting the weights' sha256 before they
    land (as checkpoint.save_model does), so a crash never pairs a config.json with weights it did not see."""
    import torch

    from gptport.training import checkpoint

    whole = not out.exists() or (out.is_dir() and not any(out.iterdir()))
    parent = out.parent if whole else out
    parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.import-", dir=parent))
    try:
        bpe.save(tok, stage, force=True)
        for name, data in kept.items():
            (stage / name).parent.mkdir(parents=True, exist_ok=True)
            (stage / name).write_bytes(data)
        staged = stage / WEIGHTS
        with torch.no_grad():
            sha = checkpoint.write_weights(staged, model, 0)
        if whole:
            _write_config(stage, cfg, tok, sha, source)
            atomic.replace_dir(stage, out)
            return
        for path in stage.iterdir():
            if path != staged:
                if path.is_dir() and (out / path.name).is_dir():
                    shutil.rmtree(out / path.name)  # a folder of named templates is replaced whole
                path.replace(out / path.name)
        checkpoint.mark_pending(out, sha)
        staged.replace(out / WEIGHTS)
        _write_config(out, cfg, tok, sha, source)
    finally:
        shutil.rmtree(stage, ignore_errors=True)

