"""The CLI reference, generated from the Typer app at build time (a mkdocs hook): one page per command of
`gptport.cli.main.app` with its usage, arguments, options and examples, as `gptport COMMAND --help` has
them, and an index. Nothing of it is written by hand, so it cannot drift from the code.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

FOLDER = "reference/cli"
# where each command's guide page is (a command missing here simply gets no "Guide" link)
GUIDES = {
    "train-tokenizer": "guide/training.md", "train": "guide/training.md", "export": "guide/export.md",
    "generate": "guide/generation.md", "providers": "guide/gpus.md", "bench": "guide/measuring.md",
    "serve": "guide/serving.md", "bench-serve": "guide/measuring.md", "eval": "guide/measuring.md",
    "demo": "guide/getting-started.md", "export-hf": "guide/interop.md", "import-hf": "guide/interop.md",
    "export-gguf": "guide/interop.md", "export-web": "guide/browser.md", "distill-corpus": "guide/speculative.md",
}


def command_tree() -> tuple[Any, Any, dict[str, Any]]:
    """The Typer app as a click group, the group's context and its commands by name, in the app's order."""
    import typer

    from gptport.cli.main import app

    group = typer.main.get_command(app)
    root = group.context_class(group, info_name="gptport")
    return group, root, dict(group.commands)


def _cell(text: str) -> str:
    """Text for a Markdown table cell: pipes, angle brackets and stars escaped outside code spans."""
    parts = text.replace("\n", " ").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*")
    return "`".join(parts)


def _code(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _split_extra(help_text: str) -> tuple[str, dict[str, str], list[str]]:
    """click's help record ends in `  [default: x; required; 1<=x<=9]`: the help, the default, other notes."""
    match = re.search(r"\s{2}\[([^\[\]]*)\]$", help_text)
    if match is None:
        return help_text.strip(), {}, []
    notes, default = [], {}
    for part in match.group(1).split("; "):
        if part.startswith("default: "):
            default["default"] = part[len("default: "):]
        else:
            notes.append(part)
    return help_text[: match.start()].strip(), default, notes


def _params(command: Any, ctx: Any) -> tuple[list[str], list[str]]:
    """Table rows of the command's arguments and of its options (--help left out)."""
    arguments, options = [], []
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False) or param.name == "help":
            continue
        record = param.get_help_record(ctx)
        name, help_text = record if record else (param.name, getattr(param, "help", "") or "")
        text, default, notes = _split_extra(help_text)
        if param.multiple and "repeatable" not in text:
            notes.append("repeatable")
        described = _cell(text + (f" ({'; '.join(notes)})" if notes else ""))
        if param.param_type_name == "argument":
            arguments.append(f"| {_code(name)} | {described} |")
        else:
            flags, _, metavar = (name, "", "") if " / " in name else name.partition(" ")
            value = _code(metavar.strip("<>")) if metavar else "flag"
            shown = _code(default["default"]) if default else ""
            options.append(f"| {_code(flags)} | {value} | {shown} | {described} |")
    return arguments, options


def command_page(name: str, command: Any, root: Any) -> str:
    """The Markdown page of one command."""
    ctx = command.context_class(command, info_name=name, parent=root)
    usage = command.get_usage(ctx).strip()
    out = [f"# gptport {name}", "", (command.help or "").strip(), "", "```text", usage, "```", ""]
    if name in GUIDES:
        out += [f"Guide: [{GUIDES[name].split('/')[-1][:-3].replace('-', ' ')}](../../{GUIDES[name]})", ""]
    arguments, options = _params(command, ctx)
    if arguments:
        out += ["## Arguments", "", "| argument | description |", "| --- | --- |", *arguments, ""]
    if options:
        out += ["## Options", "", "| option | value | default | description |", "| --- | --- | --- | --- |",
                *options, "", "`-h`, `--help` prints this page's content in the terminal.", ""]
    lines = (command.epilog or "").strip("\n").splitlines()
    if lines and lines[0].strip().rstrip(":").lower() == "examples":
        lines = lines[1:]
    lines = [line.rstrip() for line in textwrap.dedent("\n".join(lines)).splitlines() if line.strip()]
    if lines:
        out += ["## Examples", "", "```text", *lines, "```", ""]
    return "\n".join(out)


def index_page(group: Any, commands: dict[str, Any]) -> str:
    """The CLI reference's index: the commands, what each does, and the global options."""
    rows = [f"| [`gptport {name}`]({name}.md) | {_cell(cmd.get_short_help_str(limit=200))} |"
            for name, cmd in commands.items()]
    return "\n".join([
        "# Command line", "", (group.help or "").strip().split("\n")[0], "",
        "Generated from the Typer app (`gptport.cli.main`) when the site is built: each page is what "
        "`gptport COMMAND --help` prints.", "",
        "| command | what it does |", "| --- | --- |", *rows, "",
        "Global options: `gptport --version` prints the version; `-h`/`--help` works on every command.", "",
        "Every command prints its payload (generated text, JSON) to stdout and its status, progress and tables "
        "to stderr. An error is one line on stderr (`gptport: error: ...`) naming the file, value or option at "
        "fault, with exit code 1 (2 for usage errors); `GPTPORT_DEBUG=1` shows the traceback instead.", ""])


def pages() -> dict[str, str]:
    """Every page of the CLI reference: its path under docs/ -> its Markdown."""
    group, root, commands = command_tree()
    out = {f"{FOLDER}/index.md": index_page(group, commands)}
    for name, command in commands.items():
        out[f"{FOLDER}/{name}.md"] = command_page(name, command, root)
    return out


def _expand_nav(nav: list[Any], section: list[str]) -> bool:
    """Replace the nav entry that points at the CLI index with a section of every generated page."""
    for i, item in enumerate(nav):
        if isinstance(item, dict):
            (title, value), = item.items()
            if value == f"{FOLDER}/index.md":
                nav[i] = {title: section}
                return True
            if isinstance(value, list) and _expand_nav(value, section):
                return True
    return False


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the generated pages, and list them in the nav under the CLI's entry."""
    from mkdocs.structure.files import File

    generated = pages()
    for path, text in generated.items():
        files.append(File.generated(config, path, content=text))
    if config.nav:
        _expand_nav(config.nav, list(generated))
    return files
