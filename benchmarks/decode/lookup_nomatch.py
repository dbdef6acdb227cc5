"""Prompt lookup where nothing matches: what `--prompt-lookup` costs a generation whose text never repeats.

bench_serve.py's random-weight `small` model sampled at temperature 1.0 writes near-uniform tokens from
its 4,096-token vocabulary, so among 256 new tokens a repeated pair of tokens is rare (the expected
count is ~n²/2V² ≈ 0.003) and the lookup drafter scans and finds nothing on almost every step. Three
rows per prompt and seed, interleaved within each round (the order rotates): plain decoding as
`gptport generate` runs it (`runtime.generate`, the static-cache graph), the speculative loop with no
drafter (the loop `--prompt-lookup` runs, without drafts), and the same loop with `LookupDrafter(N)`.
Every row must give the same tokens (the same seeded sampling: drafting is exact). Tokens/s are new
tokens over decode seconds (prefill excluded), summed over the prompts of a round; the table gives the
medians over rounds and lookup's ratio to plain in each round. The goal: lookup never more than 5%
slower than plain decoding when nothing matches. Writes
benchmarks/results/lookup-nomatch-<cpu>-<avx2|avx512|amx>.json.

    python benchmarks/bench_lookup_nomatch.py [--rounds 5] [--prompts 6] [--new 256] [--lookup 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from bench_serve import model_dir
from bench_tokenizer import big_corpus

from gptport.atomic import write_text
from gptport.machine import describe, slug, vector_class
from gptport.runtime.generate import generate
from gptport.runtime.loader import open_model
from gptport.runtime.sampling import Sampling
from gptport.runtime.speculative import LookupDrafter, SpecStats, speculate

HERE = Path(__file__).resolve().parent
ROWS = ("plain", "speculative loop, no drafter", "prompt lookup")


def one_round(opened: Any, prompts: list[list[int]], new: int, lookup: int, order: tuple[str, ...]
              ) -> dict[str, dict[str, Any]]:
    """Each row over every prompt (seed i for prompt i), in `order`: tokens/s, tokens, drafts."""
    eot = opened.tok.eot_id
    out: dict[str, dict[str, Any]] = {}
    for name in order:
        tokens, seconds, ids, stats = 0, 0.0, [], SpecStats()
        for i, p in enumerate(prompts):
            sampling = Sampling(temperature=1.0, seed=i)
            if name == "plain":
                row = generate(opened.engine, [p], new, sampling, eot)[0]
            else:
                drafter = LookupDrafter(lookup) if name == "prompt lookup" else None
                row = speculate(opened.engine, drafter, p, new, sampling, eot, stats=stats)
            tokens += len(row.new_ids)
            seconds += row.decode_s
            ids.append(row.new_ids)
        out[name] = {"tok_s": tokens / seconds, "tokens": tokens, "ids": ids, "drafted": stats.drafted,
                     "accepted": stats.accepted}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--lookup", type=int, default=3, help="--prompt-lookup N: tokens matched")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    d = model_dir("small", big_corpus(), gguf=False)
    opened = open_model(d, cache="static", threads=args.threads, spin="step")
    text = big_corpus().read_text(encoding="utf-8")
    prompts = [opened.tok.encode(text[i * 5000:i * 5000 + 200])[:32] for i in range(args.prompts)]
    one_round(opened, prompts[:1], 32, args.lookup, ROWS)  # warm-up
    rounds = []
    for r in range(args.rounds):
        order = ROWS[r % 3:] + ROWS[:r % 3]
        got = one_round(opened, prompts, args.new, args.lookup, order)
        if not all(got[name]["ids"] == got["plain"]["ids"] for name in ROWS):
            raise SystemExit(f"round {r + 1}: the rows' tokens differ; drafting must not change the text")
        rounds.append({name: {k: v for k, v in got[name].items() if k != "ids"} for name in ROWS} | {"order": order})
        print(f"round {r + 1}: " + ", ".join(f"{n} {got[n]['tok_s']:.0f} tok/s" for n in ROWS)
              + f"; {got['prompt lookup']['drafted']} drafted")
    median = {n: statistics.median(r[n]["tok_s"] for r in rounds) for n in ROWS}
    ratios = [round(r["prompt lookup"]["tok_s"] / r["plain"]["tok_s"], 3) for r in rounds]
    result = {
        "benchmark": "prompt lookup where nothing matches (random-weight small, temperature 1.0)",
        "machine": describe(), "settings": vars(args) | {"model": "bench_serve.py's random-weight small",
                                                         "sampling": "temperature 1.0, seed = prompt index"},
        "median_tok_s": median, "lookup_over_plain": median["prompt lookup"] / median["plain"],
        "round_ratios": ratios,
        "drafted": sum(r["prompt lookup"]["drafted"] for r in rounds),
        "accepted": sum(r["prompt lookup"]["accepted"] for r in rounds),
        "new_tokens": sum(r["prompt lookup"]["tokens"] for r in rounds),
        "rounds": rounds,
    }
    cpu = result["machine"]["cpu"]
    print(f"\n{cpu}, {args.threads} threads, {args.rounds} rounds of {args.prompts} prompts × {args.new} tokens")
    print(f"{'row':32} {'tok/s (median)':>15}")
    for n in ROWS:
        print(f"{n:32} {median[n]:>15.0f}")
    print(f"prompt lookup / plain: {result['lookup_over_plain']:.3f} (rounds {', '.join(map(str, ratios))}); "
          f"{result['drafted']} tokens drafted over {result['new_tokens']} new tokens")
    out = HERE / "results" / f"lookup-nomatch-{slug(cpu)}-{vector_class(result['machine']['isa'])}.json"
    write_text(out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
