"""What the checks of untrusted input cost a request: the body checked against its route's schema
(serve/api/body_check.py) for a chat body, a Responses body and a completions body of 4,096 token ids; and a chat
template rendered in process (Jinja's sandbox, no bounds) against the bounded child (serve/api/template_worker.py)
for a short chat, a chat with tools, and a conversation of 1,000 messages, plus the child's first render (its
start). Interleaved rounds, each probed; the rows are the median over the kept rounds of each round's best.

    python -m benchmarks.serve.request_checks [--rounds 4]
"""

from __future__ import annotations

import statistics
import time
import timeit
from collections.abc import Callable
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.run import Run
from gptport.serve.api import body_check
from gptport.serve.api.chat_env import environment
from gptport.serve.api.template_worker import TemplateWorker

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Weather in a city",
                                           "parameters": WEATHER}}]
SHORT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]
LONG = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 200} for i in range(1000)]
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat, 2 messages and a tool": ("chat", {"messages": SHORT, "tools": TOOLS, "max_tokens": 16}),
    "responses, 2 items and a tool": ("responses", {"input": SHORT, "max_output_tokens": 16,
                                                    "tools": [{"type": "function", **TOOLS[0]["function"]}]}),
    "completions, 4,096 token ids": ("completions", {"prompt": list(range(4096)), "max_tokens": 16}),
}
RENDERS = {"short chat": (SHORT, None), "chat with a tool": (SHORT, TOOLS), "1,000 messages": (LONG, None)}


def best_us(fn: Callable[[], Any], number: int) -> float:
    """The best of 5 repeats of `number` calls, in µs a call."""
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def measure(rnd_data: dict[str, Any]) -> None:
    checks = body_check.for_server("m", 16, 1 << 20)
    for name, (route, body) in BODIES.items():
        rnd_data[f"body check: {name}"] = best_us(lambda r=route, b=body: checks.before(r, b), 2000)
    template = environment().from_string(CHATML)
    t0 = time.perf_counter()
    worker = TemplateWorker({"default": CHATML})
    worker.render("default", {"messages": SHORT, "add_generation_prompt": True})
    rnd_data["template child: first render (its start)"] = (time.perf_counter() - t0) * 1e6
    for name, (messages, tools) in RENDERS.items():
        context = {"messages": messages, "tools": tools, "add_generation_prompt": True}
        number = 20 if len(messages) > 100 else 1000
        rnd_data[f"template in process: {name}"] = best_us(lambda c=context: template.render(**c), number)
        rnd_data[f"template child: {name}"] = best_us(lambda c=context: worker.render("default", c), number)
    worker.close()


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    run = Run()
    for rnd in run.series(args.rounds):
        measure(rnd.data)
    names = list(run.rounds[0].data)
    rows = []
    for name in names:
        values = run.values(name)
        rows.append({"measure": name, "us": round(statistics.median(values), 1), "min_us": round(min(values), 1),
                     "max_us": round(max(values), 1), "rounds": len(values)})
        print(f"{name:48s} {rows[-1]['us']:>10,.1f} µs  ({rows[-1]['min_us']:,.1f}-{rows[-1]['max_us']:,.1f})")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, cli.settings(args),
                                   label=args.label), args.results)


if __name__ == "__main__":
    main()
