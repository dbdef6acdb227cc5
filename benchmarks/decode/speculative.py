"""Speculative decoding at batch 1: a `small` target and two `tiny` drafts with the same tokenizer. The
target and the first draft are trained on tinyshakespeare (600 steps of 8 sequences of 512 tokens by
default); the second, "distilled", has 2 layers and is trained (1,500 steps) on the target's own greedy
continuations of 9,000 prompts drawn from that text (`gptport distill-corpus`), so that it learns what
the target predicts. Drafts run on one thread, as `generate --draft` runs them (--draft-threads).
All are built once and cached under benchmarks/work/speculative; the results record each model's steps
and validation perplexity. Greedy, NEW new tokens from held-out prompts, interleaved rounds.

Rows per round, each over the same prompts: plain decoding (`generate`, the static-cache graph), the
draft with adaptive K, the draft with fixed K, each draft's fp32 and int8 variants with adaptive K
(`--draft-precision int8`: a cheaper draft step, the same target), and prompt lookup; the text of
every drafted row must be the plain row's, token for token. A repetitive task (a prompt that quotes a
passage twice, continued: the model tends to go on quoting) shows prompt lookup's gain; the plain
prompts show its cost when little matches. With --llama-dir PATH (a llama.cpp build holding
llama-bench and llama-speculative), the same pairs as F32 GGUFs run in llama.cpp's speculative
example and llama-bench's plain decode, in the same rounds. Tokens/s count new tokens over the whole
generation (the prompt's prefill included, a short prompt), for every engine alike. The models use
n_ctx 512 (`--set n_ctx=512`) so that prompt and NEW new tokens fit without sliding the window
(llama.cpp's examples cannot slide a learned-position model). The step costs are one more round.

    python -m benchmarks.decode.speculative [--rounds 3] [--new 256] [--threads 2] [--llama-dir PATH]
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.models import SHAKESPEARE
from benchmarks.harness.models import WORK as ROOT_WORK
from benchmarks.harness.models import cli as gptport
from benchmarks.harness.run import Run
from gptport.runtime.choice import GraphChoice, RunOptions

WORK = ROOT_WORK / "speculative"
N_CTX = 512
# the distilled draft's text: the target's greedy continuations (192 tokens) of prompts drawn with two
# seeds, ~2M tokens (the first 3,000 alone, ~0.6M, taught a 600-step draft 64% acceptance)
DISTILL = (("distilled.txt", 0, 3000), ("distilled-b.txt", 1, 6000))
DISTILLED_LAYERS = 2  # a 2-layer draft agrees as often as a 4-layer one and steps 1.5x faster


def prepare(corpus: Path, target_steps: int, draft_steps: int, distill_steps: int
            ) -> tuple[Path, dict[str, Path], str]:
    """The target and the drafts' directories (trained and exported once), and the held-out text."""
    WORK.mkdir(parents=True, exist_ok=True)
    text = corpus.read_text(encoding="utf-8")
    cut = int(len(text) * 0.95)
    cut = text.index("\n\n", cut) + 2
    train, heldout = WORK / "train.txt", text[cut:]
    if not train.exists():
        train.write_text(text[:cut], encoding="utf-8")
    target, draft = WORK / "target", WORK / "draft"
    for d, preset, steps in ((target, "small", target_steps), (draft, "tiny", draft_steps)):
        if (d / "model.f32.gguf").exists():
            continue
        if d == target and not (d / "tokenizer.json").exists():
            gptport("train-tokenizer", str(train), "--vocab-size", "4096", "--out", str(d))
        extra = ["--tokenizer-from", str(target)] if d == draft else []
        if not (d / "config.json").exists():
            gptport("train", str(train), "--model-dir", str(d), "--preset", preset, "--steps", str(steps),
                    "--batch-size", "8", "--set", f"n_ctx={N_CTX}", *extra)
        gptport("export", str(d), "--force")
        gptport("export-gguf", str(d), "--outtype", "f32", "--force")
    distilled = WORK / "distilled"  # 2 layers of `tiny`, trained on the target's own continuations
    if not (distilled / "model.f32.gguf").exists():
        texts = []
        for name, seed, count in DISTILL:
            texts.append(WORK / name)
            if not texts[-1].exists():
                gptport("distill-corpus", str(target), str(train), "--out", str(texts[-1]), "--prompts", str(count),
                        "--new-tokens", "192", "--seed", str(seed))
        if not (distilled / "config.json").exists():
            gptport("train", *map(str, texts), "--model-dir", str(distilled), "--preset", "tiny", "--steps",
                    str(distill_steps), "--batch-size", "8", "--set", f"n_ctx={N_CTX}", "--set",
                    f"n_layer={DISTILLED_LAYERS}", "--tokenizer-from", str(target))
        gptport("export", str(distilled), "--precision", "fp32,int8", "--force")
        gptport("export-gguf", str(distilled), "--outtype", "f32", "--force")
    for d in (draft, distilled):  # the int8 rows (gated on each one's held-out text)
        if not (d / "model.int8.static.onnx").exists():
            gptport("export", str(d), "--precision", "fp32,int8", "--force")
    return target, {"draft": draft, "distilled": distilled}, heldout


def prompts(heldout: str, count: int) -> list[str]:
    """Speeches' openings from the held-out text: a speaker's line and the first line after it."""
    blocks = [b.strip() for b in heldout.split("\n\n") if b.count("\n") >= 2]
    step = max(1, len(blocks) // count)
    return ["\n".join(b.splitlines()[:2]) + "\n" for b in blocks[::step][:count]]


def repetitive(heldout: str, count: int) -> list[str]:
    """A passage, then the same passage begun again: continuing it, the model can copy."""
    blocks = [b.strip() for b in heldout.split("\n\n") if b.count("\n") >= 6]
    step = max(1, len(blocks) // count)
    out = []
    for b in blocks[::step][:count]:
        lines = b.splitlines()
        out.append("\n".join(lines) + "\n\n" + "\n".join(lines[:2]) + "\n")
    return out


def gptport_rows(target: Path, drafts: dict[str, Path], texts: list[str], new: int, threads: int, k: int
                 ) -> dict[str, dict[str, Any]]:
    """Each configuration's tokens/s (new tokens over the wall time), acceptance and tokens per step,
    and whether every text equals plain decoding's."""
    from gptport.runtime.generate import generate
    from gptport.runtime.loader import encode_prompts, open_model
    from gptport.runtime.sampling import Sampling
    from gptport.runtime.speculative import DRAFT_THREADS, LookupDrafter, ModelDrafter, SpecStats, speculate

    # the target's workers stop spinning after each step (as generate --draft opens it): two sessions
    # taking turns on 2 cores, each spinning on after its step, halved the drafted rows' speed
    tg = open_model(target, GraphChoice.parse(precision="fp32"),
                    RunOptions.parse(provider="cpu", threads=threads, spin="step"))
    # each draft at fp32 and at int8 (generate --draft-precision int8), on generate --draft's one thread
    models = {(name, p): open_model(d, GraphChoice.parse(precision=p),
                                    RunOptions.parse(provider="cpu", threads=DRAFT_THREADS, spin="step"))
              for name, d in drafts.items() for p in ("fp32", "int8")}
    ids = encode_prompts(tg.tok, texts, tg.engine.n_ctx)
    greedy, eot = Sampling(), -1  # no end-of-text: every row generates `new` tokens
    configs: dict[str, tuple[str, str, int | None] | None] = {
        "plain": None, "draft adaptive": ("draft", "fp32", None), f"draft k={k}": ("draft", "fp32", k),
        "int8 draft adaptive": ("draft", "int8", None), "distilled draft adaptive": ("distilled", "fp32", None),
        "distilled int8 draft adaptive": ("distilled", "int8", None), "lookup 3": ("lookup", "", None)}
    out: dict[str, dict[str, Any]] = {}
    plain_ids: list[list[int]] = []
    for name, how in configs.items():
        stats, total_s, tokens, same = SpecStats(), 0.0, 0, True
        for i, p in enumerate(ids):
            t0 = time.perf_counter()
            if how is None:
                row = generate(tg.engine, [p], new, greedy, eot)[0]
                plain_ids.append(row.new_ids)
            else:
                drafter = LookupDrafter(3) if how[0] == "lookup" else ModelDrafter(models[how[:2]].engine)
                row = speculate(tg.engine, drafter, p, new, greedy, eot, k=how[2], stats=stats)
                same &= row.new_ids == plain_ids[i]
            total_s += time.perf_counter() - t0
            tokens += len(row.new_ids)
        out[name] = {"tok_s": tokens / total_s, "tokens": tokens, "same_text": same,
                     "acceptance": stats.acceptance, "tokens_per_step": stats.tokens_per_step}
    return out


def llama_rows(llama: Path, target: Path, drafts: dict[str, Path], texts: list[str], new: int, threads: int
               ) -> dict[str, dict[str, Any]]:
    """llama.cpp on the same pairs: llama-speculative's decode tokens/s over the prompts with each draft,
    and llama-bench's plain decode of the target (tg NEW)."""
    rows = {("llama.cpp speculative" if name == "draft" else f"llama.cpp speculative, {name} draft"):
            _llama_speculative(llama, target, d, texts, new, threads) for name, d in drafts.items()}
    bench = subprocess.run([str(llama / "llama-bench"), "-m", str(target / "model.f32.gguf"), "-p", "0", "-n",
                            str(new), "-t", str(threads), "-r", "3", "-o", "json"],
                           capture_output=True, text=True, check=True)
    return rows | {"llama.cpp plain (llama-bench)": {"tok_s": json.loads(bench.stdout)[0]["avg_ts"]}}


def _llama_speculative(llama: Path, target: Path, draft: Path, texts: list[str], new: int, threads: int
                       ) -> dict[str, Any]:
    speeds, accepts = [], []
    for text in texts:
        run = subprocess.run([str(llama / "llama-speculative"), "-m", str(target / "model.f32.gguf"), "-md",
                              str(draft / "model.f32.gguf"), "-p", text, "-n", str(new), "-t", str(threads),
                              "-td", str(threads), "-c", str(N_CTX), "--temp", "0",
                              "--spec-draft-n-max", "8", "--ignore-eos"],
                             capture_output=True, text=True, check=True)
        log = run.stderr + run.stdout
        speed = re.search(r"decoded\s+\d+ tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", log)
        counts = re.search(r"n_drafted\s*=\s*(\d+).*?n_accept\s*=\s*(\d+)", log, re.S)
        if speed is None:
            raise RuntimeError(f"llama-speculative printed no speed:\n{log[-2000:]}")
        speeds.append(float(speed.group(2)))
        if counts is not None:  # drafted and accepted tokens, summed over the prompts
            accepts.append((int(counts.group(1)), int(counts.group(2))))
    acceptance = sum(a for _, a in accepts) / max(1, sum(d for d, _ in accepts))
    return {"tok_s": statistics.mean(speeds), "acceptance": acceptance}


def trained(d: Path) -> dict[str, Any]:
    """What a model directory was trained for: its steps and its last validation perplexity."""
    state = json.loads((d / "trainer.json").read_text())
    evals = [json.loads(line) for line in (d / "logs" / "train.jsonl").read_text().splitlines() if line.strip()]
    last = [e for e in evals if "val_ppl" in e][-1]
    return {"steps": state["step"], "val_ppl": last["val_ppl"], "val_ppl_at_step": last["step"],
            "parameters": json.loads((d / "config.json").read_text()).get("n_params")}


def step_costs(target: Path, draft: Path, threads: int, reps: int = 15) -> dict[str, Any]:
    """Why the server drafts only for a lone row: the target's step time (ms, median) for one row taking
    n tokens at once (a verification of n - 1 drafts) and for B rows taking one token each (a plain
    batched step), every row 128 tokens into its context. A B-row verification of K drafts each is
    B·(K + 1) rows of the matrix products, as one row of B·(K + 1) tokens is (its attention differs); and
    the draft's one-token step at fp32 and int8 (on DRAFT_THREADS)."""
    import numpy as np

    from gptport.runtime.loader import open_model
    from gptport.runtime.slot_layout import open_slots
    from gptport.runtime.speculative import DRAFT_THREADS

    tg = open_model(target, GraphChoice.parse(precision="fp32"), RunOptions.parse(provider="cpu", threads=threads))
    slots = open_slots(tg.engine, 16)
    rng = np.random.default_rng(0)
    for s in range(16):
        slots.append(s, rng.integers(1, tg.tok.vocab_size, 128))
    timed = lambda f: statistics.median(_time(f) for _ in range(reps)) * 1e3  # noqa: E731
    one_row, rows = {}, {}
    for n in (1, 2, 3, 5, 9, 17, 33, 80):
        ids = rng.integers(1, tg.tok.vocab_size, n)
        one_row[str(n)] = timed(lambda ids=ids: (slots.append(0, ids, all_logits=True), slots.truncate(0, 128)))
    for b in (1, 2, 4, 8, 16):
        ids = rng.integers(1, tg.tok.vocab_size, b)
        rows[str(b)] = timed(lambda b=b, ids=ids: (slots.decode(list(range(b)), ids),
                                                   [slots.truncate(s, 128) for s in range(b)]))
    # prompt lookup where nothing matches (no token recurs): what a step pays for the scan, n_ctx - 1 tokens
    from gptport.runtime.sampling import Sampling
    from gptport.runtime.speculative import LookupDrafter

    seq, lookup = rng.permutation(tg.tok.vocab_size)[:N_CTX - 1].tolist(), LookupDrafter(3)
    scan = timed(lambda: lookup.propose(seq, 4, Sampling(), rng)) * 1e3
    drafts = {}
    for precision in ("fp32", "int8"):
        small = open_slots(open_model(draft, GraphChoice.parse(precision=precision),
                                      RunOptions.parse(provider="cpu", threads=DRAFT_THREADS, spin="step")).engine, 1)
        small.append(0, rng.integers(1, tg.tok.vocab_size, 128))
        tok = rng.integers(1, tg.tok.vocab_size, 1)
        drafts[precision] = statistics.median(_time(lambda s=small, t=tok: (s.decode([0], t), s.truncate(0, 128)))
                                              for _ in range(200)) * 1e3  # a short step: more samples
    return {"one_row_n_tokens_ms": one_row, "b_rows_one_token_ms": rows, "lookup_no_match_us": scan,
            "draft_step_ms": drafts}


def _time(f: Any) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--corpus", type=Path, default=SHAKESPEARE)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k", type=int, default=4, help="the fixed draft length's row")
    ap.add_argument("--target-steps", type=int, default=600, help="training steps of the target (batch 8)")
    ap.add_argument("--draft-steps", type=int, default=600, help="training steps of the draft (batch 8)")
    ap.add_argument("--distill-steps", type=int, default=1500, help="training steps of the distilled draft")
    ap.add_argument("--llama-dir", type=Path, help="a llama.cpp build's bin directory (llama-speculative, "
                    "llama-bench)")
    args = ap.parse_args()
    if not args.corpus.is_file():
        raise SystemExit(f"--corpus {args.corpus}: no such file")
    target, drafts, heldout = prepare(args.corpus, args.target_steps, args.draft_steps, args.distill_steps)
    tasks = {"held-out prompts": prompts(heldout, args.prompts), "repetitive": repetitive(heldout, args.prompts)}
    run = Run()
    for rnd in run.series(args.rounds, part="generation"):
        for task, texts in tasks.items():
            rows = {}
            if args.llama_dir is not None and rnd.index % 2 == 1 and task == "held-out prompts":
                rows |= llama_rows(args.llama_dir, target, drafts, texts, args.new, args.threads)
            rows |= gptport_rows(target, drafts, texts, args.new, args.threads, args.k)
            if args.llama_dir is not None and rnd.index % 2 == 0 and task == "held-out prompts":
                rows |= llama_rows(args.llama_dir, target, drafts, texts, args.new, args.threads)
            rnd.data[task] = rows
    with run.round(part="step costs") as rnd:
        rnd.data["step_costs"] = step_costs(target, drafts["draft"], args.threads)
    median = summarize([r.data for r in run.kept(part="generation")])
    costs = run.rounds[-1].data["step_costs"]
    table = [{"table": task, "row": name, **row, "x_plain": row["tok_s"] / got["plain"]["tok_s"]}
             for task, got in median.items() for name, row in got.items()]
    table += [{"table": "step costs (ms)", "step": f"one row taking {n} tokens", "ms": ms}
              for n, ms in costs["one_row_n_tokens_ms"].items()]
    table += [{"table": "step costs (ms)", "step": f"{b} rows taking one token each", "ms": ms}
              for b, ms in costs["b_rows_one_token_ms"].items()]
    table += [{"table": "step costs (ms)", "step": f"the draft's step, {p}", "ms": ms}
              for p, ms in costs["draft_step_ms"].items()]
    table.append({"table": "step costs (ms)", "step": f"prompt lookup's scan, no match, {N_CTX - 1} tokens",
                  "ms": costs["lookup_no_match_us"] / 1e3})
    settings = cli.settings(args, corpus=args.corpus.name, n_ctx=N_CTX, llama_dir=bool(args.llama_dir))
    models = {"target": trained(target)} | {k: trained(d) for k, d in drafts.items()}
    results.write(results.document(results.benchmark_name(__spec__), run, table, settings, label=args.label,
                                   details={"models": models}), args.results)
    print_table(median, costs, args.new)


def summarize(rounds: list[dict[str, dict[str, dict[str, Any]]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Each row's median over rounds (tok/s, acceptance, tokens per step; same_text: every round)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for task, rows in rounds[0].items():
        out[task] = {}
        for name in rows:
            got = [rd[task][name] for rd in rounds]
            row: dict[str, Any] = {k: statistics.median(g[k] for g in got)
                                   for k in ("tok_s", "acceptance", "tokens_per_step") if k in got[0]}
            if "same_text" in got[0]:
                row["same_text"] = all(g["same_text"] for g in got)
            out[task][name] = row
    return out


def print_table(median: dict[str, dict[str, dict[str, Any]]], costs: dict[str, Any], new: int) -> None:
    print(f"\nspeculative decoding, batch 1, greedy, {new} new tokens")
    print("\nstep time (ms): one row taking n tokens | B rows taking one each")
    print("  n: " + "  ".join(f"{n}: {ms:.2f}" for n, ms in costs["one_row_n_tokens_ms"].items()))
    print("  B: " + "  ".join(f"{b}: {ms:.2f}" for b, ms in costs["b_rows_one_token_ms"].items()))
    print("draft step: " + "  ".join(f"{p}: {ms:.2f}" for p, ms in costs["draft_step_ms"].items()))
    print(f"prompt lookup's scan where nothing matches: {costs['lookup_no_match_us']:.0f} µs a step")
    for task, rows in median.items():
        plain = rows["plain"]["tok_s"]
        print(f"\n{task}\n{'row':<32} {'tok/s':>8} {'× plain':>8} {'accept':>7} {'tok/step':>8} {'same':>5}")
        for name, row in rows.items():
            acc = row.get("acceptance")
            tps = row.get("tokens_per_step")
            print(f"{name:<32} {row['tok_s']:>8.1f} {row['tok_s'] / plain:>8.2f} "
                  f"{'' if acc is None else f'{acc:.2f}':>7} {'' if tps is None else f'{tps:.2f}':>8} "
                  f"{str(row.get('same_text', '')):>5}")


if __name__ == "__main__":
    main()
