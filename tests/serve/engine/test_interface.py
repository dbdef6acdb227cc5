"""The scheduler's mixins read no hidden state: every `self.` name that Prefilling (prefill.py) and Emitting
(emit.py) use is declared in the class (an annotation or a method of its own), and Scheduler (scheduler.py)
provides each declared name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gptport.serve.engine as engine_pkg

HERE = Path(engine_pkg.__file__).parent


def _class(module: str, name: str) -> ast.ClassDef:
    tree = ast.parse((HERE / module).read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _declared(cls: ast.ClassDef) -> tuple[set[str], set[str]]:
    """The class's annotated names and its methods."""
    notes = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    return notes, methods


def _reads(cls: ast.ClassDef) -> set[str]:
    return {n.attr for n in ast.walk(cls)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"}


@pytest.mark.parametrize(("module", "name"), [("prefill.py", "Prefilling"), ("emit.py", "Emitting")])
def test_a_mixin_reads_only_what_it_declares(module: str, name: str) -> None:
    cls = _class(module, name)
    notes, methods = _declared(cls)
    assert _reads(cls) - notes - methods == set()
    assert notes & methods == set()


def test_the_scheduler_provides_what_its_mixins_declare() -> None:
    sched = _class("scheduler.py", "Scheduler")
    init = next(n for n in sched.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assigned = {t.attr for n in ast.walk(init) if isinstance(n, ast.Assign)
                for target in n.targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])
                if isinstance(t, ast.Attribute)}
    assigned |= {n.target.attr for n in ast.walk(init) if isinstance(n, ast.AnnAssign)
                 and isinstance(n.target, ast.Attribute)}
    provided = assigned | _declared(sched)[1]
    for module, name in (("prefill.py", "Prefilling"), ("emit.py", "Emitting")):
        provided |= _declared(_class(module, name))[1]
    for module, name in (("prefill.py", "Prefilling"), ("emit.py", "Emitting")):
        notes, _ = _declared(_class(module, name))
        assert notes - provided == set(), name
