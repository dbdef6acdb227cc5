"""The package's layers, read from the tree: which folder a module belongs to, which layers it may
import, and every gptport import a module makes (at the top or inside a function). The tests of
test_imports.py check the tree against these rules; nothing here lists modules by hand."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gptport"

# The layers from the bottom up. A module imports its own layer and the layers below it, never one
# above or beside it: serve and training both sit on runtime and do not see each other; export checks
# the torch side against the runtime, so it sits above both; the CLI picks between them.
BELOW: dict[str, frozenset[str]] = {
    "base": frozenset(),
    "runtime": frozenset({"base"}),
    "serve": frozenset({"base", "runtime"}),
    "training": frozenset({"base", "runtime"}),
    "export": frozenset({"base", "runtime", "training"}),
    "cli": frozenset({"base", "runtime", "serve", "training", "export"}),
}
TORCH_SIDE = frozenset({"training", "export"})  # every other layer is torch-free


@dataclass(frozen=True)
class Import:
    """One `import gptport...` or `from gptport... import ...` in a module's source."""

    module: str  # the module that imports
    target: str  # the gptport module imported (a name imported from a package counts as its module)
    line: int


def modules() -> list[str]:
    """Every module of the package, as dotted names, from the files on disk."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def layer(module: str) -> str:
    """The layer of a dotted gptport module name: its subpackage, or base for the top-level modules."""
    parts = module.split(".")
    if module == "gptport.__main__":  # `python -m gptport` and torchrun's `-m gptport`: the CLI's entry
        return "cli"
    if len(parts) >= 2 and (PACKAGE / parts[1]).is_dir():
        if parts[1] not in BELOW:
            raise AssertionError(f"gptport/{parts[1]}/ is a folder that tests/layout.py gives no layer")
        return parts[1]
    return "base"


def source(module: str) -> Path:
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imports(module: str) -> list[Import]:
    """The gptport modules `module` imports, wherever in the file the import stands."""
    tree = ast.parse(source(module).read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [Import(module, a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "gptport"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "gptport":
            for a in node.names:  # `from gptport.runtime import bench` imports gptport.runtime.bench
                sub = f"{node.module}.{a.name}"
                out.append(Import(module, sub if source(sub).exists() else node.module, node.lineno))
    return out


def upward(module: str) -> list[Import]:
    """The imports of `module` that reach a layer above or beside its own."""
    own = layer(module)
    return [i for i in imports(module) if layer(i.target) != own and layer(i.target) not in BELOW[own]]
