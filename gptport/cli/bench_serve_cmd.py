"""`gptport bench-serve`: load-test any OpenAI-compatible completions server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gptport.cli.common import err

EXAMPLES = """Examples:

  gptport bench-serve http://127.0.0.1:8000

  gptport bench-serve http://127.0.0.1:8000 --concurrency 1,4,16 --num-prompts 64 --json serve.json

  gptport bench-serve http://127.0.0.1:8080 --model mymodel --request-rate 2 --concurrency 8 --json -
"""


def bench_serve(
    url: Annotated[str, typer.Argument(help="The server's root, e.g. http://127.0.0.1:8000.", show_default=False)],
    model: Annotated[str | None, typer.Option(help="Model name to request (default: the first of GET /v1/models).",
                                              show_default=False)] = None,
    concurrency: Annotated[str, typer.Option(help="Comma-separated levels: requests in flight at most.")] = "1,4,16",
    request_rate: Annotated[str, typer.Option(help="'inf' (closed loop) or requests/s with Poisson arrivals.")
                            ] = "inf",
    num_prompts: Annotated[int, typer.Option(help="Requests per concurrency level.")] = 64,
    prompt_len: Annotated[int, typer.Option(help="Words per prompt (about one token each; the tokens the "
                                            "server saw are reported).")] = 64,
    max_tokens: Annotated[int, typer.Option(help="Tokens to generate per request (sent with ignore_eos).")] = 128,
    temperature: Annotated[float, typer.Option(help="Sampling temperature sent with each request.")] = 0.8,
    api_key: Annotated[str | None, typer.Option(help="Sent as 'Authorization: Bearer KEY'.",
                                                show_default=False)] = None,
    timeout: Annotated[float, typer.Option(help="Seconds one request may take.")] = 300.0,
    seed: Annotated[int, typer.Option(help="Seed of the prompts and of the arrival times.")] = 0,
    json_path: Annotated[str | None, typer.Option("--json", help="Write {url, model, settings, machine, results} "
                                                  "here ('-': stdout).", show_default=False)] = None,
    json_schema: Annotated[Path | None, typer.Option("--json-schema", help="Constrain every output to JSON valid "
                                                     "under this schema file (sent as the json_schema field, "
                                                     "without ignore_eos).", show_default=False)] = None,
    shared_prefix: Annotated[int, typer.Option(help="Start every prompt with the same text of about this many "
                                               "tokens (a system prompt), then its own --prompt-len: what a "
                                               "server's prefix caching saves. 0: none.")] = 0,
) -> None:
    """Stream completions from an OpenAI-compatible server at several concurrency levels and report
    throughput and TTFT / TPOT / ITL / E2EL latencies (vLLM's benchmark metrics)."""
    import json
    import sys

    from rich.markup import escape

    from gptport import atomic
    from gptport.load import loadgen

    settings = loadgen.Settings(
        url=url, model=model, concurrency=loadgen.parse_concurrency(concurrency),
        request_rate=loadgen.parse_rate(request_rate), num_prompts=num_prompts, prompt_len=prompt_len,
        max_tokens=max_tokens, temperature=temperature, api_key=api_key, timeout_s=timeout, seed=seed,
        json_schema=loadgen.read_schema(json_schema) if json_schema is not None else None,
        shared_prefix=shared_prefix)
    with err.status("benchmarking") as status:
        result = loadgen.run(settings, say=lambda m: status.update(escape(m)))
    _table(result)
    if json_path == "-":
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    elif json_path:
        atomic.write_text(json_path, json.dumps(result, indent=2) + "\n")
        err.print(f"wrote {escape(json_path)}")


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def _table(result: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    s = result["settings"]
    rate = "closed loop" if s["request_rate"] == "inf" else f"{s['request_rate']} req/s Poisson"
    table = Table("concurrency", "ok/failed", "req/s", "out tok/s", "total tok/s", "TTFT p50/p99 ms",
                  "TPOT p50 ms", "ITL p50/p99 ms", "E2EL p50 ms",
                  title=escape(f"{result['url']} · {result['model']} · {s['num_prompts']} prompts of "
                               f"~{s['prompt_len']} tokens, max_tokens {s['max_tokens']}, {rate}"))
    for r in result["results"]:
        table.add_row(
            str(r["concurrency"]), f"{r['completed']}/{r['failed']}", _fmt(r["request_throughput"], ".2f"),
            _fmt(r["output_throughput"], ",.1f"), _fmt(r["total_token_throughput"], ",.1f"),
            f"{_fmt(r['median_ttft_ms'])}/{_fmt(r['p99_ttft_ms'])}", _fmt(r["median_tpot_ms"], ".2f"),
            f"{_fmt(r['median_itl_ms'], '.2f')}/{_fmt(r['p99_itl_ms'], '.2f')}", _fmt(r["median_e2el_ms"], ",.1f"))
    err.print(table)
    m = result["machine"]
    err.print(f"client: {escape(m['cpu'])}, {m['cores']} cores")
    seen = [r["mean_prompt_tokens"] for r in result["results"] if r["mean_prompt_tokens"] is not None]
    if seen:
        err.print(f"prompt tokens seen by the server: {sum(seen) / len(seen):.1f} on average "
                  f"({s.get('prompt_words', s['prompt_len'])} words sent)")
    if s.get("shared_prefix"):
        err.print(f"shared prefix: {_fmt(s.get('shared_prefix_tokens'), 'd')} tokens, the same in every prompt")
    for r in result["results"]:
        if r.get("cached_prompt_tokens") is not None:
            err.print(f"concurrency {r['concurrency']}: the server reports {r['cached_prompt_tokens']:,} of "
                      f"{r['total_input_tokens']:,} prompt tokens cached")
    for r in result["results"]:
        if r["requests_without_usage"]:
            err.print(f"[yellow]concurrency {r['concurrency']}: {r['requests_without_usage']} of {r['completed']} "
                      "streams had no usage chunk; their output tokens are counted as text chunks and their "
                      "prompt tokens as --prompt-len[/]")
        for e in r["errors"]:
            err.print(f"[red]concurrency {r['concurrency']}: {e['count']} failed[/]: {escape(e['message'])}")
