"""Structured outputs under load: benchmarks.serve.throughput's servers and prompts, each load run twice in the same
round, free and constrained to a fixed JSON schema of six fields (`bench-serve --json-schema`, sent as
the top-level `json_schema` field that gptport and llama-server both take), at 1 and 16 users; and the
per-row cost of one token mask (llguidance, µs per row, 1 and 16 rows at once) at the shape's
vocabulary.

Free requests generate max_tokens each (ignore_eos); constrained ones end where their JSON is
complete or at max_tokens. The schema's strings hold 48-96 lower-case letters and spaces (3-4 tags
of 16-32), so that a constrained request runs about as long as a free one (~130 tokens of JSON at
`small`'s vocabulary; random weights otherwise close strings at once): with shorter outputs (as with a
schema of free strings, where the many tokens that hold a quote end a string early) requests end at
different steps and arrive one by one, each prefill interrupting every decoding row, while the free
load's requests end and arrive together and are prefilled in one batch — the comparison would measure
that rather than the masks. Random weights (the serving benchmarks'), so the JSON's strings are noise bounded by
the schema. Rounds alternate which server goes first. Each user sends --requests-per-user requests per
load: with few, the run's last requests (the drain, when fewer than 16 users are left) weigh more.
For gptport, each row also carries the server's own scheduler seconds by phase spent on that load
(`/metrics`: prefill, decode, mask, sample, emit), and the medians per output token: where a
constrained token's extra time goes. The masks' cost is one more round per shape.

    python -m benchmarks.serve.structured [--shapes small,gpt2-124m] [--rounds 2] [--llama-server PATH]
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.loads import MAX_TOKENS, SCHEMA, bench_serve, phases_or_none
from benchmarks.harness.models import WORK, n_ctx, serve_model
from benchmarks.harness.run import Round, Run
from benchmarks.harness.servers import each_server, gptport_serve, llama_server, log_name


def mask_cost_us(d: Path, rows: int, steps: int = 200, seed: int = 0) -> dict[str, float]:
    """µs per row of one mask, computing `rows` masks at once, along random valid walks of SCHEMA."""
    import numpy as np

    from gptport import tokenizer as bpe
    from gptport.runtime.constraint import Grammars, Masks, Spec, allowed_ids

    tok = bpe.load(d)
    vocab = json.loads((d / "config.json").read_text())["model"]["vocab_size"]
    grammars = Grammars(tok.json, vocab, tok.eot_id)
    grammar = grammars.compile(Spec("json_schema", SCHEMA, "schema"))
    masks = Masks(vocab)
    rng = np.random.default_rng(seed)
    matchers = [grammars.matcher(grammar) for _ in range(rows)]
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        masks.fill(matchers)
        times.append((time.perf_counter() - t0) / rows)
        for i, m in enumerate(matchers):
            ids = allowed_ids(m, vocab)
            ids = ids[ids != tok.eot_id]
            if m.finished or not len(ids):
                matchers[i] = grammars.matcher(grammar)
                continue
            m.consume(int(rng.choice(ids)))
    return {"rows": rows, "median_us_per_row": statistics.median(times) * 1e6,
            "p90_us_per_row": float(np.percentile(times, 90) * 1e6)}


def load(url: str, shape: str, levels: list[int], seed: int, schema_path: Path, per_user: int
         ) -> list[dict[str, Any]]:
    """Each load at each concurrency level: bench-serve's row, with the server's scheduler seconds by phase
    spent on it (`phase_seconds`: prefill, decode, mask, sample, emit) where the server reports them."""
    rows = []
    for kind in ("free", "json"):
        for c in levels:
            before = phases_or_none(url)
            extra = ["--json-schema", str(schema_path)] if kind == "json" else []
            got = bench_serve(url, "--concurrency", str(c), "--num-prompts", str(max(8, per_user * c)), "--prompt-len",
                              "64", "--max-tokens", str(MAX_TOKENS[shape]), "--temperature", "0.8", "--seed",
                              str(seed), *extra)
            after = phases_or_none(url)
            spent = {k: round(v - before.get(k, 0.0), 4) for k, v in after.items()}
            rows += [{**r, "load": kind, "mean_output_tokens": r["total_output_tokens"] / max(r["completed"], 1),
                      **({"phase_seconds": spent} if spent else {})} for r in got]
    return rows


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--requests-per-user", type=int, default=4,
                    help="requests each user sends in a load (more: less of the run is the last requests' tail)")
    ap.add_argument("--llama-server", type=Path, default=os.environ.get("GPTPORT_LLAMA_SERVER"))
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    logs = WORK / "serve"
    logs.mkdir(parents=True, exist_ok=True)
    schema_path = logs / "structured-schema.json"
    schema_path.write_text(json.dumps(SCHEMA))
    run, rows = Run(), []
    names: dict[str, list[str]] = {}
    for shape in args.shapes.split(","):
        d = serve_model(shape, gguf=args.llama_server is not None)
        with run.round(shape=shape, part="masks") as rnd:
            rnd.data["mask_cost"] = [mask_cost_us(d, 1), mask_cost_us(d, 16)]
        servers = {"gptport": gptport_serve(d, "--slots", str(args.slots), "--threads", str(args.threads))}
        if args.llama_server is not None:
            servers["llama.cpp"] = llama_server(args.llama_server, d, args.slots, args.threads, n_ctx(d))
        names[shape] = list(servers)

        def measure(url: str, rnd: Round, shape: str = shape) -> list[dict[str, Any]]:
            return load(url, shape, levels, rnd.index, schema_path, args.requests_per_user)

        for rnd in run.series(args.rounds, shape=shape, part="loads"):
            each_server(rnd, servers, lambda name, s=shape: logs / f"structured-{s}-{log_name(name)}.log", measure)
    for shape, servers in names.items():  # once every round is judged
        costs = run.values("mask_cost", shape=shape, part="masks")
        rows += [{"table": "mask cost", "shape": shape, **c} for c in (costs[0] if costs else [])]
        rows += [{"shape": shape, "server": name, **row} for name in servers
                 for row in median(run.values(name, shape=shape, part="loads"))]
    settings = cli.settings(args, prompt_len=64, max_tokens=MAX_TOKENS, temperature=0.8,
                            schema="benchmarks.harness.loads.SCHEMA")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label,
                                   details={"schema": SCHEMA}), args.results)
    print_table(rows)


def median(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for level in zip(*rounds, strict=True):
        row: dict[str, Any] = {"load": level[0]["load"], "concurrency": level[0]["concurrency"]}
        for key in ("output_throughput", "median_ttft_ms", "median_tpot_ms", "mean_output_tokens", "completed",
                    "failed"):
            values = [x[key] for x in level if x.get(key) is not None]
            row[key] = statistics.median(values) if values else None
        per_token = [{k: v / x["total_output_tokens"] * 1e6 for k, v in x["phase_seconds"].items()}
                     for x in level if x.get("phase_seconds") and x.get("total_output_tokens")]
        if per_token:  # µs of the scheduler's time per generated token, by phase
            keys = sorted({k for p in per_token for k in p})  # a phase not yet met is absent from /metrics
            row["phase_us_per_token"] = {k: round(statistics.median(p.get(k, 0.0) for p in per_token), 1)
                                         for k in keys}
        out.append(row)
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        if r.get("table") == "mask cost":
            print(f"{r['shape']}: mask µs/row at {r['rows']} rows: {r['median_us_per_row']:.0f}")
    print(f"{'shape':<10} {'server':<10} {'load':<5} {'conc':>4} {'out tok/s':>10} {'TPOT med':>9} {'TTFT med':>9} "
          f"{'out tok':>8}")
    served = [r for r in rows if "server" in r]
    for row in served:
        print(f"{row['shape']:<10} {row['server']:<10} {row['load']:<5} {row['concurrency']:>4} "
              f"{row['output_throughput']:>10.1f} {row['median_tpot_ms']:>9.2f} {row['median_ttft_ms']:>9.1f} "
              f"{row['mean_output_tokens']:>8.1f}")
        if row.get("phase_us_per_token"):
            print("    scheduler µs per output token: " + ", ".join(
                f"{k} {v:.0f}" for k, v in sorted(row["phase_us_per_token"].items())))
    by = {(r["shape"], r["server"], r["load"], r["concurrency"]): r for r in served}
    for shape, server, c in sorted({(s, n, c) for s, n, _, c in by}):
        free, js = by[(shape, server, "free", c)], by[(shape, server, "json", c)]
        print(f"{shape} {server} at {c}: json/free throughput "
              f"{js['output_throughput'] / free['output_throughput']:.3f}, "
              f"TPOT {js['median_tpot_ms'] / free['median_tpot_ms']:.3f}")


if __name__ == "__main__":
    main()
