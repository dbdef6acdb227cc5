"""torch -> ONNX: the model traced by torch.export under the I/O contract (gptport/contract.py), its
dimensions named as the contract says and a tied embedding stored once. export.py checks and writes it."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator, Sequence

import numpy as np
import onnx
import onnx_ir as ir
import torch
from onnx_ir.passes import common as common_passes
from onnxscript import optimizer, rewriter
from onnxscript.rewriter import onnx_fusions
from onnxscript.rewriter.pattern import RewriteRule
from onnxscript.rewriter.rules import common as common_rules
from torch.export import Dim

from gptport import contract
from gptport.errors import ValidationError
from gptport.export import trace_cache
from gptport.training.model import GPT


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter logs and warns about things that are not the user's concern (torchvision ops...)."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


# The rules of onnxscript's default rewrite set that change gptport's graphs (of every family; the rest never match
# them). torch.onnx.export(optimize=True) tries the whole set on every node, twice, for the same graph: the time
# it costs is benchmarks/export/to_onnx.py's (design record 0040).
RULES = (common_rules.collapse_slice_rule, common_rules.collapse_slice2_rule, common_rules.squeeze_reshape_1d_rule,
         common_rules.unsqueeze_unsqueeze_rule, common_rules.reshape_reshape_rule, common_rules.cast_cast_rule,
         common_rules.no_op_cast_rule, common_rules.no_op_expand_rule, common_rules.no_op_transpose_rule,
         common_rules.transpose_transpose_rule)


def to_onnx(model: GPT, opset: int, rules: Sequence[RewriteRule] | None = RULES) -> onnx.ModelProto:
    """Export with torch.export's dynamic shapes; batch, sequence and past traced at values >= 2; the graph
    tidied with `rules` (None: by torch.onnx.export's own optimize, onnxscript's default rule set, for
    benchmarks/export/to_onnx.py to compare). Read from GPTPORT_TRACE_CACHE's folder where it names one and
    holds this model's trace (trace_cache.py)."""
    named = "RULES" if rules is RULES else "default" if rules is None else None  # (a set of the caller's: None)
    return trace_cache.traced(model, opset, named, lambda: _trace(model, opset, rules))


def _trace(model: GPT, opset: int, rules: Sequence[RewriteRule] | None) -> onnx.ModelProto:
    """to_onnx's trace, each time."""
    cfg = model.cfg
    B, T, P = 2, 3, min(4, max(2, cfg.n_ctx - 3))
    ids = torch.randint(0, cfg.vocab_size, (B, T))
    mask = torch.ones(B, P + T, dtype=torch.long)
    pos = torch.arange(P, P + T).expand(B, T).contiguous()
    past = [(torch.zeros(B, cfg.n_kv_head, P, cfg.head_dim), torch.zeros(B, cfg.n_kv_head, P, cfg.head_dim))
            for _ in range(cfg.n_layer)]
    batch, seq = Dim(contract.BATCH), Dim(contract.SEQUENCE)
    past_len, total = Dim(contract.PAST), Dim(contract.TOTAL)
    shapes = ({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq},
              [({0: batch, 2: past_len}, {0: batch, 2: past_len}) for _ in range(cfg.n_layer)])
    with _quiet_exporter():
        program = torch.onnx.export(
            model, (ids, mask, pos, past), dynamic_shapes=shapes, dynamo=True, opset_version=opset,
            input_names=contract.input_names(cfg.n_layer), output_names=contract.output_names(cfg.n_layer),
            optimize=rules is None, verbose=False)
        if rules is not None:
            tidy(program.model, rules)
    proto = program.model_proto
    _name_total_dims(proto)
    if cfg.tie_embeddings:
        untie_folded_head(proto)
    return proto


def tidy(model: ir.Model, rules: Sequence[RewriteRule] = RULES) -> None:
    """What torch.onnx.export's optimize=True does (onnxscript's optimize_ir, then its ONNX fusions), in place,
    with `rules` for the default rewrite rules."""
    optimizer.inline(model)
    for _ in range(2):  # as optimize_ir: fold, rewrite, drop what is unused; twice
        optimizer.fold_constants(model, onnx_shape_inference=True)
        rewriter.rewrite(model, rules)
    ir.passes.Sequential(
        common_passes.RemoveUnusedNodesPass(),
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common_passes.LiftSubgraphInitializersToMainGraphPass(),
        common_passes.DeduplicateInitializersPass(),
        common_passes.CommonSubexpressionEliminationPass(),
        common_passes.OutputFixPass(),
        common_passes.NameFixPass(),
    )(model)
    onnx_fusions.fuse(model)


def _name_total_dims(proto: onnx.ModelProto) -> None:
    """The exporter names present's length 'past_sequence + sequence'; the contract says total_sequence."""
    for value in [*proto.graph.input, *proto.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param.replace(" ", "") in (f"{contract.PAST}+{contract.SEQUENCE}",
                                                  f"{contract.SEQUENCE}+{contract.PAST}"):
                dim.dim_param = contract.TOTAL


def untie_folded_head(proto: onnx.ModelProto) -> None:
    """Store the tied embedding once. The exporter either reads the head as Transpose(embedding)
    (stored once already) or folds that transpose into a second copy of the embedding; in the latter
    case the copy is dropped and a Transpose node, which onnxruntime folds when it loads, takes its place."""
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    head = next((n for n in graph.node if contract.LOGITS in n.output and n.op_type == "MatMul"), None)
    gather = next((n for n in graph.node if n.op_type == "Gather" and n.input[1] == contract.INPUT_IDS), None)
    if head is None or gather is None or gather.input[0] not in inits:
        raise ValidationError("export: unexpected graph (no head MatMul or token Gather); cannot check tied weights")
    if head.input[1] not in inits:
        return  # computed from the embedding: stored once
    folded = onnx.numpy_helper.to_array(inits[head.input[1]])
    wte = onnx.numpy_helper.to_array(inits[gather.input[0]])
    if folded.shape != wte.T.shape or not np.array_equal(folded, wte.T):
        return
    graph.initializer.remove(inits[head.input[1]])
    transpose = onnx.helper.make_node("Transpose", [gather.input[0]], [head.input[1]], perm=[1, 0],
                                      name="tied_head_transpose")
    graph.node.insert(list(graph.node).index(head), transpose)
