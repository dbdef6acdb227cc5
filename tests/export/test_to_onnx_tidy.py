"""`to_onnx` tidies the traced graph with onnxscript's optimizer and only the rewrite rules that change gptport's
graphs (torch_to_onnx.RULES); torch.onnx.export's own optimize=True tries onnxscript's whole default rule set. Both
must give the same graph, node for node, for GPT-2's layers and the Llama family's: a rule onnxscript adds or
changes that matters to these graphs fails here, naming the operators that differ."""

from __future__ import annotations

import collections

import onnx
import pytest
import torch

from gptport.config import ModelConfig
from gptport.export.torch_to_onnx import RULES, to_onnx
from gptport.training.model import GPT

SHAPE = {"vocab_size": 256, "n_ctx": 16, "d_model": 32, "n_layer": 1, "n_head": 4}
FAMILIES = {"gpt2": {},
            "qwen3": {"pos_encoding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "n_kv_head": 2, "bias": False,
                      "qk_norm": True, "head_dim": 16}}


def nodes(proto: onnx.ModelProto) -> list[tuple[str, str, int, int]]:
    """Each node's operator, domain and numbers of inputs and outputs, in order."""
    return [(n.op_type, n.domain, len(n.input), len(n.output)) for n in proto.graph.node]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_rules_kept_give_the_graph_of_the_whole_rule_set(family: str) -> None:
    torch.manual_seed(0)
    model = GPT(ModelConfig(**SHAPE, **FAMILIES[family])).eval()  # type: ignore[arg-type]
    ours, whole = to_onnx(model, 18, RULES), to_onnx(model, 18, None)
    differ = collections.Counter(n.op_type for n in ours.graph.node)
    differ.subtract(n.op_type for n in whole.graph.node)
    assert nodes(ours) == nodes(whole), {op: n for op, n in differ.items() if n}
    assert sorted(i.name for i in ours.graph.initializer) == sorted(i.name for i in whole.graph.initializer)
