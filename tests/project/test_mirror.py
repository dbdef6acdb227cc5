"""tests/ mirrors the package: each test file sits in the folder of the layer it tests (a folder of gptport/,
or base/ for its top-level modules) or in one of the few folders that no layer names (support/ for helpers,
interop/, gpu/, project/ for the repository as a whole); no test file is left at tests/ itself, every layer
has its folder, every folder is a package, and the tests marked `gpu` are exactly those in gpu/. The layers
are read from gptport/ on disk, so a new one is expected the day it lands."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import layout

TESTS = Path(__file__).resolve().parents[1]
OTHER = {"support": "helpers, no tests", "interop": "other tools reading our files", "gpu": "tests marked gpu",
         "project": "the repository as a whole: docs, benchmarks, import layers, this layout"}


def layers() -> set[str]:
    """gptport's layers as folders: base, and each package folder under gptport/ ("serve/engine")."""
    packages = {p.parent.relative_to(layout.PACKAGE).as_posix() for p in layout.PACKAGE.rglob("__init__.py")}
    return {"base"} | (packages - {"."})


def suite_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def folder(path: Path) -> str:
    return path.parent.relative_to(TESTS).as_posix()


def gpu_marked(tree: ast.Module) -> list[bool]:
    """For each module-level test function: whether it is marked gpu (by a decorator or the module's pytestmark)."""
    def is_gpu(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Attribute) and n.attr == "gpu" and isinstance(n.value, ast.Attribute)
                   and n.value.attr == "mark" for n in ast.walk(node))

    module_wide = any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                         for t in n.targets) and is_gpu(n.value) for n in tree.body)
    return [module_wide or any(is_gpu(d) for d in n.decorator_list) for n in tree.body
            if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]


def test_the_layers_are_read_from_the_package() -> None:
    assert {"base", "runtime", "serve", "serve/engine", "training", "export", "cli"} <= layers()
    assert layers() == set(layout.BELOW)  # the layer rules of project/test_imports.py know each folder


def test_no_test_file_is_left_at_the_root() -> None:
    assert [p.name for p in TESTS.glob("test_*.py")] == []


def test_every_test_file_sits_in_a_layers_folder_or_a_named_other() -> None:
    allowed = layers() | (set(OTHER) - {"support"})
    stray = [p.relative_to(TESTS).as_posix() for p in suite_files() if folder(p) not in allowed]
    assert stray == [], f"move each into tests/<layer>/ ({sorted(layers())}) or one of {sorted(allowed - layers())}"


def test_every_layer_has_its_folder_and_every_folder_is_a_package() -> None:
    folders = {p.relative_to(TESTS).as_posix() for p in TESTS.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    assert layers() - folders == set()
    assert folders - layers() - set(OTHER) == set()
    assert [f for f in sorted(folders) if not (TESTS / f / "__init__.py").is_file()] == []


def test_the_gpu_tests_are_those_in_gpu() -> None:
    misplaced = []
    for path in suite_files():
        marks = gpu_marked(ast.parse(path.read_text(encoding="utf-8")))
        in_gpu = folder(path) == "gpu"
        if (in_gpu and not all(marks)) or (not in_gpu and any(marks)) or (in_gpu and not marks):
            misplaced.append(path.relative_to(TESTS).as_posix())
    assert misplaced == []
