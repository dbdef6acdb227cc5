"""torch -> ONNX's time: gptport's `to_onnx` (torch.onnx.export with optimize=False, then `tidy()`: onnxscript's
optimizer with the few rewrite rules that change gptport's graphs) against torch.onnx.export's own optimize=True
(onnxscript's whole default rule set), and whether both give the same graph.

- `smollm2`: SmolLM2-135M-Instruct imported from llama.cpp's Q4_1 file (benchmarks/harness/smollm2.py): 30
  layers, the graph the README's walk-through exports.
- `tiny-llama`: a seeded random model of the Llama family (RoPE, RMSNorm, SwiGLU, 4 query over 2 key/value heads,
  d 64, 2 layers), the size the project's tests export.

Each round exports each model both ways, the order alternating between rounds. Recorded per export: its wall time,
the number of nodes, and whether the node sequence (operator, domain, inputs, outputs) and the initializers'
count equal the other way's. A table of the kept rounds' medians follows.

    python -m benchmarks.export.to_onnx [--models smollm2,tiny-llama] [--rounds 2]
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import onnx
import torch

from benchmarks.harness import cli, results, smollm2
from benchmarks.harness.run import Round, Run, say
from gptport.config import ModelConfig
from gptport.export.torch_to_onnx import RULES, to_onnx
from gptport.training.model import GPT

MODELS = ("smollm2", "tiny-llama")
WAYS = ("optimize=True", "tidy")
OPSET = 18
TINY = {"vocab_size": 512, "n_ctx": 32, "d_model": 64, "n_layer": 2, "n_head": 4, "n_kv_head": 2,
        "pos_encoding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False}


def model_of(name: str) -> GPT:
    """The torch model `name` names, in eval mode."""
    if name == "smollm2":
        from gptport import tokenizer as bpe
        from gptport.training.checkpoint import load_model

        d = smollm2.imported()
        return load_model(d, bpe.load(d))[0].eval()
    torch.manual_seed(0)
    return GPT(ModelConfig(**TINY)).eval()  # type: ignore[arg-type]


def signature(proto: onnx.ModelProto) -> tuple[list[tuple[str, str, int, int]], int]:
    """The node sequence (operator, domain, inputs, outputs) and the initializers' count."""
    return [(n.op_type, n.domain, len(n.input), len(n.output)) for n in proto.graph.node], len(proto.graph.initializer)


def measured(model: GPT, way: str) -> tuple[dict[str, Any], tuple[Any, int]]:
    """One export `way`: its time and node count, and its graph's signature."""
    start = time.perf_counter()
    proto = to_onnx(model, OPSET, None if way == "optimize=True" else RULES)
    wall = time.perf_counter() - start
    return {"export_s": round(wall, 2), "nodes": len(proto.graph.node)}, signature(proto)


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    names = args.models.split(",")
    if unknown := [n for n in names if n not in MODELS]:
        raise SystemExit(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    run = Run()
    for name in names:
        model = model_of(name)
        rnd: Round
        for rnd in run.series(args.rounds, model=name):
            graphs = {}
            for way in rnd.order(WAYS):
                rnd.data[way], graphs[way] = measured(model, way)
                say(f"{name} {way}: {rnd.data[way]}")
            rnd.data["same_graph"] = graphs[WAYS[0]] == graphs[WAYS[1]]
    rows = []
    for name in names:
        kept = run.kept(model=name)
        row: dict[str, Any] = {"model": name, "rounds_kept": len(kept)}
        for way in WAYS:
            row[f"{way} s"] = round(statistics.median(r.data[way]["export_s"] for r in kept), 1)
        row["nodes"] = kept[0].data["tidy"]["nodes"]
        row["saved"] = f"{1 - row['tidy s'] / row['optimize=True s']:.0%}"
        row["same graph"] = all(r.data["same_graph"] for r in run.rounds if r.tags["model"] == name)
        rows.append(row)
    settings = cli.settings(args, opset=OPSET, rules=len(RULES), torch=torch.__version__)
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label),
                  args.results)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
