"""OpenVINO runs gptport's graphs whole: `gptport generate --provider openvino` gives `--provider cpu`'s
greedy tokens for fp32, and the 8-bit graph passes the accuracy gate against fp32 there; for a GPT and for a
Llama-family model (--preset llama-tiny: RMSNorm, SwiGLU, rotary positions, 2 key/value heads for 4); and each
again exported as a model past 1 GiB is (`<name>-streamed`: every graph's weights in its `.onnx.data`).

`onnxruntime-openvino` installs the same `onnxruntime` module as `onnxruntime-gpu`, so the check runs in
two environments (.ci/run does both):

    python -m tests.interop.openvino_check prepare WORKDIR            # gptport's environment
    WORKDIR/venv-openvino/bin/python -m tests.interop.openvino_check verify WORKDIR

`prepare` trains a small model of each kind on a generated corpus, exports fp32 and int8 with `--no-optimize`
(standard operators: what OpenVINO takes whole), and records `gptport generate --provider cpu`'s tokens
for 3 prompts x 32 new tokens and a few held-out windows; `verify` runs gptport (installed there without
its onnxruntime-gpu dependency) on the OpenVINO provider: tokens, the logits against the CPU
provider in the same process within the export gate's relative bound (gptport.export.tolerance), and
int8's top-1 agreement with fp32 on the windows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gptport.runtime.choice import GraphChoice, RunOptions
from tests.interop.genai_check import NEW_TOKENS, PROMPTS, SHAPE, gptport, greedy, streamed_copy  # the same model

GATE = 0.98  # export's accuracy gate: top-1 agreement with fp32


MODELS = {"model": SHAPE,  # a GPT, and a Llama-family model of the same scale
          "llama": ["--preset", "llama-tiny", *SHAPE]}  # its 4 query heads share 2 key/value heads
STREAMED = "-streamed"  # each model's weights exported again as a model past 1 GiB is: graphs with external data


def prepare(work: Path) -> None:
    from tests.conftest import make_text  # the test suite's seeded corpus

    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.txt"
    corpus.write_text(make_text(3000), encoding="utf-8")
    expected: dict[str, object] = {"heldout": make_text(40, seed=99)}
    for name, shape in MODELS.items():
        model = work / name
        gptport("train-tokenizer", str(corpus), "--vocab-size", "512", "--out", str(model), "--force")
        gptport("train", str(corpus), "--model-dir", str(model), "--force", *shape)
        gptport("export", str(model), "--precision", "fp32,int8", "--no-optimize", "--force")
        streamed = streamed_copy(model, work / (name + STREAMED), "fp32,int8", "--no-optimize", "--no-static")
        for directory in (model, streamed):
            expected[directory.name] = greedy(directory, "fp32", "--kv-cache", "concat")
    (work / "expected.json").write_text(json.dumps(expected))
    print(f"prepared {', '.join(MODELS)} (and each{STREAMED}): gptport's greedy tokens on the CPU for {len(PROMPTS)} "
          f"prompts x {NEW_TOKENS}")


def logits_of(engine: object, windows: list[list[int]]) -> list[object]:
    """Each window's logits (T, V) from one prefill."""
    import numpy as np

    from gptport.runtime.engine import positions

    out = []
    for ids in windows:
        x = np.array([ids], dtype=np.int64)
        mask = np.ones_like(x)
        logits, _ = engine.step()(x, mask, positions(mask), engine.empty_past(1))  # type: ignore[attr-defined]
        out.append(logits[0])
    return out


def verify_model(work: Path, name: str, expected: dict[str, object]) -> tuple[int, int]:
    """One model's checks on OpenVINO: (failures, checks)."""
    import numpy as np

    from gptport.export.tolerance import Tolerance, compare, worst
    from gptport.runtime.loader import open_model

    model = work / name
    out = subprocess.run([sys.executable, "-m", "gptport.cli.main", "generate", str(model), *PROMPTS,
                          "--max-new-tokens", str(NEW_TOKENS), "--json", "--provider", "openvino"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        print(f"FAIL {name}: generate --provider openvino: {out.stderr.strip().splitlines()[-1]}")
        return 1, 1
    got = [json.loads(line)["token_ids"] for line in out.stdout.splitlines()]
    failures = 0
    for prompt, want, have in zip(PROMPTS, expected[name], got, strict=True):  # type: ignore[call-overload]
        same = want == have
        failures += not same
        print(f"{'ok  ' if same else 'FAIL'} {name} fp32 {prompt!r}: {len(have)} tokens "
              f"{'equal' if same else 'differ'}")
    cpu = open_model(model, GraphChoice.parse(cache="concat"), RunOptions.parse(provider="cpu"))
    ids = cpu.tok.encode(str(expected["heldout"]))
    n = cpu.engine.n_ctx
    windows = [ids[i:i + n] for i in range(0, len(ids) - n + 1, n)][:4]
    want_logits = logits_of(cpu.engine, windows)
    fp32 = logits_of(open_model(model, GraphChoice.parse(cache="concat"),
                                RunOptions.parse(provider="openvino")).engine, windows)
    checks = [compare("logits", b, a, Tolerance()) for a, b in zip(want_logits, fp32, strict=True)]
    bad = worst(checks)
    failures += not bad.ok
    print(f"{'ok  ' if bad.ok else 'FAIL'} {name} fp32 on OpenVINO against the CPU provider over {len(windows)} "
          f"windows of {n}, within the export gate's bound: {bad.describe()}")
    int8 = logits_of(open_model(model, GraphChoice.parse(precision="int8", cache="concat"),
                                RunOptions.parse(provider="openvino")).engine, windows)
    top1 = float(np.mean([np.mean(a.argmax(-1) == b.argmax(-1)) for a, b in zip(want_logits, int8, strict=True)]))
    ok = top1 >= GATE
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name} int8 on OpenVINO: top-1 agreement with fp32 {top1:.2%} (gate {GATE:.0%})")
    return failures, len(PROMPTS) + 2


def verify(work: Path) -> int:
    expected = json.loads((work / "expected.json").read_text())
    failures = checks = 0
    for name in [m + suffix for m in MODELS for suffix in ("", STREAMED)]:
        f, n = verify_model(work, name, expected)
        failures, checks = failures + f, checks + n
    print(f"openvino check: {checks - failures} of {checks} ok")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("prepare", "verify"):
        raise SystemExit(__doc__)
    if sys.argv[1] == "prepare":
        prepare(Path(sys.argv[2]))
    else:
        raise SystemExit(verify(Path(sys.argv[2])))
