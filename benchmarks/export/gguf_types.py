"""Real GGUF files of llama.cpp's quantization types through `gptport import-gguf`: is each imported model the
model transformers reads from the same file?

llama.cpp's `llama-quantize` writes SmolLM2-135M-Instruct in each type of `--types` from the F32 GGUF of the
benchmarks' imported model (benchmarks/harness/smollm2.py), as a user's downloaded file would be made: its
type mix is llama.cpp's (Q4_K_M, for one, writes Q5_0 where a row of 576 is no whole number of Q4_K's 256-wide
blocks, and Q6_K or Q8_0 for some value and down projections). For each file:

- the tensor types it holds (the `gguf` package's reader);
- `gptport import-gguf` as a user runs it: exit status, wall time, and for a type gptport does not take its
  one-line refusal and that nothing was written;
- gptport's torch model of the import (what export's parity gate compares the graphs with) against
  transformers' `from_pretrained(dir, gguf_file=...)` in float32 (which dequantizes with the same `gguf`
  package): the logits' max |Δ| over a few prompts, and NEW greedy tokens of each by both.

Not a timing benchmark: one round.

    python -m benchmarks.export.gguf_types --llama-quantize PATH [--types Q4_K_M,Q6_K,...] [--new 16]
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results, smollm2
from benchmarks.harness.models import WORK
from benchmarks.harness.run import Run, say
from gptport.export.tolerance import ATOL, RTOL

TYPES = "Q4_K_M,Q5_K_M,Q6_K,Q3_K_M,Q2_K,Q4_0,Q5_1,IQ4_NL,IQ4_XS,IQ3_S,TQ2_0"
PROMPTS = ["The capital of France is Paris. The capital of Germany is",
           "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number."]


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each type the file holds."""
    import gguf

    return dict(collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors))


def imported(src: Path, out: Path) -> dict[str, Any]:
    """`gptport import-gguf SRC --out OUT` as a child in SRC's folder (its messages name the files, not this
    machine's paths): exit status, wall time, its last line of output, whether OUT exists after it."""
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "gptport.cli.main", "import-gguf", src.name, "--out",
                        str(out.relative_to(src.parent)), "--force"], capture_output=True, text=True, check=False,
                       cwd=src.parent)
    lines = (r.stderr.strip() or r.stdout.strip()).splitlines()
    return {"exit": r.returncode, "wall_s": round(time.perf_counter() - start, 1),
            "message": lines[-1] if lines else "", "message_lines": len(r.stderr.strip().splitlines()),
            "written": out.exists()}


def compared(src: Path, model_dir: Path, new: int) -> dict[str, Any]:
    """gptport's torch model of the import against transformers on the GGUF file: logits and greedy tokens."""
    import torch
    import transformers

    from gptport.tokenizer import load as load_tokenizer
    from gptport.training.checkpoint import load_model

    tok = load_tokenizer(model_dir)
    ours, _ = load_model(model_dir, tok)
    ours.eval()
    dtype = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, **dtype)
    theirs.eval()
    worst, magnitude, same = 0.0, 0.0, []
    with torch.no_grad():
        for text in PROMPTS:
            ids = torch.tensor([tok.encode(text)])  # (1, T)
            a, b = ours(ids), theirs(ids).logits  # (1, T, V) each
            a = a[0] if isinstance(a, tuple) else a
            worst = max(worst, float((a - b).abs().max()))
            magnitude = max(magnitude, float(b.abs().max()))
            seq_a, seq_b = ids, ids
            for _ in range(new):  # greedy, whole sequence each step: both models the same way
                la = ours(seq_a)
                la = la[0] if isinstance(la, tuple) else la
                seq_a = torch.cat([seq_a, la[:, -1:].argmax(-1)], dim=1)
                seq_b = torch.cat([seq_b, theirs(seq_b).logits[:, -1:].argmax(-1)], dim=1)
            same.append(bool(torch.equal(seq_a, seq_b)))
    return {"max_abs_dlogits": worst, "logits_magnitude": magnitude,
            "within_gate": worst <= ATOL + RTOL * magnitude, "greedy_equal": same}


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--llama-quantize", type=Path, required=True, help="llama.cpp's llama-quantize binary")
    ap.add_argument("--types", default=TYPES, help="llama-quantize's type names, comma-separated")
    ap.add_argument("--new", type=int, default=16, help="greedy tokens per prompt")
    args = ap.parse_args()
    smollm2.need(args.llama_quantize)
    files, made = smollm2.ggufs(args.llama_quantize)
    work = WORK / "smollm2" / "types"
    work.mkdir(parents=True, exist_ok=True)
    run, rows = Run(), []
    with run.round(model="SmolLM2-135M-Instruct") as rnd:
        for qtype in args.types.split(","):
            src, out = work / f"smollm2.{qtype.lower()}.gguf", work / f"import-{qtype.lower()}"
            shutil.rmtree(out, ignore_errors=True)
            if not src.is_file():
                subprocess.run([str(args.llama_quantize), str(files["f32"]), str(src), qtype], check=True,
                               capture_output=True)
            row: dict[str, Any] = {"type": qtype, "tensor_types": tensor_types(src),
                                   "file_mb": round(src.stat().st_size / 1e6, 1), **imported(src, out)}
            if row["exit"] == 0:
                row |= compared(src, out, args.new)
            say(f"{qtype}: {row}")
            rnd.data[qtype] = row
            rows.append({k: (", ".join(f"{t} {n}" for t, n in v.items()) if k == "tensor_types" else
                             sum(v) if k == "greedy_equal" else v) for k, v in row.items()
                         if k != "message" or row["exit"] != 0})  # an import's summary line: in the round only
    settings = cli.settings(args, llama_quantize=args.llama_quantize.name, source=made.get("f32"),
                            prompts=len(PROMPTS))
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label),
                  args.results)
    for r in rows:
        print(r)
    if any(r["exit"] == 0 and (r["max_abs_dlogits"] > 0 or r["greedy_equal"] < len(PROMPTS)) for r in rows):
        print("note: some import differs from transformers' reading of its file", file=sys.stderr)


if __name__ == "__main__":
    main()
