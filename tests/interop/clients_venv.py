"""Running the client scenarios: the clients' virtual environment (GPTPORT_CLIENTS_VENV names it; .ci/run
makes it with the install line below), and one process of its Python per client module, run from the
repository's root with no network side trips. Imported by the pytest modules, in the project's venv."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

VENV_VAR = "GPTPORT_CLIENTS_VENV"
# the released clients these checks are written against; .ci/run installs this line
INSTALL = ["openai==3.57.*", "openai-agents==0.24.*", "langchain-openai==1.7.4", "litellm==1.110.*",
           "lm-eval[api]==0.4.13"]
ROOT = Path(__file__).resolve().parents[2]
# no client fetches side data: LiteLLM's price list, LangSmith's traces, the Hugging Face hub
OFFLINE = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LANGCHAIN_TRACING_V2": "false", "LANGSMITH_TRACING": "false",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def clients_python() -> Path:
    """The clients venv's python; a skip naming the variable where none is set, a failure where it is wrong."""
    venv = os.environ.get(VENV_VAR)
    if not venv:
        pytest.skip(f"{VENV_VAR} is not set: make a venv with `pip install {' '.join(INSTALL)}` and name it "
                    f"there (.ci/run does)")
    python = Path(venv) / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"{VENV_VAR}={venv}: no bin/python there")
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
