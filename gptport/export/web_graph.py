"""The graph export-web ships, and the tokens the page must reproduce with it. One contract graph of the model
directory: fp32, or a variant that passed export's accuracy gate (int8, int4: MatMulNBits with 8-bit and 4-bit
weights, which onnxruntime-web's wasm and WebGPU builds run). Its batch dimension is renamed for transformers.js,
and a variant's MatMulNBits are set to float compute (accuracy_level 0): onnxruntime-web's wasm build has no
int8-compute kernel and computes them in float whatever the attribute says, so with it set the reference tokens,
computed here on onnxruntime's CPU provider, are those of the arithmetic the browser does. The weights are the
gated ones; float activations are the more exact side of the gate's int8 compute. A graph whose weights lie in
external data (a model past graph_write.external's size) ships them the same way, its data file copied beside it
as transformers.js names it (`model.onnx_data`), never loaded: the page passes it to onnxruntime-web's
`externalData`. No torch here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gptport import contract, provenance, specials
from gptport import tokenizer as bpe
from gptport.errors import ArtifactError, UsageError, escaped
from gptport.runtime import external_data, onnx_engine

# Where transformers.js looks for the decoder of its dtypes fp32, q8 and q4.
GRAPHS = {"fp32": "onnx/model.onnx", "int8": "onnx/model_quantized.onnx", "int4": "onnx/model_q4.onnx"}
PRECISIONS = ("auto", *GRAPHS)
AUTO_FP32_BYTES = 100 * 2**20  # auto ships the fp32 graph up to this size, else a gated variant
WEB_BATCH = "batch_size"  # transformers.js sizes its empty cache by a dimension of this name
DATA_SUFFIX = "_data"  # a shipped graph's external data: onnx/model.onnx_data, transformers.js's name for it
FLOAT_COMPUTE = 0  # MatMulNBits' accuracy_level: activations in float, as onnxruntime-web computes them
REFERENCE_PROMPTS = ("To be or not", "The ", "")  # "": the begin token alone (else <|endoftext|>)
REFERENCE_TOKENS = 32


def gated(meta: dict[str, str]) -> bool:
    """Whether a graph passed export's check for its precision (gptport.gated; an fp32 graph written before
    the key was recorded passed parity too, or export would not have written it)."""
    return meta.get(contract.META_GATED, "true" if meta.get(contract.META_PRECISION) == "fp32" else "") == "true"


def choose(model_dir: Path, precision: str) -> tuple[str, Path, dict[str, str]]:
    """The precision, file and metadata of the graph to ship: `precision`'s, once found and gated; for auto,
    fp32 where its graph is at most AUTO_FP32_BYTES (exact, and small), else the gated int8 variant, else the
    gated int4. Refused naming the file and the export that makes it."""
    if precision not in PRECISIONS:
        raise UsageError(f"--precision {precision!r}: choose from {', '.join(PRECISIONS)} (the browser runs the "
                         "fp32 graph and the int8 and int4 variants; fp16 is for CUDA)")
    fp32 = model_dir / contract.onnx_file("fp32", contract.CACHE_CONCAT)
    if not fp32.is_file():
        raise ArtifactError(f"{fp32}: missing; run `gptport export {model_dir}` first")
    if precision == "auto":
        if graph_bytes(fp32) <= AUTO_FP32_BYTES:
            return "fp32", fp32, onnx_engine.file_metadata(fp32)
        for candidate in ("int8", "int4"):
            path = model_dir / contract.onnx_file(candidate, contract.CACHE_CONCAT)
            meta = onnx_engine.file_metadata(path) if path.is_file() else {}
            if gated(meta):
                return candidate, path, meta
        raise UsageError(f"{fp32}: {graph_bytes(fp32) / 2**20:.0f} MiB of fp32 is too much for a browser bundle "
                         f"and {model_dir} has no gated int8 or int4 variant: run `gptport export {model_dir} "
                         "--precision fp32,int8` (its accuracy gate checks it), or pass --precision fp32")
    path = model_dir / contract.onnx_file(precision, contract.CACHE_CONCAT)
    if not path.is_file():
        raise UsageError(f"--precision {precision}: {model_dir} has no {path.name}; run `gptport export {model_dir} "
                         f"--precision fp32,{precision}` first")
    meta = onnx_engine.file_metadata(path)
    if not gated(meta):
        raise UsageError(f"--precision {precision}: {path} was written with --no-gate, unchecked; export-web "
                         f"ships gated graphs only: run `gptport export {model_dir} --precision fp32,{precision}`")
    return precision, path, meta


def checked_tokenizer(model_dir: Path, graph: Path, meta: dict[str, str]) -> bpe.BPETokenizer:
    """The directory's tokenizer, once `graph` is known to be made from the directory's weights, config and
    tokenizer (what the runtime's loader checks before it runs a graph)."""
    from gptport.runtime.loader import load_tokenizer

    provenance.check(model_dir, graph, meta)
    tok = load_tokenizer(model_dir)
    if meta.get(contract.META_TOKENIZER) != tok.sha256:
        raise ArtifactError(f"{graph} was exported with another tokenizer than {model_dir}/{bpe.TOKENIZER_FILE}; "
                            "export again")
    return tok


def graph_bytes(path: Path) -> int:
    """Bytes of the graph at `path` with its external data file, if it has one."""
    data = data_file(path)
    return path.stat().st_size + (data.stat().st_size if data is not None else 0)


def data_file(src: Path) -> Path | None:
    """The one external data file the graph at `src` reads (None: its weights are inline); refused in one line
    when its tensors name more than one file, or one that is missing or lies outside its directory."""
    external_data.check(src)
    if not external_data.mentions_external_data(src):  # an inline graph is not parsed here
        return None
    names = sorted({location for _, location in external_data.locations(src)})
    if not names:
        return None
    if len(names) > 1:
        raise ArtifactError(f"{src}: its external data lies in {len(names)} files ({escaped(', '.join(names))}); "
                            "export-web ships a graph with one")
    data = src.parent / names[0]
    if not data.is_file():
        raise ArtifactError(f"{src}: its external data file {escaped(names[0])} is missing; export again")
    return data


def write(src: Path, dst: Path) -> tuple[int, Path | None]:
    """The graph at `src` written to `dst` with its batch dimension named WEB_BATCH and its MatMulNBits set to
    float compute; nothing else changes. A graph with external data is read without it, its data file copied
    (bytes and offsets as they are) to `dst` + DATA_SUFFIX, which its tensors then name. Returns how many
    MatMulNBits were set, and the data file written (None: the weights are inline)."""
    import shutil

    import onnx

    data = data_file(src)
    model = onnx.load(str(src), load_external_data=False)
    shipped = dst.with_name(dst.name + DATA_SUFFIX) if data is not None else None
    if shipped is not None:
        for init in model.graph.initializer:
            for entry in init.external_data:
                if entry.key == "location":
                    entry.value = shipped.name
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == contract.BATCH:
                dim.dim_param = WEB_BATCH
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits" and n.domain == "com.microsoft"]
    for node in nbits:
        kept = [a for a in node.attribute if a.name != "accuracy_level"]
        del node.attribute[:]
        node.attribute.extend([*kept, onnx.helper.make_attribute("accuracy_level", FLOAT_COMPUTE)])
    dst.parent.mkdir(parents=True, exist_ok=True)
    if data is not None and shipped is not None:
        shutil.copyfile(data, shipped)
    onnx.save(model, str(dst))
    return len(nbits), shipped


def reference_tokens(graph: Path, tok: bpe.BPETokenizer) -> tuple[list[dict[str, Any]], onnx_engine.OnnxModel]:
    """Greedy tokens of the graph as shipped, on onnxruntime's CPU provider: prompts encoded as gptport encodes
    them (the begin token first where the tokenizer adds one), ending on any of the model's end tokens. With
    the opened graph, whose recorded config sizes the page's cache."""
    from gptport.runtime.generate import generate
    from gptport.runtime.sampling import Sampling

    engine = onnx_engine.load(graph, "cpu")
    cfg = engine.config
    if cfg.vocab_size != tok.vocab_size:
        raise ArtifactError(f"{graph}: vocab_size {cfg.vocab_size} != the tokenizer's {tok.vocab_size}")
    out = []
    for prompt in REFERENCE_PROMPTS:
        ids = specials.prompt_ids(cfg, tok, prompt)
        row = generate(engine, [ids], REFERENCE_TOKENS, Sampling(), specials.end_ids(cfg, tok))[0]
        out.append({"prompt": prompt, "prompt_ids": ids, "token_ids": row.new_ids})
    return out, engine
