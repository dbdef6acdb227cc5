"""Opening a model directory for inference: the tokenizer, the onnxruntime session on a provider, and
the prompts as token ids, with every consistency check on the way. The torch reference model opens
through gptport.training.torch_engine.open_torch into the same `Opened`; `--engine` picks between the
two in the CLI (gptport.cli.common.open_engine), above both stages."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gptport import contract, provenance, specials
from gptport import tokenizer as bpe
from gptport.config import ModelConfig, read_json
from gptport.errors import ArtifactError, InputError, UsageError
from gptport.paths import CONFIG
from gptport.runtime import cuda_engine, onnx_engine
from gptport.runtime.choice import (
    DEFAULT_GRAPH,
    DEFAULT_RUN,
    CacheLayout,
    GraphChoice,
    GraphFormat,
    KvDtype,
    RunOptions,
)
from gptport.runtime.engine import Capability, Engine


@dataclass
class Opened:
    """An engine ready to generate, and what the user should know about it."""

    engine: Engine
    tok: bpe.BPETokenizer
    engine_name: str  # onnx | torch
    provider: str
    precision: str
    cache: str = contract.CACHE_CONCAT  # the KV-cache layout of the graph: concat or static


def graph_path(model_dir: Path, choice: GraphChoice, provider: str = "cpu") -> Path:
    """The graph file of this precision and KV-cache layout. `auto` takes the static-cache graph on the
    CPU provider when it was exported, on CUDA the graph export --cuda wrote for it (cuda_engine.py), the
    contract graph otherwise. Format ort: the contract graph's .ort
    file (export --ort-format). KV dtype int8: the static-cache graph with an int8 cache (export
    --kv-dtype int8)."""
    precision, cache, fmt = choice.precision, choice.cache, choice.fmt
    if choice.kv_dtype == KvDtype.INT8:
        return _kv8_path(model_dir, choice, provider)
    if fmt == GraphFormat.ORT:
        if cache == CacheLayout.STATIC:
            raise UsageError("--graph-format ort --kv-cache static: the .ort files hold the contract graph "
                             "(--kv-cache concat)")
        path = model_dir / contract.ort_file(precision)
        if not path.is_file():
            raise ArtifactError(f"{path}: missing; run `gptport export {model_dir} --ort-format` first")
        return path
    layout = str(cache)
    if provider == "cuda" and cache != CacheLayout.CONCAT:  # export --cuda's graphs, else (auto) the contract's
        device = cuda_engine.graph_path(model_dir, precision, required=cache == CacheLayout.STATIC)
        if device is not None:
            return device
        layout = contract.CACHE_CONCAT
    if layout == CacheLayout.AUTO:
        static = model_dir / contract.onnx_file(precision, contract.CACHE_STATIC)
        layout = contract.CACHE_STATIC if provider == "cpu" and static.is_file() else contract.CACHE_CONCAT
    path = model_dir / contract.onnx_file(precision, layout)
    if not path.is_file():
        hint = "" if precision == "fp32" else f" --precision fp32,{precision}"
        raise ArtifactError(f"{path}: missing; run `gptport export {model_dir}{hint}` first")
    return path


def _kv8_path(model_dir: Path, choice: GraphChoice, provider: str) -> Path:
    """The int8-cache graph: a static-cache graph, on the CPU provider."""
    precision, cache, fmt = choice.precision, choice.cache, choice.fmt
    if cache == CacheLayout.CONCAT or fmt != GraphFormat.ONNX:
        what = "--kv-cache concat" if cache == CacheLayout.CONCAT else f"--graph-format {fmt}"
        raise UsageError(f"--kv-dtype int8 with {what}: the int8 cache is the static-cache graph's "
                         "(--kv-cache static, .onnx)")
    if provider != "cpu":
        raise UsageError(f"--kv-dtype int8 --provider {provider}: the int8 cache runs on the CPU provider only")
    path = model_dir / contract.onnx_file(precision, contract.CACHE_STATIC_KV8)
    if not path.is_file():
        hint = "" if precision == "fp32" else f" --precision fp32,{precision}"
        raise ArtifactError(f"{path}: missing; run `gptport export {model_dir}{hint} --kv-dtype int8` first")
    return path


def open_graph(model_dir: Path, choice: GraphChoice = DEFAULT_GRAPH, run: RunOptions = DEFAULT_RUN, *,
               say: Callable[[str], None] = lambda m: None, cuda_graph: bool = True) -> onnx_engine.OnnxModel:
    """The graph `choice` picks (graph_path) opened as `run` says, refused unless
    it was exported from the directory's model.safetensors and config.json (provenance.check; a file
    the directory lacks is not compared); `say` gets the fallbacks taken and, for a graph written with
    `export --no-gate`, a one-line warning. The one way generate, bench, eval and serve open a graph.
    A static-cache graph of export --cuda opens as a cuda_engine.DeviceModel, its decode steps replayed as
    CUDA graphs unless `cuda_graph` is False."""
    provider, threads, spin = run.provider, run.threads, str(run.spin)
    path = graph_path(model_dir, choice, provider)
    device = provider == "cuda" and path.name in {cuda_engine.graph_file(p) for p in ("fp32", "fp16")}
    model = onnx_engine.load(path, provider, threads=threads, fallback=run.fallback, say=say, spin=spin,
                             cuda_graph=device and cuda_graph)
    provenance.check(model_dir, path, model.meta)
    if model.meta.get(contract.META_GATED) == "false":
        say(ungated_warning(path))
    if model.cache == contract.CACHE_DECODE or (model.on_gpu and model.cache in cuda_engine.GPU_CACHES):
        appender = None
        if model.cache == contract.CACHE_DECODE:  # its prefills: the multi-row append graph, on the same provider
            twin = model_dir / contract.onnx_file("fp32", contract.CACHE_APPEND)
            appender = onnx_engine.load(twin, model.provider, threads=threads, spin=spin)
            provenance.check(model_dir, twin, appender.meta)
        return cuda_engine.on_device(model, appender, cuda_graph=device and cuda_graph)
    return model


def open_appender(model_dir: Path, engine: onnx_engine.OnnxModel, run: RunOptions = DEFAULT_RUN
                  ) -> onnx_engine.OnnxModel | None:
    """The multi-row append graph beside `engine` (model.append.onnx, its session for
    slot_layout.open_slots(..., appender=...)), opened and checked as open_graph opens any graph, on the CPU
    with `run`'s threads and spin: None when `engine` lacks Capability.APPEND_ROWS (the fp32 static-cache graph
    with a float32 cache on the CPU: the twin),
    or the directory has no append graph (an export from before it was written)."""
    path = model_dir / contract.onnx_file("fp32", contract.CACHE_APPEND)
    if Capability.APPEND_ROWS not in engine.capabilities or not path.is_file():
        return None
    model = onnx_engine.load(path, "cpu", threads=run.threads, spin=str(run.spin))
    provenance.check(model_dir, path, model.meta)
    if model.config != engine.config:
        raise ArtifactError(f"{path}: made for another model than {engine.path} (their configs differ); export again")
    return model


def ungated_warning(path: Path) -> str:
    """The one line said when a graph written by `export --no-gate` runs."""
    return (f"{path.name} was exported with --no-gate: its accuracy was never checked against fp32 (for speed "
            "measurements only); export again without --no-gate to gate it")


def load_tokenizer(model_dir: Path) -> bpe.BPETokenizer:
    """The directory's tokenizer, refused when it is not the one config.json's model was trained with."""
    tok = bpe.load(model_dir)
    if (model_dir / CONFIG).is_file():  # a deployment copy may hold the graphs without it
        card = read_json(model_dir / CONFIG)
        model = card.get("model")
        bpe.check_trained_with(tok, model_dir, card.get("tokenizer_sha256"),
                               model.get("vocab_size") if isinstance(model, dict) else None)
    return tok


def open_model(model_dir: Path, choice: GraphChoice = DEFAULT_GRAPH, run: RunOptions = DEFAULT_RUN, *,
               say: Callable[[str], None] = lambda m: None) -> Opened:
    """Load the tokenizer and the ONNX engine of `model_dir` (open_graph: the graph `choice` picks, run as
    `run` says), refusing a tokenizer that is not the model's."""
    tok = load_tokenizer(model_dir)
    model = open_graph(model_dir, choice, run, say=say)
    path = model.path
    if model.tokenizer_sha256 != tok.sha256:
        raise ArtifactError(f"{path} was exported with another tokenizer (sha256 {model.tokenizer_sha256[:12]}…) "
                            f"than {model_dir}/tokenizer.json ({tok.sha256[:12]}…); export again")
    if model.config.vocab_size != tok.vocab_size:
        raise ArtifactError(f"{path}: vocab_size {model.config.vocab_size} != tokenizer's {tok.vocab_size}")
    return Opened(model, tok, "onnx", model.provider, model.precision, model.cache)


def encode_prompts(tok: bpe.BPETokenizer, prompts: Sequence[str], n_ctx: int, truncate: bool = True,
                   warn: Callable[[str], None] = lambda m: None, config: ModelConfig | None = None
                   ) -> list[list[int]]:
    """Token ids of each prompt, as specials.prompt_ids encodes it for the model of `config` (its begin
    token first where its tokenizer adds one; None: none); an empty prompt starts from <|endoftext|>. A
    prompt longer than n_ctx keeps its last n_ctx tokens (after its begin token, kept), with a warning,
    or is refused when `truncate` is False."""
    if not prompts:
        raise UsageError("no prompt: give PROMPT arguments or --file PROMPTS.txt")
    out = []
    start = [] if config is None else specials.start_ids(config)
    for i, text in enumerate(prompts, 1):
        ids = (tok.encode(text) or [tok.eot_id]) if config is None else specials.prompt_ids(config, tok, text)
        if len(ids) > n_ctx:
            if not truncate:
                raise InputError(f"prompt {i} is {len(ids)} tokens, longer than the model's n_ctx {n_ctx} "
                                 "(drop --no-truncate to keep its last n_ctx tokens)")
            warn(f"prompt {i} is {len(ids)} tokens > n_ctx {n_ctx}: kept its last {n_ctx}")
            ids = [*start, *ids[len(start) - n_ctx:]]
        out.append(ids)
    return out


def read_prompt_file(path: Path) -> list[str]:
    """One prompt per non-empty line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not valid UTF-8 at byte offset {e.start}") from None
    prompts = [line for line in lines if line.strip()]
    if not prompts:
        raise InputError(f"{path}: empty prompt file (one prompt per line)")
    return prompts

