"""The options that pick a graph or say how to run it are declared once, in gptport/cli/options.py: no
command declares its own."""

from __future__ import annotations

import re
from pathlib import Path

import gptport.cli

SHARED = ("precision", "precisions", "provider", "providers", "threads", "kv_cache", "kv_dtype", "graph_format",
          "spin", "fallback", "draft", "draft_tokens", "draft_precision", "draft_threads")
OWN = {"train_cmd.py": {"threads"}}  # torch's threads while training: no graph is opened


def test_graph_and_run_options_are_declared_once() -> None:
    inline = re.compile(r"^\s+(\w+): Annotated\[", re.M)
    for path in sorted(Path(gptport.cli.__file__).parent.glob("*_cmd.py")):
        declared = set(inline.findall(path.read_text(encoding="utf-8"))) & set(SHARED)
        assert not declared - OWN.get(path.name, set()), f"{path.name}: declare these in cli/options.py"
