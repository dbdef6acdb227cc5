"""The package's layers, read from the tree: which folder a module belongs to, which layers it may
import, and every gptport import a module makes (at the top or inside a function). The tests of
tests/project/test_imports.py check the tree against these rules; nothing here lists modules by hand."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gptport"

# The layers from the bottom up, one per folder of the package (a subfolder is a layer of its own; the
# top-level modules are base). A module imports its own layer and the layers below it, never one above
# or beside it: serve and training both sit on runtime and do not see each other; serve/engine, the
# batching engine, sees nothing of serve's HTTP surface above it; serve/api reads requests into typed jobs
# and writes OpenAI's answers (serve/api/responses translates the Responses API onto that chat path);
# serve itself holds the loaded model (settings, model host, metrics); serve/http is the HTTP surface over
# all of them; serve/ray runs that surface on Ray Serve; load, the client side, knows the server only by
# its HTTP API; arch, the architecture families (names, layouts, config translation), sits on base alone,
# below export's importers and writers that read it; export checks the torch side against the runtime, so it
# sits above both; the CLI picks between them.
BELOW: dict[str, frozenset[str]] = {
    "base": frozenset(),
    "runtime": frozenset({"base"}),
    "serve/engine": frozenset({"base", "runtime"}),
    "serve/api": frozenset({"base", "runtime", "serve/engine"}),
    "serve/api/responses": frozenset({"base", "runtime", "serve/engine", "serve/api"}),
    "serve": frozenset({"base", "runtime", "serve/engine", "serve/api"}),
    "serve/http": frozenset({"base", "runtime", "serve/engine", "serve/api", "serve/api/responses", "serve"}),
    "serve/ray": frozenset({"base", "runtime", "serve/engine", "serve/api", "serve/api/responses", "serve",
                            "serve/http"}),
    "load": frozenset({"base"}),
    "arch": frozenset({"base"}),
    "training": frozenset({"base", "runtime"}),
    "export": frozenset({"base", "arch", "runtime", "training"}),
    "cli": frozenset({"base", "runtime", "serve/engine", "serve/api", "serve/api/responses", "serve", "serve/http",
                      "serve/ray", "load", "arch", "training", "export"}),
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
    """The layer of a dotted gptport module name: the folder that holds it under gptport/ ("serve/engine"),
    or base for the top-level modules."""
    if module == "gptport.__main__":  # `python -m gptport` and torchrun's `-m gptport`: the CLI's entry
        return "cli"
    folders: list[str] = []
    for part in module.split(".")[1:]:
        if not PACKAGE.joinpath(*folders, part).is_dir():
            break
        folders.append(part)
    name = "/".join(folders) or "base"
    if name not in BELOW:
        raise AssertionError(f"gptport/{name}/ is a folder that tests/support/layout.py gives no layer")
    return name


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


def crosses(i: Import) -> bool:
    """Whether an import reaches a layer above or beside its module's own."""
    own, target = layer(i.module), layer(i.target)
    return target != own and target not in BELOW[own]


def upward(module: str) -> list[Import]:
    """The imports of `module` that reach a layer above or beside its own."""
    return [i for i in imports(module) if crosses(i)]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph` (module -> the modules it imports): each strongly connected group of
    more than one module (Tarjan's algorithm, iterative), its modules sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        group.append(top)
                        if top == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
    return found
