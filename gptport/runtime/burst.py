"""Greedy decode bursts: k greedy decode steps in one run of the graph, the argmax of each step fed to the
next on the device. No torch here.

At batch 1 on a GPU a replayed decode step is bound by the host as much as by the kernels: each step the
host sends the token, its position and its length, waits, reads the logits back and picks the next token
(benchmarks/gpu/decode_profile.py; design record 0037). For greedy decoding none of that needs the host:
`unroll` writes k copies of a one-token static-cache graph in one graph, step j's ArgMax the next step's
input ids, its positions and lengths the first step's plus j, its cache the previous step's present
(written in place inside the burst; its first and last steps copy the cache from and to the bound
buffers), and returns the k chosen tokens (`burst_ids`, (B, k)) instead of the logits. One run, one
upload of three small inputs and one read of k tokens a row then stand for k steps; replayed as one
CUDA graph per bucket like the decode step.

Bursts are asked for (DeviceModel.bursts, then prepare_bursts(), which makes their session: a second copy
of the weights on the device). The benchmarks time them beside single steps; nothing in the CLI turns
them on until a GPU run has measured them.

The host keeps what it must: end tokens, stop strings and max_new_tokens are applied to the k tokens as
they come back, the tokens past a row's end are dropped (their cache positions are past its length, so
nothing reads them), and sampling other than greedy steps one token at a time as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from gptport import contract
from gptport.errors import UsageError
from gptport.runtime.engine import Capability, Engine
from gptport.runtime.onnx_engine import OnnxModel

if TYPE_CHECKING:  # onnx loads when a graph is unrolled, not when the runtime starts
    import onnx

BURST_IDS = "burst_ids"  # (B, k) int64: the k greedy tokens after the input token
MAX_PROTO_BYTES = 2**31 - 1  # protobuf's limit on one message: a larger graph keeps its weights apart
STEPPED = (contract.INPUT_IDS, contract.POSITION_IDS, contract.SEQLENS_K)  # advanced from step to step


def unroll(proto: onnx.ModelProto, k: int) -> onnx.ModelProto:
    """`proto` (a one-token static-cache graph: the decode graph or a static-cache graph stepped one token a
    row) as k greedy steps in one graph: the same inputs, outputs burst_ids (B, k) and the presents of the
    last step. The weights are shared; every other value is renamed per step."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if k < 1:
        raise ValueError(f"a burst has at least one step, not {k}")
    graph = proto.graph
    n_layer = sum(1 for i in graph.input if i.name.startswith("past_key_values.")) // 2
    pasts, presents = contract.past_names(n_layer), contract.present_names(n_layer)
    names = {i.name for i in graph.input}
    missing = [n for n in (*STEPPED, contract.LOGITS_INDEX, *pasts) if n not in names]
    if missing or contract.LOGITS not in {o.name for o in graph.output}:
        raise ValueError(f"not a one-token static-cache graph: {', '.join(missing) or 'no logits'}")
    kept = {i.name for i in graph.initializer} | names - {*STEPPED, *pasts}  # the same in every step
    nodes: list[onnx.NodeProto] = []
    offsets: list[onnx.TensorProto] = []  # j for positions (int64) and lengths (int32), j = 1 .. k-1
    feeds = {n: n for n in (*STEPPED, *pasts)}  # step j's name for each stepped input
    chosen: list[str] = []
    for j in range(k):
        last = j == k - 1

        def named(value: str, j: int = j, last: bool = last, feeds: dict[str, str] = feeds) -> str:
            if value == "" or value in kept:
                return value
            if value in feeds:
                return feeds[value]
            if last and value in presents:
                return value  # the graph's outputs: bound to the cache buffers
            return f"{value}.s{j}"

        for node in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = f"{node.name or node.op_type}.s{j}"
            copy.input[:] = [named(v) for v in node.input]
            copy.output[:] = [named(v) for v in node.output]
            nodes.append(copy)
        token = f"burst.token.{j}"  # (B, 1) int64: ArgMax of the logits (B, 1, V), the first of a tie
        nodes.append(helper.make_node("ArgMax", [named(contract.LOGITS)], [token], axis=-1, keepdims=0))
        chosen.append(token)
        if not last:
            feeds = {contract.INPUT_IDS: token, **{p: named(q) for p, q in zip(pasts, presents, strict=True)}}
            for name, dtype in ((contract.POSITION_IDS, np.int64), (contract.SEQLENS_K, np.int32)):
                offsets.append(numpy_helper.from_array(np.array([j + 1], dtype=dtype), f"burst.{name}.plus{j + 1}"))
                nodes.append(helper.make_node("Add", [name, offsets[-1].name], [f"burst.{name}.{j + 1}"]))
                feeds[name] = f"burst.{name}.{j + 1}"  # the first step's + j + 1
    nodes.append(helper.make_node("Concat", chosen, [BURST_IDS], axis=1))  # (B, k)
    out = helper.make_graph(nodes, f"{graph.name}_burst{k}", list(graph.input),
                            [helper.make_tensor_value_info(BURST_IDS, TensorProto.INT64, [contract.BATCH, k]),
                             *[o for o in graph.output if o.name in presents]],
                            [*graph.initializer, *offsets])
    burst = helper.make_model(out, opset_imports=list(proto.opset_import), ir_version=proto.ir_version,
                              functions=list(proto.functions))
    del burst.metadata_props[:]
    burst.metadata_props.extend(proto.metadata_props)
    return burst


def session_like(session: ort.InferenceSession, proto: onnx.ModelProto, options: ort.SessionOptions
                 ) -> ort.InferenceSession:
    """A session of `proto` on `session`'s providers with their options (a CUDA session's
    enable_cuda_graph among them)."""
    given: dict[str, Any] = session.get_provider_options()
    chain = [(name, given.get(name, {})) for name in session.get_providers()]
    return ort.InferenceSession(proto.SerializeToString(), options, providers=chain)


def check_burst_size(bursts: int) -> None:
    """--bursts is 0 (one decode step a run) or at least 2 steps a run (a one-line usage error otherwise)."""
    if bursts < 0 or bursts == 1:
        raise UsageError(f"--bursts {bursts}: 0 (one step a run) or at least 2 steps a run")


def refusal(model: Engine, provider: str) -> str:
    """Why greedy bursts cannot run on `model` ("" when they can): they unroll export --cuda's one-token
    graphs, which only --provider cuda steps (cuda_engine.DeviceModel)."""
    if Capability.BURST in model.capabilities:
        return ""
    path = model.path if isinstance(model, OnnxModel) else None
    return (f"--bursts: greedy bursts unroll export --cuda's graphs on --provider cuda; {provider} opened "
            f"{path.name if path is not None else 'another graph'}")
