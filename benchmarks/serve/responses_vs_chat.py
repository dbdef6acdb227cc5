"""POST /v1/responses against POST /v1/chat/completions on the same `gptport serve`: output throughput at 16
users, streamed and not. /v1/responses runs on the chat path (its request rewritten as a chat body, chat's
answer translated back into the response object or its events), so the difference is the translation's cost
on the server's event loop, and the larger events a streamed response sends.

One server (random weights of the shape, 16 slots, 2 threads), four loads per round: chat and responses,
each whole and streamed, in an order rotated round by round. A load is a closed loop of 16 users sending
--requests-per-user requests each: one user message of ~64 tokens of common words (a fresh seeded set per
round and load, so that no load reuses another's prompt cache), 128 new tokens at temperature 0.8. The client
reads each answer whole and parses only its usage (the last chunk, or response.completed), so that the
client's work is as light as it can be on a machine the server shares. Each load also records the server
process's CPU seconds (/proc) per 1,000 output tokens. Figures are medians over the kept rounds; the ratio
rows give responses / chat (the goal: at least 0.95 of chat's throughput).

    python -m benchmarks.serve.responses_vs_chat [--shape small] [--rounds 3] [--requests-per-user 4]
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.models import WORK, serve_model
from benchmarks.harness.run import Run, say
from benchmarks.harness.servers import gptport_serve, served

USERS, PROMPT_WORDS, MAX_TOKENS, TEMPERATURE = 16, 40, 128, 0.8
LOADS = (("chat", False), ("responses", False), ("chat", True), ("responses", True))
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}


def name(api: str, stream: bool) -> str:
    return f"{api} {'streamed' if stream else 'whole'}"


def body(api: str, prompt: str, stream: bool) -> dict[str, Any]:
    """The same request on either route."""
    if api == "chat":
        out: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS,
                               "temperature": TEMPERATURE, "stream": stream}
        return out | ({"stream_options": {"include_usage": True}} if stream else {})
    return {"input": prompt, "max_output_tokens": MAX_TOKENS, "temperature": TEMPERATURE, "stream": stream}


def output_tokens(api: str, stream: bool, raw: bytes) -> int:
    """The answer's output tokens, from its usage: the JSON's, the chat stream's usage chunk (before [DONE]),
    or response.completed's (the stream's last event)."""
    if not stream:
        use = json.loads(raw)["usage"]
        return int(use["completion_tokens" if api == "chat" else "output_tokens"])
    text = raw.decode()
    if api == "chat":
        return int(json.loads(text.rsplit("data: ", 2)[-2])["usage"]["completion_tokens"])
    return int(json.loads(text.rsplit("data: ", 1)[-1])["response"]["usage"]["output_tokens"])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _load(url: str, api: str, stream: bool, prompts: list[str]) -> tuple[int, int, float]:
    """(output tokens, failed requests, seconds) of the prompts sent by USERS users in a closed loop."""
    import aiohttp

    todo, tokens, failed = list(prompts), [0], [0]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def user() -> None:
            while todo:
                prompt = todo.pop()
                async with session.post(url + PATHS[api], json=body(api, prompt, stream)) as r:
                    raw = await r.read()
                    if r.status != 200:
                        failed[0] += 1
                        continue
                tokens[0] += output_tokens(api, stream, raw)

        t0 = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(USERS)))
        return tokens[0], failed[0], time.perf_counter() - t0


def load(url: str, pid: int, api: str, stream: bool, prompts: list[str]) -> dict[str, Any]:
    cpu = cpu_seconds(pid)
    tokens, failed, seconds = asyncio.run(_load(url, api, stream, prompts))
    spent = cpu_seconds(pid) - cpu
    return {"requests": len(prompts), "failed": failed, "output_tokens": tokens, "seconds": round(seconds, 3),
            "output_tok_s": round(tokens / seconds, 1),
            "server_cpu_s_per_1k_tokens": round(spent / max(tokens, 1) * 1000, 4)}


def main() -> None:
    from gptport.load.loadgen import make_prompts

    ap = cli.parser(__doc__)
    ap.add_argument("--shape", default="small")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--requests-per-user", type=int, default=4)
    args = ap.parse_args()
    d = serve_model(args.shape)
    log = WORK / "serve" / "responses-vs-chat.log"
    run = Run()
    n = USERS * args.requests_per_user

    def measure(url: str, proc: Any) -> None:
        for api in PATHS:  # one request each first: the routes' first-call costs out of the rounds
            asyncio.run(_load(url, api, False, make_prompts(1, PROMPT_WORDS, 10**6)))
        for rnd in run.series(args.rounds, shape=args.shape):
            for k, (api, stream) in enumerate(rnd.rotation(LOADS)):
                prompts = make_prompts(n, PROMPT_WORDS, seed=rnd.index * 100 + LOADS.index((api, stream)))
                rnd.data[name(api, stream)] = row = load(url, proc.pid, api, stream, prompts)
                say(f"   {k + 1}. {name(api, stream)}: {row['output_tok_s']} tok/s, server CPU "
                    f"{row['server_cpu_s_per_1k_tokens']} s per 1k tokens")

    served(gptport_serve(d, "--slots", str(USERS), "--threads", str(args.threads)), log, measure)
    rows = table(run, args.shape)
    settings = cli.settings(args, users=USERS, prompt_words=PROMPT_WORDS, max_tokens=MAX_TOKENS,
                            temperature=TEMPERATURE, slots=USERS)
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label),
                  args.results)
    for r in rows:
        print(r)


def table(run: Run, shape: str) -> list[dict[str, Any]]:
    """Per load, the medians over the kept rounds; then responses / chat, whole and streamed: the median of
    each kept round's ratio."""
    rows: list[dict[str, Any]] = []
    for api, stream in LOADS:
        got = run.values(name(api, stream), shape=shape)
        rows.append({"shape": shape, "route": PATHS[api], "stream": stream, "users": USERS,
                     "output_tok_s": statistics.median(g["output_tok_s"] for g in got),
                     "server_cpu_s_per_1k_tokens": statistics.median(g["server_cpu_s_per_1k_tokens"] for g in got),
                     "failed": sum(g["failed"] for g in got), "rounds": len(got)})
    for stream in (False, True):  # paired: the two loads of one round ran minutes apart at most
        chat, resp = name("chat", stream), name("responses", stream)
        pairs = [(r.data[resp], r.data[chat]) for r in run.kept(shape=shape)]
        rows.append({"table": "responses / chat", "shape": shape, "stream": stream,
                     "throughput_ratio": round(statistics.median(a["output_tok_s"] / b["output_tok_s"]
                                                                 for a, b in pairs), 3),
                     "server_cpu_ratio": round(statistics.median(a["server_cpu_s_per_1k_tokens"]
                                                                 / b["server_cpu_s_per_1k_tokens"] for a, b in pairs),
                                               3)})
    return rows


if __name__ == "__main__":
    main()
