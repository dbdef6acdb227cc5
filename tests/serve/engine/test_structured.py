"""Constrained decoding in the scheduler, without HTTP: JSON schemas, regexes and choices
hold, a masked token is never sampled, and a constrained request's tokens do not depend on its
neighbours."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptport.runtime import constraint
from gptport.runtime.choice import GraphChoice
from gptport.runtime.constraint import Grammars, Masks, Spec
from gptport.runtime.loader import open_model
from gptport.runtime.sampling import Sampling
from gptport.serve.engine import emit as emit_module
from gptport.serve.engine.scheduler import Choice, Finish
from tests.support.scheduling import Opened

PROMPTS = ["ka to ri", "so ne ma lu", "the answer is", "ri"]


@pytest.fixture(scope="module")
def opened(structured_dir: Path) -> Any:
    return open_model(structured_dir, GraphChoice.parse(cache="static"))


@pytest.fixture(scope="module")
def grammars(opened: Any) -> Grammars:
    return Grammars(opened.tok.json, opened.engine.config.vocab_size, opened.tok.eot_id)


class Run(Opened):
    """The shared harness with masks; a choice's Finish is its only one."""

    def __init__(self, opened: Any, slots: int) -> None:
        super().__init__(opened, slots, masks=Masks(opened.engine.config.vocab_size))

    def until_idle(self, limit: int = 5000) -> None:
        super().until_idle(limit)

    def finish(self, out: Any) -> Finish:
        return self.only_finish(out)


def text_of(opened: Any, c: Choice) -> str:
    ids = c.new_ids[:-1] if c.new_ids and c.new_ids[-1] == opened.tok.eot_id else c.new_ids
    return opened.tok.decode(ids)


def run_specs(opened: Any, grammars: Grammars, jobs: list[tuple[str, Spec | None, Sampling]], slots: int = 8,
              max_tokens: int = 160) -> tuple[Run, list[Choice]]:
    run = Run(opened, slots)
    choices = []
    for i, (prompt, spec, sampling) in enumerate(jobs):
        matcher = grammars.matcher(grammars.compile(spec)) if spec is not None else None
        ids = opened.tok.encode(prompt)
        choices.append(Choice(ids, min(max_tokens, opened.engine.n_ctx - len(ids)), sampling, matcher=matcher, out=i))
    run.s.submit(choices)
    run.until_idle()
    return run, choices


# -- schemas -------------------------------------------------------------------------------------------
def leaf() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 8)),
        st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
                  st.integers(-50, 50), st.integers(0, 200)),
        st.just({"type": "number", "minimum": 0, "maximum": 10, "multipleOf": 0.5}),
        st.just({"type": "boolean"}),
        st.builds(lambda xs: {"enum": xs}, st.lists(st.sampled_from(["red", "green", "blue", 1, 2.5, None]),
                                                    min_size=1, max_size=3, unique=True)),
    )


def obj(fields: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    def build(props: dict[str, dict[str, Any]], required: list[bool]) -> dict[str, Any]:
        names = list(props)
        return {"type": "object", "properties": props, "additionalProperties": False,
                "required": [n for n, r in zip(names, required, strict=False) if r]}

    props = st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), fields, min_size=1, max_size=4)
    return props.flatmap(lambda p: st.lists(st.booleans(), min_size=len(p), max_size=len(p))
                         .map(lambda r, p=p: build(p, r)))


array = st.builds(lambda item, n: {"type": "array", "items": item, "maxItems": n}, leaf(), st.integers(0, 3))
schemas = obj(st.one_of(leaf(), array, obj(leaf())))


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=schemas, temperature=st.sampled_from([0.0, 0.8]), seed=st.integers(0, 2**31),
       prompts=st.lists(st.text("abcdefghiklmnoprstu ,.?!'\n", min_size=1, max_size=40), min_size=2, max_size=2))
def test_every_stopped_completion_validates_against_its_schema(opened: Any, grammars: Grammars,
                                                                schema: dict[str, Any], temperature: float,
                                                                seed: int, prompts: list[str]) -> None:
    spec = Spec("json_schema", schema, "schema")
    jobs = [(p, spec, Sampling(temperature=temperature, seed=seed + i)) for i, p in enumerate(prompts)]
    run, choices = run_specs(opened, grammars, jobs)
    stopped = 0
    for c in choices:
        if run.finish(c.out).reason == "stop":
            jsonschema.validate(json.loads(text_of(opened, c)), schema)
            stopped += 1
    assert stopped, f"no completion of {schema} finished within {choices[0].max_tokens} tokens"


def test_regex_and_choice_outputs_match(opened: Any, grammars: Grammars) -> None:
    pattern = r"[a-z]{2,6}-[0-9]{1,3}( [A-Z][a-z]{1,5})?"
    options = ["yes", "no", "maybe later"]
    jobs = [(p, Spec("regex", pattern, "regex"), Sampling(temperature=t, seed=i)) for i, (p, t) in
            enumerate([(PROMPTS[0], 0.0), (PROMPTS[1], 0.8), (PROMPTS[2], 1.0)])]
    jobs += [(p, Spec("choice", options, "choice"), Sampling(temperature=1.0, seed=7 + i)) for i, p in
             enumerate(PROMPTS)]
    run, choices = run_specs(opened, grammars, jobs)
    for c in choices[:3]:
        assert run.finish(c.out).reason == "stop"
        assert re.fullmatch(pattern, text_of(opened, c)), text_of(opened, c)
    for c in choices[3:]:
        assert run.finish(c.out).reason == "stop"
        assert text_of(opened, c) in options


def test_a_masked_token_is_never_sampled(opened: Any, grammars: Grammars, monkeypatch: pytest.MonkeyPatch) -> None:
    """The logits handed to sampling are -inf exactly where a fresh matcher, fed the same tokens, forbids
    a token, and finite elsewhere; every pick is an allowed token."""
    schema = {"type": "object", "properties": {"w": {"type": "string", "maxLength": 6}, "n": {"type": "integer"}},
              "required": ["w", "n"]}
    specs = [Spec("json_schema", schema, "s"), Spec("regex", r"(ka|to|ri)( (ka|to|ri)){0,5}", "r"), None]
    shadows: dict[int, Any] = {}
    checked = [0]
    real = emit_module.choose_rows
    vocab = opened.engine.config.vocab_size
    masks = Masks(vocab)

    def spy(logits: np.ndarray, rows: list[Any]) -> list[int]:
        picks = real(logits, rows)
        for i, (_, _, (_, new), _) in enumerate(rows):
            shadow = shadows.get(id(new))
            if shadow is None:
                assert np.isfinite(logits[i]).all(), "a free row was masked"
                continue
            masks.fill([shadow])
            allowed = set(constraint.allowed_ids(shadow, vocab).tolist())
            finite = set(np.flatnonzero(np.isfinite(logits[i])).tolist())
            assert finite == allowed, f"{len(finite ^ allowed)} tokens differ from the grammar's mask"
            assert picks[i] in allowed
            if picks[i] != opened.tok.eot_id:
                assert shadow.consume(picks[i])
            checked[0] += 1
        return picks

    monkeypatch.setattr(emit_module, "choose_rows", spy)
    run = Run(opened, 4)
    choices = []
    for i, spec in enumerate(specs * 2):
        m = grammars.matcher(grammars.compile(spec)) if spec else None
        c = Choice(opened.tok.encode(PROMPTS[i % 4]), 40, Sampling(temperature=1.0, seed=i), matcher=m, out=i)
        if spec is not None:
            shadows[id(c.new_ids)] = grammars.matcher(grammars.compile(spec))
        choices.append(c)
    run.s.submit(choices)
    run.until_idle()
    assert checked[0] >= 40


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_constrained_greedy_tokens_alone_equal_tokens_among_others(opened: Any, grammars: Grammars,
                                                                   data: st.DataObject) -> None:
    """A constrained greedy request gives the same tokens alone and among 15 others, constrained and free,
    greedy and sampled, arriving in hypothesis-chosen orders."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                                        "maxItems": 3}}, "required": ["name", "age"]}
    target = (PROMPTS[0], Spec("json_schema", schema, "s"), Sampling())
    _, (alone,) = run_specs(opened, grammars, [target], slots=1, max_tokens=120)
    others = []
    for i in range(15):
        spec = data.draw(st.sampled_from([None, Spec("json_schema", schema, "s"), Spec("regex", r"[a-z ]{1,20}", "r"),
                                          Spec("choice", ["x", "yy"], "c")]))
        temperature = data.draw(st.sampled_from([0.0, 0.8]))
        others.append((data.draw(st.sampled_from(PROMPTS)), spec, Sampling(temperature=temperature, seed=i)))
    arrivals = [data.draw(st.integers(0, 12)) for _ in range(16)]
    run = Run(opened, 16)
    jobs = [target, *others]
    choices = [Choice(opened.tok.encode(p), 120, s, matcher=grammars.matcher(grammars.compile(sp)) if sp else None,
                      out=i) for i, (p, sp, s) in enumerate(jobs)]
    for it in range(max(arrivals) + 1):
        run.s.submit([c for c, a in zip(choices, arrivals, strict=True) if a == it])
        run.events += run.s.iterate()
    run.until_idle()
    assert choices[0].new_ids == alone.new_ids, f"arrivals {arrivals}"
    assert run.s.busy == 0


def test_bad_constraints_name_their_origin(grammars: Grammars) -> None:
    cases = [(Spec("regex", "a(b", "'regex'"), "unclosed group"),
             (Spec("json_schema", {"type": "strin"}, "'response_format.json_schema.schema'"), "strin"),
             (Spec("grammar", "start: foo", "'grammar'"), "foo"),
             (Spec("json_schema", "{nope", "--json-schema s.json"), "double quotes"),
             (Spec("choice", [], "'choice'"), "non-empty")]
    for spec, what in cases:
        with pytest.raises(constraint.ConstraintError) as e:
            grammars.compile(spec)
        message = str(e.value)
        assert message.startswith(spec.origin + ": ") and what in message and "\n" not in message, message


def test_generate_cli_takes_a_schema_a_regex_or_a_grammar(structured_dir: Path, tmp_path: Path) -> None:
    from tests.support.cli import assert_one_line_error, gptport

    schema = {"type": "object", "properties": {"w": {"type": "string", "maxLength": 6},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["w", "n"], "additionalProperties": False}
    (tmp_path / "s.json").write_text(json.dumps(schema), encoding="utf-8")
    (tmp_path / "g.gbnf").write_text('root ::= "yes" | "no"\n', encoding="utf-8")
    (tmp_path / "bad.lark").write_text("start: nothing_here\n", encoding="utf-8")
    d = str(structured_dir)
    r = gptport("generate", d, "ka to", "so ne", "--json-schema", str(tmp_path / "s.json"), "--max-new-tokens", "60",
                "--temperature", "0.9", "--json")
    assert r.returncode == 0, r.stderr
    for line in r.stdout.splitlines():
        row = json.loads(line)
        assert row["finish_reason"] == "grammar", row
        jsonschema.validate(json.loads(row["text"]), schema)
    r = gptport("generate", d, "ri", "--regex", "[a-z]{2}-[0-9]{2}", "--max-new-tokens", "20")
    assert r.returncode == 0 and re.fullmatch(r"[a-z]{2}-[0-9]{2}\n", r.stdout), (r.stdout, r.stderr)
    r = gptport("generate", d, "ri", "--grammar", str(tmp_path / "g.gbnf"), "--temperature", "1", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["text"] in ("yes", "no"), r.stderr
    assert_one_line_error(gptport("generate", d, "ri", "--grammar", str(tmp_path / "bad.lark")), 2,
                           "--grammar", "bad.lark", "nothing_here")
    assert_one_line_error(gptport("generate", d, "ri", "--json-schema", str(tmp_path / "none.json")), 2,
                           "--json-schema", "none.json")
    assert_one_line_error(gptport("generate", d, "ri", "--regex", "a", "--grammar", str(tmp_path / "g.gbnf")), 2,
                           "one output constraint")


def test_matchers_of_one_grammar_are_copies_that_walk_alone(grammars: Grammars, opened: Any) -> None:
    """A grammar asked for again is served from a kept fresh matcher (copied, not rebuilt): the copy starts
    at the grammar's start, gives the masks a matcher built afresh gives along the same walk, and advancing
    one matcher leaves the others where they were."""
    grammar = grammars.compile(Spec("regex", "(yes|no) [0-9]{2}", "'regex'"))
    masks = Masks(opened.engine.config.vocab_size)
    first = grammars.matcher(grammar)
    assert (grammar, False) in grammars._templates
    copy = grammars.matcher(grammar)  # from the template
    built = constraint.Matcher(constraint.llg.LLMatcher(grammars.tokenizer, grammar, log_level=0))
    walk = opened.tok.encode("yes 42")
    for tok in walk:
        masks.fill([copy, built])
        assert copy.mask is not None and built.mask is not None
        assert np.array_equal(copy.mask, built.mask)
        assert copy.consume(tok) and built.consume(tok)
    assert copy.finished and built.finished and not first.finished
    masks.fill([first])
    fresh = grammars.matcher(grammar)
    masks.fill([fresh])
    assert np.array_equal(first.mask, fresh.mask)  # the template was never advanced
    assert grammars.compile(Spec("regex", "(yes|no) [0-9]{2}", "'other'")) is grammar  # compiled once


def test_applied_masks_forbid_even_non_finite_logits(grammars: Grammars, opened: Any) -> None:
    """Applying masks leaves an allowed token's finite logit exactly as it was and makes every forbidden
    token -inf, also where the model's logit there is +inf or NaN (which an add of -inf would turn into
    NaN, a value sampling could take); only the rows asked for are touched."""
    vocab = opened.engine.config.vocab_size
    grammar = grammars.compile(Spec("regex", "(yes|no) [0-9]{2}", "'regex'"))
    masks = Masks(vocab)
    ms = [grammars.matcher(grammar), grammars.matcher(grammar)]
    assert ms[1].consume(opened.tok.encode("yes")[0])
    masks.fill(ms)
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, vocab)).astype(np.float32)  # (3, V): rows 0 and 2 constrained
    logits[:, ::7] = np.inf
    logits[:, 3::11] = np.nan
    before = logits.copy()
    masks.apply(logits, [0, 2], ms)
    for row, m in ((0, ms[0]), (2, ms[1])):
        allowed = np.zeros(vocab, dtype=bool)
        allowed[constraint.allowed_ids(m, vocab)] = True
        assert np.all(logits[row, ~allowed] == -np.inf)
        finite = allowed & np.isfinite(before[row])
        assert np.array_equal(logits[row, finite], before[row, finite])
    np.testing.assert_array_equal(logits[1], before[1])  # NaNs compare equal here
