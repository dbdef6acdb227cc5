"""The files benchmarks.decode.int4_scale measures, made once per shape under WORK/int4_scale/<shape> and kept (each
step skipped when its output is there; the Hugging Face directory is benchmarks.export.scale's, reused):

- gptport/: `gptport import-hf HF`, then `gptport export --precision int4 --no-gate` (the builder's MatMulNBits
  graphs straight from the weights: model.int4.onnx and model.int4.static.onnx).
- model.q4_0.gguf, model.q4_k_m.gguf: the same weights as an F32 GGUF (`gptport export-gguf --outtype f32`),
  quantized by llama.cpp's llama-quantize; the F32 file is removed once both are made (it is the largest).
- genai-int4/: onnxruntime-genai's builder (`-p int4 -e cpu`) on the same Hugging Face directory, in the
  builder's venv (benchmarks.export.scale.genai_venv).
- levers/<name>/: gptport's int4 static-cache graph built again with another MatMulNBits setting (LEVERS: block
  length, accuracy level, the head's bits), beside links to gptport/'s config, tokenizer and weights, so that
  `gptport bench` reads it as it reads the export's graph."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.harness.models import WORK
from benchmarks.harness.run import say
from gptport.export.nbits import NBits

CHILD_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"}
GGUF_TYPES = {"q4_0": "Q4_0", "q4_k_m": "Q4_K_M"}  # file suffix -> llama-quantize's type name
# gptport's int4 export of a large model (variants.LADDER's first direct rung): blocks of 128, int8 compute,
# the head at 8 bits; the levers name their settings in full
EXPORTED = NBits(4, 128, 4, head_bits=8)
LEVERS = {"b32-head8": NBits(4, 32, 4, head_bits=8), "b64-head8": NBits(4, 64, 4, head_bits=8),
          "b32-head4": NBits(4, 32, 4), "b64-head4": NBits(4, 64, 4), "b128-head4": NBits(4, 128, 4),
          "b32-acc0": NBits(4, 32, 0, head_bits=8, head_level=4)}  # the head's level kept: 8-bit acc0 is slow


def _run(args: list[str], log: Path) -> None:
    """`args` with output to `log`; a failure stops the benchmark in one line naming the log."""
    import os

    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as f:
        code = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT, env=os.environ | CHILD_ENV).returncode
    if code:
        raise SystemExit(f"{Path(args[0]).name} {' '.join(args[1:4])} ... failed ({code}); see {log}")


def gptport_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gptport", *args]


def gptport_dir(hf: Path, work: Path) -> Path:
    """work/gptport: the shape imported and exported to int4 (--no-gate: random weights)."""
    m = work / "gptport"
    if {_block(m / "model.int4.onnx"), _block(m / "model.int4.static.onnx")} != {EXPORTED.block}:  # or an older
        say(f"{work.name}: gptport import-hf + export --precision int4 --no-gate")
        _run(gptport_cmd("import-hf", str(hf), "--out", str(m), "--force"), work / "logs" / "import.log")
        _run(gptport_cmd("export", str(m), "--precision", "int4", "--no-gate", "--force"), work / "logs" / "export.log")
    return m


def _block(graph: Path) -> int | None:
    """The block length of the first MatMulNBits of `graph` (None: no such file)."""
    import onnx

    if not graph.is_file():
        return None
    node = next(n for n in onnx.load(str(graph), load_external_data=False).graph.node if n.op_type == "MatMulNBits")
    return next(a.i for a in node.attribute if a.name == "block_size")


def ggufs(m: Path, work: Path, quantize: Path) -> dict[str, Path]:
    """The Q4_0 and Q4_K_M files of gptport's F32 GGUF of `m`, by file suffix."""
    out = {kind: work / f"model.{kind}.gguf" for kind in GGUF_TYPES}
    missing = [k for k, p in out.items() if not p.is_file()]
    if missing:
        f32 = work / "model.f32.gguf"
        if not f32.is_file():
            say(f"{work.name}: gptport export-gguf --outtype f32")
            _run(gptport_cmd("export-gguf", str(m), "--outtype", "f32", "--out", str(f32), "--force"),
                 work / "logs" / "export-gguf.log")
        for kind in missing:
            say(f"{work.name}: llama-quantize {GGUF_TYPES[kind]}")
            tmp = out[kind].with_suffix(".tmp")
            _run([str(quantize), str(f32), str(tmp), GGUF_TYPES[kind]], work / "logs" / f"quantize-{kind}.log")
            tmp.rename(out[kind])
        f32.unlink()
    return out


def genai_folder(python: Path, hf: Path, work: Path) -> Path:
    """work/genai-int4: onnxruntime-genai's builder's int4 CPU model of the same directory."""
    out = work / "genai-int4"
    if not (out / "genai_config.json").is_file():
        say(f"{work.name}: onnxruntime-genai builder -p int4 -e cpu")
        cache = work / "genai-cache"
        shutil.rmtree(out, ignore_errors=True)
        _run([str(python), "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out), "-p", "int4",
              "-e", "cpu", "-c", str(cache)], work / "logs" / "genai-build.log")
        shutil.rmtree(cache, ignore_errors=True)
    return out


def lever_dir(m: Path, work: Path, name: str) -> Path:
    """work/levers/NAME: gptport's int4 static-cache graph with LEVERS[name], beside links to m's other files."""
    from gptport import atomic, contract
    from gptport.export import graph_write
    from gptport.export.exporter import DEFAULT_TOL, _open

    d = work / "levers" / name
    graph = d / "model.int4.static.onnx"
    if graph.is_file():
        return d
    say(f"{work.name}: the int4 static-cache graph with {name} ({LEVERS[name]})")
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    for f in m.iterdir():
        if f.is_file() and not f.name.startswith(("model.int4", ".")) and f.suffix != ".gguf":
            (d / f.name).symlink_to(f.resolve())
    job = _open(d, gate=False, tol=DEFAULT_TOL, say=lambda message: None)
    tmp = atomic.temp_name(graph)
    job.build(contract.CACHE_STATIC, tmp, "int4", LEVERS[name], gated=False)
    graph_write.place(tmp, graph)  # with its external data, the references renamed
    return d


def shape_dir(shape: str) -> Path:
    return WORK / "int4_scale" / shape
