"""Running the client scenarios: the clients' virtual environment (GPTPORT_CLIENTS_VENV names it; .ci/run
makes it from requirements-clients.txt), and one process of its Python per client module, run from the
repository's root with no network side trips. Imported by the pytest modules, in the project's venv."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

VENV_VAR = "GPTPORT_CLIENTS_VENV"
ROOT = Path(__file__).resolve().parents[2]
# no client fetches side data: LiteLLM's price list, LangSmith's traces, the Hugging Face hub
OFFLINE = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LANGCHAIN_TRACING_V2": "false", "LANGSMITH_TRACING": "false",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


# every test of the clients skips, naming the variable, where it is unset (before any fixture builds a model)
needs_clients = pytest.mark.skipif(not os.environ.get(VENV_VAR), reason=(
    f"{VENV_VAR} is not set: name a venv made with `pip install -r requirements-clients.txt` there (.ci/run does)"))


def clients_python() -> Path:
    """The clients venv's python (a failure where GPTPORT_CLIENTS_VENV names no venv)."""
    venv = os.environ.get(VENV_VAR, "")
    python = Path(venv) / "bin" / "python"
    if not venv or not python.is_file():
        pytest.fail(f"{VENV_VAR}={venv!r}: no bin/python there")
    return python


def client_env(home: Path, api_key: str) -> dict[str, str]:
    """The environment of a client process: this one's, offline, caches under `home`, nothing of this venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "OPENAI_BASE_URL")}
    return {**env, **OFFLINE, "OPENAI_API_KEY": api_key, "HF_HOME": str(home / "hf"), "XDG_CACHE_HOME": str(home)}


def run_scenarios(python: Path, module: str, scenarios: list[str], url: str, model: str, api_key: str,
                  home: Path, timeout: float = 420) -> dict[str, dict[str, Any]]:
    """Run `python -m tests.interop.<module> SCENARIO...`; each scenario's JSON line by its name. A scenario
    that printed no line (the process died) gets the process's stderr as its error."""
    r = subprocess.run([str(python), "-m", f"tests.interop.{module}", *scenarios, "--url", url, "--model", model,
                        "--api-key", api_key], cwd=ROOT, env=client_env(home, api_key), capture_output=True,
                       text=True, timeout=timeout, check=False)
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    out = {line["scenario"]: line for line in lines}
    for name in scenarios:
        out.setdefault(name, {"scenario": name, "ok": False,
                              "error": f"exit {r.returncode}, no result; stderr:\n{r.stderr[-4000:]}"})
    return out
