"""The model directory's file names are written down once, in gptport/paths.py."""

from __future__ import annotations

import ast
from pathlib import Path

from gptport import paths

ROOT = Path(__file__).resolve().parents[2]
# hf.py and hf_files.py read and write Hugging Face's directory layout, whose config.json, model.safetensors,
# vocab.json and merges.txt are Hugging Face's names (the same strings, another format); web.py writes that
# layout's config.json into the browser bundle for transformers.js
OTHER_FORMATS = {"gptport/export/hf.py", "gptport/export/hf_files.py", "gptport/export/web.py"}


def test_file_names_are_literals_only_in_paths() -> None:
    names = {Path(v).name for k, v in vars(paths).items() if k.isupper() and isinstance(v, str)}
    names = {n for n in names if "." in n}  # file names: "data" and "logs" are words of other meanings too
    found = []
    for path in sorted(ROOT.glob("gptport/**/*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "gptport/paths.py" or rel in OTHER_FORMATS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not found, "use gptport.paths: " + ", ".join(found)
