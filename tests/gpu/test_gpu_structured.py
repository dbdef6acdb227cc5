"""The server's scheduler on the CUDA provider: constrained (JSON schema, regex) and free requests decoded
together give the CPU provider's greedy tokens on the same graph, and every constrained reply that ends
with `stop` matches its constraint. Skips, saying why, where the CUDA provider does not run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gptport.runtime.choice import GraphChoice, RunOptions
from gptport.runtime.constraint import Grammars, Masks, Spec
from gptport.runtime.loader import open_model
from gptport.runtime.providers import probe
from gptport.runtime.sampling import Sampling
from gptport.runtime.slot_layout import open_slots
from gptport.serve.engine.events import Failure
from gptport.serve.engine.scheduler import Choice, Finish
from tests.support.scheduling import Run

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "age", "ok"], "additionalProperties": False}
REGEX = r"[a-z]{2,6}( [a-z]{2,6}){1,3}\."
JOBS: list[tuple[str, Spec | None]] = [("ka to ri", Spec("json_schema", SCHEMA, "json_schema")),
                                       ("the answer is", Spec("regex", REGEX, "regex")),
                                       ("so ne ma lu", None),
                                       ("ri", Spec("json_schema", SCHEMA, "json_schema"))]


def decode_all(model_dir: Path, provider: str) -> tuple[list[list[int]], list[str], list[str]]:
    """The jobs' greedy tokens, texts and finish reasons through one scheduler on `provider` (4 slots)."""
    opened: Any = open_model(model_dir, GraphChoice.parse(cache="concat"), RunOptions.parse(provider=provider))
    vocab = opened.engine.config.vocab_size
    grammars = Grammars(opened.tok.json, vocab, opened.tok.eot_id)
    run = Run(open_slots(opened.engine, 4), opened.tok, masks=Masks(vocab))
    choices = []
    for i, (prompt, spec) in enumerate(JOBS):
        matcher = grammars.matcher(grammars.compile(spec), json=spec.json_like) if spec else None
        ids = opened.tok.encode(prompt)
        choices.append(Choice(ids, 96, Sampling(), matcher=matcher, out=i))
    run.serve(choices, 2000)
    events = run.events
    failed = [(o, e.message) for o, e in events if isinstance(e, Failure)]
    assert not failed, f"choices failed on {provider}: {failed}"
    reasons = {o: e.reason for o, e in events if isinstance(e, Finish)}
    texts = [opened.tok.decode([t for t in c.new_ids if t != opened.tok.eot_id]) for c in choices]
    return [c.new_ids for c in choices], texts, [reasons[i] for i in range(len(JOBS))]


@pytest.mark.gpu
@pytest.mark.skipif(not probe("cuda").ok, reason=f"CUDA provider does not run here: {probe('cuda').reason}")
def test_cuda_scheduler_constrained_equals_cpu(structured_dir: Path) -> None:
    cpu_ids, _, cpu_reasons = decode_all(structured_dir, "cpu")
    gpu_ids, texts, reasons = decode_all(structured_dir, "cuda")
    assert gpu_ids == cpu_ids, "greedy tokens on CUDA differ from the CPU provider's on the same graph"
    assert reasons == cpu_reasons
    for (_, spec), text, reason in zip(JOBS, texts, reasons, strict=True):
        if spec is None or reason != "stop":
            continue
        if spec.kind == "json_schema":
            jsonschema.validate(json.loads(text), SCHEMA)
        else:
            assert re.fullmatch(REGEX, text), text
    assert any(r == "stop" for (_, spec), r in zip(JOBS, reasons, strict=True) if spec), reasons
