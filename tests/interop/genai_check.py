"""onnxruntime-genai runs gptport exports as they are: greedy tokens equal `gptport generate`'s.

onnxruntime-genai depends on the CPU `onnxruntime` package, which must never share an environment with
`onnxruntime-gpu`, so the check runs in two environments (.ci/run does both):

    python -m tests.interop.genai_check prepare WORKDIR                      # gptport's environment
    WORKDIR/venv-genai/bin/python -m tests.interop.genai_check verify WORKDIR  # onnxruntime-genai's

`prepare` trains a small model on a generated corpus, exports fp32 and int8, and records what
`gptport generate` gives for 3 prompts x 32 new tokens; then the same weights exported as a model past 1 GiB is
(GPTPORT_EXTERNAL_FROM_BYTES=1: every graph's weights in `<graph>.onnx.data`, genai_config.json unchanged) into a
second directory, `streamed`, the same recorded. `verify` imports only onnxruntime_genai and runs both.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

PROMPTS = ["ka to ri", "the men sol ve", "qua lin dor"]
NEW_TOKENS = 32
SHAPE = ["--set", "n_ctx=96", "--set", "d_model=64", "--set", "n_layer=2", "--set", "n_head=4",
         "--set", "warmup_steps=5", "--batch-size", "16", "--lr", "3e-3", "--steps", "150", "--eval-every", "150",
         "--device", "cpu", "--seed", "0"]


MODELS = ("model", "streamed")  # the same weights: graphs with inline weights, and with external data
GRAPHS = (("fp32", "model.onnx"), ("int8", "model.int8.onnx"))


def gptport(*args: str, env: dict[str, str] | None = None) -> str:
    r = subprocess.run([sys.executable, "-m", "gptport.cli.main", *args], check=True, capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    return r.stdout


def streamed_copy(model: Path, out: Path, precisions: str, *flags: str) -> Path:
    """`model`'s weights, config and tokenizer copied to `out` and exported as a model past 1 GiB is (every graph's
    weights in its own `.onnx.data`; the variants with --no-gate, as such a model's are); checked that they are."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(model, out, ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "genai_config.json"))
    gptport("export", str(out), "--precision", precisions, "--no-gate", *flags,
            env={"GPTPORT_EXTERNAL_FROM_BYTES": "1"})
    graphs = sorted(out.glob("model*.onnx"))
    inline = [g.name for g in graphs if not g.with_name(g.name + ".data").is_file()]
    if not graphs or inline:
        raise SystemExit(f"{out}: expected every graph in external data; inline: {inline or 'no graph at all'}")
    return out


def greedy(model: Path, precision: str, *flags: str) -> list[list[int]]:
    """`gptport generate`'s greedy tokens for PROMPTS."""
    out = gptport("generate", str(model), *PROMPTS, "--max-new-tokens", str(NEW_TOKENS), "--json",
                  "--precision", precision, *flags)
    return [json.loads(line)["token_ids"] for line in out.splitlines()]


def prepare(work: Path) -> None:
    from tests.conftest import make_text  # the test suite's seeded corpus

    corpus = work / "corpus.txt"
    work.mkdir(parents=True, exist_ok=True)
    corpus.write_text(make_text(3000), encoding="utf-8")
    model = work / "model"
    gptport("train-tokenizer", str(corpus), "--vocab-size", "512", "--out", str(model), "--force")
    gptport("train", str(corpus), "--model-dir", str(model), "--force", *SHAPE)
    gptport("export", str(model), "--precision", "fp32,int8", "--force")
    streamed_copy(model, work / "streamed", "fp32,int8")
    expected = {name: {p: greedy(work / name, p) for p, _ in GRAPHS} for name in MODELS}
    (work / "expected.json").write_text(json.dumps(expected))
    print(f"prepared {', '.join(MODELS)}: gptport's greedy tokens for {len(PROMPTS)} prompts x {NEW_TOKENS}, "
          "fp32 and int8")


def run(og: Any, model: Path, filename: str, expected: list[list[int]], label: str) -> int:
    """onnxruntime-genai's greedy tokens of the graph `filename` of `model` against `expected`: how many differ."""
    config = og.Config(str(model))
    config.overlay(json.dumps({"model": {"decoder": {"filename": filename}}}))
    loaded = og.Model(config)
    tokenizer = og.Tokenizer(loaded)
    failures = 0
    for prompt, want in zip(PROMPTS, expected, strict=True):
        ids = tokenizer.encode(prompt)
        params = og.GeneratorParams(loaded)
        params.set_search_options(max_length=len(ids) + NEW_TOKENS, do_sample=False)
        generator = og.Generator(loaded, params)
        generator.append_tokens(ids)
        while not generator.is_done():
            generator.generate_next_token()
        got = [int(t) for t in generator.get_sequence(0)][len(ids):]
        same = got == want
        failures += not same
        print(f"{label:16} {prompt!r:20} {'identical' if same else 'DIFFERENT'}: {len(got)} tokens")
    return failures


def verify(work: Path) -> int:
    import onnxruntime_genai as og

    expected = json.loads((work / "expected.json").read_text())
    failures = 0
    for name in MODELS:
        for precision, filename in GRAPHS:
            failures += run(og, work / name, filename, expected[name][precision], f"{name} {precision}")
    print(f"onnxruntime-genai {og.__version__}: {'all identical' if not failures else f'{failures} differ'}")
    return 1 if failures else 0


if __name__ == "__main__":
    mode, workdir = sys.argv[1], Path(sys.argv[2])
    if mode == "prepare":
        prepare(workdir)
    elif mode == "verify":
        sys.exit(verify(workdir))
    else:
        sys.exit(f"usage: {sys.argv[0]} prepare|verify WORKDIR")
