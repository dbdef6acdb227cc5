"""Hostile GGUF files made from a valid one, for the reader's fuzz test and benchmarks.stress.fuzz_gguf: a small GGUF
file written with the `gguf` package, then mutated by seeded rules (bytes flipped, the file cut short, an integer
of the header overwritten with an extreme, a length of gigabytes). `outcome` reads one as import-gguf reads it and
classes what happened: read, refused in one line naming the file (a GptportError), or anything else (a traceback
a user would see). The safetensors readers' fuzz is tests/support/safetensors_fuzz.py."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

from gptport.errors import GptportError

EXTREMES = (0, 1, 2**31 - 1, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**64 - 1)


def gguf_bytes() -> bytes:
    """A small valid GGUF file: metadata of each kind (a string, numbers, arrays) and F32, F16 and Q8_0 tensors."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "seed.gguf"
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_block_count(1)
        w.add_context_length(64)
        w.add_string("general.name", "seed")
        w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
        w.add_array("tokenizer.ggml.scores", [0.0, 1.0, 2.0])
        w.add_tensor("token_embd.weight", np.ones((3, 32), np.float32))
        w.add_tensor("blk.0.attn_norm.weight", np.ones(32, np.float16))
        q8_0 = gguf.GGMLQuantizationType.Q8_0
        q8 = gguf.quants.quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), q8_0)
        w.add_tensor("blk.0.ffn_up.weight", q8, raw_shape=q8.shape, raw_dtype=q8_0)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path.read_bytes()


def _flip(data: bytearray, rnd: random.Random) -> None:
    for _ in range(rnd.randint(1, 8)):
        data[rnd.randrange(len(data))] = rnd.randrange(256)


def _extreme_integer(data: bytearray, rnd: random.Random, end: int) -> None:
    """A 4- or 8-byte little-endian integer somewhere in the first `end` bytes set to an extreme."""
    width = rnd.choice((4, 8))
    at = rnd.randrange(max(1, min(end, len(data)) - width))
    value = rnd.choice(EXTREMES) % (2 ** (8 * width))
    data[at:at + width] = value.to_bytes(width, "little")


def mutate_gguf(seed: bytes, rnd: random.Random) -> bytes:
    """One seeded mutation of a GGUF file (its header is where counts, lengths, types and offsets live)."""
    data = bytearray(seed)
    header_end = len(seed) - 2 * 32 * 4  # roughly where the tensor data starts
    rule = rnd.randrange(4)
    if rule == 0:
        _flip(data, rnd)
    elif rule == 1:
        data = data[:rnd.randrange(len(data))]
    elif rule == 2:
        for _ in range(rnd.randint(1, 3)):
            _extreme_integer(data, rnd, header_end)
    else:
        _flip(data, rnd)
        _extreme_integer(data, rnd, header_end)
    return bytes(data)


def outcome(read: Callable[[Path], object], path: Path) -> tuple[str, str]:
    """("read", "") / ("refused", the message) / ("crashed", the exception): a refusal must be one line naming
    the file (else it counts as crashed)."""
    try:
        read(path)
    except GptportError as e:
        message = str(e)
        if "\n" in message or str(path) not in message:
            return "crashed", f"refusal not one line naming the file: {message[:200]}"
        return "refused", message
    except Exception as e:  # noqa: BLE001 - what the fuzz looks for: any other exception is a finding
        return "crashed", f"{type(e).__name__}: {str(e)[:200]}"
    return "read", ""


def read_gguf(path: Path) -> None:
    """What import-gguf reads of a file before it writes anything: the header, every metadata value, the tensor
    types, every tensor dequantized."""
    from gptport.export.gguf_file import GGUFFile

    f = GGUFFile(path)
    for key in f.keys:
        f.value(key)
    f.check_types()
    for name in f.tensors:
        f.dequantize(name)
