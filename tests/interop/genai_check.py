"""onnxruntime-genai runs gptport exports as they are: greedy tokens equal `gptport generate`'s.

onnxruntime-genai depends on the CPU `onnxruntime` package, which must never share an environment with
`onnxruntime-gpu`, so the check runs in two environments (.ci/run does both):

    python -m tests.interop.genai_check prepare WORKDIR                      # gptport's environment
    WORKDIR/venv-genai/bin/python -m tests.interop.genai_check verify WORKDIR  # onnxruntime-genai's

`prepare` trains a small model on a generated corpus, exports fp32 and int8, and records what
`gptport generate` gives for 3 prompts x 32 new tokens; `verify` imports only onnxruntime_genai.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROMPTS = ["ka to ri", "the men sol ve", "qua lin dor"]
NEW_TOKENS = 32
SHAPE = ["--set", "n_ctx=96", "--set", "d_model=64", "--set", "n_layer=2", "--set", "n_head=4",
         "--set", "warmup_steps=5", "--batch-size", "16", "--lr", "3e-3", "--steps", "150", "--eval-every", "150",
         "--device", "cpu", "--seed", "0"]


def gptport(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "gptport.cli.main", *args], check=True, capture_output=True, text=True)
    return r.stdout


def prepare(work: Path) -> None:
    from tests.conftest import make_text  # the test suite's seeded corpus

    corpus = work / "corpus.txt"
    work.mkdir(parents=True, exist_ok=True)
    corpus.write_text(make_text(3000), encoding="utf-8")
    model = work / "model"
    gptport("train-tokenizer", str(corpus), "--vocab-size", "512", "--out", str(model), "--force")
    gptport("train", str(corpus), "--model-dir", str(model), "--force", *SHAPE)
    gptport("export", str(model), "--precision", "fp32,int8", "--force")
    expected = {}
    for precision in ("fp32", "int8"):
        out = gptport("generate", str(model), *PROMPTS, "--max-new-tokens", str(NEW_TOKENS), "--json",
                      "--precision", precision)
        expected[precision] = [json.loads(line)["token_ids"] for line in out.splitlines()]
    (work / "expected.json").write_text(json.dumps(expected))
    print(f"prepared {model}: gptport's greedy tokens for {len(PROMPTS)} prompts x {NEW_TOKENS}, fp32 and int8")


def verify(work: Path) -> int:
    import onnxruntime_genai as og

    expected = json.loads((work / "expected.json").read_text())
    failures = 0
    for precision, filename in (("fp32", "model.onnx"), ("int8", "model.int8.onnx")):
        config = og.Config(str(work / "model"))
        config.overlay(json.dumps({"model": {"decoder": {"filename": filename}}}))
        model = og.Model(config)
        tokenizer = og.Tokenizer(model)
        for prompt, want in zip(PROMPTS, expected[precision], strict=True):
            ids = tokenizer.encode(prompt)
            params = og.GeneratorParams(model)
            params.set_search_options(max_length=len(ids) + NEW_TOKENS, do_sample=False)
            generator = og.Generator(model, params)
            generator.append_tokens(ids)
            while not generator.is_done():
                generator.generate_next_token()
            got = [int(t) for t in generator.get_sequence(0)][len(ids):]
            same = got == want
            failures += not same
            print(f"{precision:5} {prompt!r:20} {'identical' if same else 'DIFFERENT'}: {len(got)} tokens")
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
