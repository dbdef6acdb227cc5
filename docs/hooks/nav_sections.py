"""Sections that list their folder (a mkdocs hook): a nav entry pointing at `<folder>/index.md`, for the
folders named here, becomes a section of that index and every other page of the folder, sorted by file
name, and the design index's `<!-- records -->` marker becomes a table of the records (title, date,
status, read from each file). A page added to such a folder (a design record, a performance page that
`python -m benchmarks.render` writes) needs no edit of mkdocs.yml or of an index.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

FOLDERS = ("design", "performance")
RECORDS_MARKER = "<!-- records -->"


def _expand(nav: list[Any], sections: dict[str, list[str]]) -> None:
    for i, item in enumerate(nav):
        if not isinstance(item, dict):
            continue
        (title, value), = item.items()
        if isinstance(value, list):
            _expand(value, sections)
        elif isinstance(value, str) and value in sections:
            nav[i] = {title: sections[value]}


def on_files(files: Any, config: Any) -> Any:
    """Expand the folders' nav entries into sections of their pages."""
    if not config.nav:
        return files
    sections = {}
    for folder in FOLDERS:
        index = f"{folder}/index.md"
        pages = sorted(f.src_uri for f in files.documentation_pages()
                       if f.src_uri.startswith(f"{folder}/") and f.src_uri != index)
        sections[index] = [index, *pages]
    _expand(config.nav, sections)
    return files


def _field(text: str, name: str) -> str:
    match = re.search(rf"\*\*{name}:\*\*\s*(.+)", text)
    return match.group(1).strip() if match else "—"


def records_table(folder: Path) -> str:
    """A Markdown table of the design records in `folder`: link, date, title, status."""
    rows = ["| record | date | decision | status |", "| --- | --- | --- | --- |"]
    for path in sorted(folder.glob("*.md")):
        if path.name in ("index.md", "tried-and-dropped.md"):
            continue
        text = path.read_text(encoding="utf-8")
        title = next((line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("# ")), path.stem)
        number, _, rest = title.partition(". ")
        label, title = (number, rest) if rest and number.isdigit() else (path.stem, title)
        date = _field(text, "Date")[:10]
        status = _field(text, "Status").split(";")[0].split(" (")[0]
        rows.append(f"| [{label}]({path.name}) | {date} | {title} | {status} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Fill the design index's list of records."""
    if page.file.src_uri == "design/index.md" and RECORDS_MARKER in markdown:
        folder = Path(config.docs_dir) / "design"
        return markdown.replace(RECORDS_MARKER, records_table(folder))
    return markdown
