"""Prompt lookup where nothing matches: what `--prompt-lookup` costs a generation whose text never repeats.

The serving benchmarks' random-weight `small` model sampled at temperature 1.0 writes near-uniform tokens from
its 4,096-token vocabulary, so among 256 new tokens a repeated pair of tokens is rare (the expected
count is ~n²/2V² ≈ 0.003) and the lookup drafter scans and finds nothing on almost every step. Three
rows per prompt and seed, interleaved within each round (the order rotates): plain decoding as
`gptport generate` runs it (`runtime.generate`, the static-cache graph), the speculative loop with no
drafter (the loop `--prompt-lookup` runs, without drafts), and the same loop with `LookupDrafter(N)`.
Every row must give the same tokens (the same seeded sampling: drafting is exact). Tokens/s are new
tokens over decode seconds (prefill excluded), summed over the prompts of a round; the table gives the
medians over the kept rounds and each row's ratio to plain. The goal: lookup never more than 5% slower
than plain decoding when nothing matches.

    python -m benchmarks.decode.lookup_nomatch [--rounds 5] [--prompts 6] [--new 256] [--lookup 3] [--threads 2]
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.models import big_corpus, serve_model
from benchmarks.harness.run import Run
from gptport.runtime.choice import GraphChoice, RunOptions
from gptport.runtime.generate import generate
from gptport.runtime.loader import open_model
from gptport.runtime.sampling import Sampling
from gptport.runtime.speculative import LookupDrafter, SpecStats, speculate

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
    ap = cli.parser(__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--lookup", type=int, default=3, help="--prompt-lookup N: tokens matched")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shape", default="small", help="the random weights' shape")
    args = ap.parse_args()

    opened = open_model(serve_model(args.shape), GraphChoice.parse(cache="static"),
                        RunOptions.parse(threads=args.threads, spin="step"))
    text = big_corpus().read_text(encoding="utf-8")
    prompts = [opened.tok.encode(text[i * 5000:i * 5000 + 200])[:32] for i in range(args.prompts)]
    one_round(opened, prompts[:1], 32, args.lookup, ROWS)  # warm-up
    run = Run()
    for rnd in run.series(args.rounds):
        got = one_round(opened, prompts, args.new, args.lookup, tuple(rnd.rotation(ROWS)))
        if not all(got[name]["ids"] == got["plain"]["ids"] for name in ROWS):
            raise SystemExit(f"round {rnd.index + 1}: the rows' tokens differ; drafting must not change the text")
        rnd.data.update({name: {k: v for k, v in got[name].items() if k != "ids"} for name in ROWS})
        print(f"round {rnd.index + 1}: " + ", ".join(f"{n} {got[n]['tok_s']:.0f} tok/s" for n in ROWS)
              + f"; {got['prompt lookup']['drafted']} drafted")
    kept = run.kept()
    median = {n: statistics.median(r.data[n]["tok_s"] for r in kept) for n in ROWS}
    ratios = [round(r.data["prompt lookup"]["tok_s"] / r.data["plain"]["tok_s"], 3) for r in kept]
    rows = [{"row": n, "tok_s": median[n], "over_plain": median[n] / median["plain"],
             "drafted": sum(r.data[n]["drafted"] for r in kept), "accepted": sum(r.data[n]["accepted"] for r in kept),
             "new_tokens": sum(r.data[n]["tokens"] for r in kept)} for n in ROWS]
    print(f"\n{args.threads} threads, {len(kept)} kept rounds of {args.prompts} prompts × {args.new} tokens")
    for r in rows:
        print(f"{r['row']:32} {r['tok_s']:>10.0f} tok/s {r['over_plain']:>7.3f}x plain")
    print(f"prompt lookup / plain by round: {', '.join(map(str, ratios))}")
    settings = cli.settings(args, model=f"the serving benchmarks' random-weight {args.shape}",
                            sampling="temperature 1.0, seed = prompt index", goal="lookup / plain >= 0.95")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label),
                  args.results)


if __name__ == "__main__":
    main()
