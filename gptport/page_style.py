"""The look gptport's two pages share — serve's page at `/` and export-web's index.html — as one
stylesheet, gptport/page.css, put inline where a page holds STYLE, so each page stays a single file
with nothing more to fetch."""

from __future__ import annotations

from importlib import resources

STYLE = "<style>/* gptport/page.css */</style>"


def styled(html: str) -> str:
    """`html` with gptport/page.css inline in place of its STYLE marker."""
    if STYLE not in html:
        raise ValueError("the page has no gptport/page.css marker")
    css = resources.files("gptport").joinpath("page.css").read_text(encoding="utf-8")
    return html.replace(STYLE, f"<style>\n{css}</style>")
