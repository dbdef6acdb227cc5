"""The documentation: README and ARCHITECTURE stay short enough to read in one sitting and keep what CI
reads from them, README's links resolve, and the site's generated references cover the code: a CLI page for
every command of the Typer app with every option, an HTTP section for every route of the server's OpenAPI
document. The full site build (`mkdocs build --strict`) is CI's own step."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import typer
import yaml

from gptport.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ROOT / "docs" / "hooks"


def _hook(name: str) -> ModuleType:
    """A mkdocs hook of docs/hooks/, loaded from its file (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", HOOKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_and_architecture_fit_one_sitting() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    architecture = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8").splitlines()
    assert len(readme) <= 200, f"README.md has {len(readme)} lines; at most 200 (move the rest to docs/)"
    assert len(architecture) <= 300, f"ARCHITECTURE.md has {len(architecture)} lines; at most 300"


def test_readme_keeps_what_ci_and_the_render_script_read() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    for marker in ("<!-- ci:install -->", "<!-- ci:test -->"):
        assert lines.count(marker) == 1, marker
        after = lines[lines.index(marker) + 1:]
        assert after[0] == "```bash" and after[1].strip() and after[2] == "```", f"{marker}: no fenced command"
    start, end = "<!-- figures:start -->", "<!-- figures:end -->"
    assert lines.count(start) == 1 and lines.count(end) == 1
    assert lines.index(start) < lines.index(end)


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local, "README links to no page of the documentation"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_cli_reference_covers_every_command_and_option() -> None:
    pages = _hook("cli_reference").pages()
    group = typer.main.get_command(app)
    root = group.context_class(group, info_name="gptport")
    index = pages["reference/cli/index.md"]
    for name, command in group.commands.items():
        page = pages.get(f"reference/cli/{name}.md")
        assert page is not None, f"no CLI reference page for `gptport {name}`"
        assert f"({name}.md)" in index, f"the CLI index does not link `gptport {name}`"
        assert f"Usage: gptport {name} " in page
        ctx = command.context_class(command, info_name=name, parent=root)
        for param in command.get_params(ctx):
            if getattr(param, "hidden", False) or param.name == "help":
                continue
            for flag in [*param.opts, *param.secondary_opts]:
                assert flag in page, f"`gptport {name}`: {flag} is missing from its reference page"
    assert len(pages) == len(group.commands) + 1  # no page of a command the app no longer has


def test_http_reference_covers_every_route() -> None:
    hook = _hook("http_reference")
    doc = hook.openapi_document()
    page = hook.render(doc)
    for path, methods in doc["paths"].items():
        for method in methods:
            assert f"### {method.upper()} {path}\n" in page, f"{method.upper()} {path} is not in the HTTP reference"
    for name in doc["components"]["schemas"]:
        assert f"### {name}\n" in page, f"schema {name} is not in the HTTP reference"


def test_site_navigation() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert {"Performance": "performance/index.md"} in config["nav"]
    assert sorted(config["hooks"]) == sorted(f"docs/hooks/{p.name}" for p in HOOKS.glob("*.py"))
    pages = [v for item in config["nav"] for v in _leaves(item)]
    generated = {"reference/cli/index.md", "reference/http-api.md"}
    missing = [p for p in pages if p not in generated and not (ROOT / "docs" / p).is_file()]
    assert not missing, f"mkdocs.yml's nav names pages that do not exist: {missing}"


def _leaves(item: object) -> list[str]:
    if isinstance(item, str):
        return [item]
    if isinstance(item, dict):
        return [leaf for value in item.values() for leaf in _leaves(value)]
    if isinstance(item, list):
        return [leaf for value in item for leaf in _leaves(value)]
    return []
