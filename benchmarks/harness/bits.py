"""Bits per weight of a graph's or a GGUF's matrices, by role, so that int4 schemes are compared at equal size.

Roles: "blocks" (the layers' matrices: q|k|v, o, gate|up, down), "head" (the output projection) and "embedding"
(the token table). A gptport ONNX graph's weights are its MatMulNBits' packed codes, scales and zero points (or
a float MatMul's matrix), the head the one whose output is the logits, the embedding the Gather of "wte.weight";
a GGUF's are its tensors ("blk.3.ffn_down.weight", "output.weight", "token_embd.weight"), counted in their
stored bytes (`gguf`'s reader). Norms, biases and other vectors are left out. No torch."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

Sizes = dict[str, tuple[int, int]]  # role -> (bytes, weights)
GGUF_BLOCK = re.compile(r"blk\.\d+\.(attn_(q|k|v|qkv|output)|ffn_(gate|up|down|gate_up))\.weight$")


def _add(sizes: Sizes, role: str, nbytes: int, weights: int) -> None:
    b, w = sizes.get(role, (0, 0))
    sizes[role] = (b + nbytes, w + weights)


def onnx_sizes(path: Path) -> Sizes:
    """{role: (bytes, weights)} of the gptport graph at `path` (its weights loaded, one graph at a time)."""
    import onnx

    from gptport import contract

    proto = onnx.load(str(path))
    inits = {i.name: i for i in proto.graph.initializer}

    def nbytes(name: str) -> int:
        t = inits[name]
        return int(np.prod(t.dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize

    sizes: Sizes = {}
    for n in proto.graph.node:
        role = "head" if set(n.output) & set(contract.HEADS) else "blocks"
        if n.op_type == "MatMulNBits":
            a = {x.name: x.i for x in n.attribute}
            stored = sum(nbytes(x) for x in n.input[1:4] if x in inits)  # codes, scales, zero points
            _add(sizes, role, stored, a["K"] * a["N"])
        elif n.op_type == "MatMul" and n.input[1] in inits:
            _add(sizes, role, nbytes(n.input[1]), int(np.prod(inits[n.input[1]].dims)))
        elif n.op_type == "Gather" and n.input[0] in inits and n.input[0].startswith("wte"):
            _add(sizes, "embedding", nbytes(n.input[0]), int(np.prod(inits[n.input[0]].dims)))
    return sizes


def gguf_sizes(path: Path) -> Sizes:
    """{role: (bytes, weights)} of the GGUF at `path` (a tied head is the embedding: no "head" role)."""
    import gguf

    sizes: Sizes = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        role = ("blocks" if GGUF_BLOCK.search(t.name) else "head" if t.name == "output.weight"
                else "embedding" if t.name == "token_embd.weight" else None)
        if role:
            _add(sizes, role, int(t.n_bytes), int(t.n_elements))
    return sizes


def summary(sizes: Sizes, file_bytes: int, parameters: int) -> dict[str, float]:
    """A results row's figures: bits per weight of each role, and of the whole file over the model's parameters
    (llama.cpp's "BPW": its file's bits over its parameters, a tied head counted once)."""
    out = {f"bpw_{role}": 8 * b / w for role, (b, w) in sorted(sizes.items()) if w}
    out["bpw_file"] = 8 * file_bytes / parameters
    return out
