"""onnxruntime's OpenVINO execution provider (the `onnxruntime-openvino` package), opened strictly: the
whole graph runs on OpenVINO or the session is refused, naming the nodes, never a silent split with the
CPU provider; and at the model's own precision (`precision=ACCURACY`: on CPUs with AMX, OpenVINO would
otherwise compute in bf16). The contract graphs exported with --no-optimize take standard operators only,
for GPT-2's layers and the Llama family's alike (RMSNorm, rotary positions, SwiGLU, grouped key/value
heads); the static-cache graphs are built on onnxruntime's GroupQueryAttention, which OpenVINO lacks, so
`--provider openvino` runs the contract graph. No torch here."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from gptport.errors import ArtifactError

ORT_NAME = "OpenVINOExecutionProvider"
OPTIONS = {"device_type": "CPU", "precision": "ACCURACY"}
STRICT = {"session.disable_cpu_ep_fallback": "1"}  # a node OpenVINO cannot take fails the session
TAKES = {("com.microsoft", "MatMulNBits")}  # onnxruntime contrib ops OpenVINO runs (8-bit weights, as float32)
LACKS = {("", "IsNaN")}  # standard ops its ONNX frontend lacks (the NaN guard of graphs exported before 0.x)
STATIC_ONLY = {("com.microsoft", "GroupQueryAttention")}  # what the static-cache graphs attend with
INSTALL = ("install onnxruntime-openvino in an environment of its own: it replaces onnxruntime's module "
           "(docs/guide/openvino-ort.md)")


def foreign_nodes(path: Path) -> Counter[tuple[str, str]]:
    """(domain, op) -> count of the graph's nodes OpenVINO cannot take: onnxruntime's own fused operators
    (SkipLayerNormalization, FastGelu, ...) and the standard ones its frontend lacks."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    ops = Counter((n.domain if n.domain != "ai.onnx" else "", n.op_type) for n in graph.node)
    return Counter({k: v for k, v in ops.items() if (k[0] != "" and k not in TAKES) or k in LACKS})


def check_graph(path: Path) -> None:
    """Refuse a graph OpenVINO cannot take whole, in one line naming its nodes and what to do."""
    bad = foreign_nodes(path)
    if bad:
        nodes = ", ".join(f"{op} x{n}" for (_, op), n in sorted(bad.items(), key=lambda kv: -kv[1]))
        remedy = ("it is a static-cache graph, built on onnxruntime's attention: use --kv-cache concat (the contract "
                  "graph, exported with --no-optimize)" if set(bad) & STATIC_ONLY else
                  "export it again with `gptport export --no-optimize` (standard operators only)")
        raise ArtifactError(f"{path}: OpenVINO cannot run these nodes ({nodes}), and a graph split between OpenVINO "
                            f"and the CPU is refused; {remedy}")
