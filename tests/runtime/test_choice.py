"""GraphChoice and RunOptions: the command-line words parsed once, refused in one line naming the option,
and the members usable wherever the words were (file names, f-strings, JSON, dict keys)."""

from __future__ import annotations

import json

import pytest

from gptport import contract
from gptport.errors import UsageError
from gptport.runtime.choice import CacheLayout, GraphChoice, KvDtype, Precision, RunOptions, Spin


def test_parse_gives_the_members_of_the_words() -> None:
    choice = GraphChoice.parse("int8", "static", "int8", "onnx")
    assert (choice.precision, choice.cache, choice.kv_dtype) == (Precision.INT8, CacheLayout.STATIC, KvDtype.INT8)
    assert GraphChoice.parse() == GraphChoice()
    assert RunOptions.parse("cuda", 2, "step", True) == RunOptions("cuda", 2, Spin.STEP, True)


@pytest.mark.parametrize(("words", "message"), [
    ({"precision": "int3"}, "--precision 'int3' is unknown; choose from fp32, int8, int4, fp16"),
    ({"cache": "ring"}, "--kv-cache 'ring' is unknown; choose from auto, static, concat"),
    ({"kv_dtype": "fp8"}, "--kv-dtype 'fp8' is unknown; choose from float32, int8"),
    ({"fmt": "gguf"}, "--graph-format 'gguf' is unknown; choose from onnx, ort"),
])
def test_an_unknown_word_is_refused_naming_its_option(words: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError) as e:
        GraphChoice.parse(**words)
    assert str(e.value) == message


def test_an_unknown_spin_is_refused() -> None:
    with pytest.raises(UsageError, match="^--spin 'busy' is unknown; choose one of always, step, never$"):
        RunOptions.parse(spin="busy")


def test_members_read_as_their_words() -> None:
    p = Precision.INT4
    assert f"{p}" == str(p) == "int4" and json.dumps(p) == '"int4"' and {"int4": 1}[p] == 1
    assert contract.onnx_file(p, CacheLayout.STATIC) == "model.int4.static.onnx"
    assert tuple(Precision) == contract.PRECISIONS and tuple(KvDtype) == contract.KV_DTYPES
