"""How far batching can take `gptport serve` on this machine, without HTTP: the scheduler that
`gptport serve` runs, driven in-process on the serving benchmarks' random-weight model directories with
benchmarks.serve.throughput's load (64-token prompts, 128 new tokens, 64 for gpt2-124m, temperature 0.8,
16 slots, prefill chunk 512, `--spin step`), one user (requests one after another) against 16 users (a closed
loop: a finished request is replaced at once), in alternating rounds. No event loop, no JSON, no load
generator share the two cores here, so the ratio is what any server on this engine could reach at
most; the HTTP figures (benchmarks.serve.throughput) sit below it.

Beside it, the engine's own step times: a decode step over 1 and over 16 busy slots (prompts of 64
tokens, the cache filled to ~100 positions), a 64-token prompt alone and 8 prompts in one step; and
the ratio they allow with nothing else spent: 16 users' tokens per (decode steps + their prompts'
prefill) against one user's.

    python -m benchmarks.serve.ceiling [--shapes small,gpt2-124m] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import cli, results
from benchmarks.harness.loads import MAX_TOKENS
from benchmarks.harness.models import serve_model
from benchmarks.harness.run import Run
from gptport.runtime import loader
from gptport.runtime.choice import GraphChoice, RunOptions
from gptport.runtime.sampling import Sampling
from gptport.runtime.slot_layout import open_slots
from gptport.runtime.slots import StaticSlots
from gptport.serve.engine.choice import Choice
from gptport.serve.engine.events import Finish
from gptport.serve.engine.scheduler import Scheduler, SchedulerSettings

SLOTS, PROMPT, PREFILL_CHUNK, TEMPERATURE = 16, 64, 512, 0.8


class Load:
    """A scheduler stepped in this thread; a finished request can be replaced at once."""

    def __init__(self, opened: Any, slots: StaticSlots, max_tokens: int, seed: int) -> None:
        # iterate() returns each iteration's events; deliver is only the scheduler thread's (not started here)
        self.s = Scheduler(slots, opened.tok, lambda events: None,
                           SchedulerSettings(max_queue=4 * SLOTS, prefill_chunk=PREFILL_CHUNK))
        self.vocab, self.max_tokens = slots.vocab_size, max_tokens
        self.rng = np.random.default_rng(seed)
        self.sent = 0

    def send(self) -> None:
        prompt = self.rng.integers(1, self.vocab, PROMPT).tolist()  # random ids: no EOT (id 0) in prompts
        sampling = Sampling(temperature=TEMPERATURE, seed=int(self.rng.integers(1 << 30)))
        if not self.s.submit([Choice(prompt, self.max_tokens, sampling, ignore_eos=True, out=self.sent)]):
            raise RuntimeError("the scheduler's queue refused a request")
        self.sent += 1

    def run(self, users: int, requests: int) -> dict[str, float]:
        """`requests` in all, `users` in flight: output tokens per second from the first send to the
        last finish."""
        tokens = done = 0
        t0 = time.perf_counter()
        for _ in range(min(users, requests)):
            self.send()
        while done < requests:
            for _, event in self.s.iterate():
                if isinstance(event, Finish):
                    tokens += event.completion_tokens
                    done += 1
                    if self.sent < requests:
                        self.send()
        wall = time.perf_counter() - t0
        return {"users": users, "requests": requests, "output_tokens": tokens, "wall_s": wall,
                "output_throughput": tokens / wall}


def step_times(slots: StaticSlots, repeat: int = 20) -> dict[str, float]:
    """Milliseconds of the engine's steps: decode over 1 and 16 slots (~100 positions each), a 64-token
    prompt alone, 8 such prompts in one step (per prompt). Leaves every slot free."""
    rng, vocab = np.random.default_rng(0), slots.vocab_size

    def timed(fn: Any) -> float:
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return 1000 * statistics.median(times)

    def refill(k: int) -> None:
        for s in range(SLOTS):
            slots.free(s)
        slots.prefill_many(0, [rng.integers(1, vocab, PROMPT) for _ in range(k)])

    prefill_1 = timed(lambda: refill(1))
    prefill_8 = timed(lambda: refill(8)) / 8
    refill(SLOTS)
    for _ in range(36):  # to ~100 positions: the middle of a 64 + 128-token request
        slots.decode(list(range(SLOTS)), rng.integers(1, vocab, SLOTS))
    decode_16 = timed(lambda: slots.decode(list(range(SLOTS)), rng.integers(1, vocab, SLOTS)))
    decode_1 = timed(lambda: slots.decode([0], rng.integers(1, vocab, 1)))
    for s in range(SLOTS):
        slots.free(s)
    return {"decode_1_ms": decode_1, "decode_16_ms": decode_16, "prefill_64_ms": prefill_1,
            "prefill_8x64_ms_per_prompt": prefill_8}


def bound(steps: dict[str, float], max_tokens: int) -> float:
    """The 16-user / 1-user throughput ratio that the step times allow with nothing else spent: one
    user prefills alone and decodes one row; 16 users decode 16 rows and prefill in groups of 8."""
    one = max_tokens / (steps["prefill_64_ms"] + (max_tokens - 1) * steps["decode_1_ms"])
    many = SLOTS * max_tokens / (SLOTS * steps["prefill_8x64_ms_per_prompt"] + (max_tokens - 1) * steps["decode_16_ms"])
    return many / one


def measure(run: Run, shape: str, rounds: int, threads: int, d: Path | None = None, precision: str = "fp32",
            kv_dtype: str = "float32", **tags: Any) -> None:
    """`rounds` rounds (series shape=`shape`, config=..., `tags`) of the in-process loads and step times of
    `d` (default: the serving benchmarks' random weights of `shape`) at `precision` with a `kv_dtype` cache."""
    d = d or serve_model(shape)
    opened = loader.open_model(d, GraphChoice.parse(precision=precision, cache="static", kv_dtype=kv_dtype),
                               RunOptions.parse(threads=threads, spin="step"))
    slots = open_slots(opened.engine, SLOTS)  # one cache for every run: the scheduler frees what it used
    assert isinstance(slots, StaticSlots)
    max_tokens, n_one, n_many = MAX_TOKENS[shape], 4, 3 * SLOTS
    Load(opened, slots, max_tokens, seed=99).run(SLOTS, SLOTS)  # warm-up: every slot's pages touched
    for rnd in run.series(rounds, shape=shape, config=f"{precision} weights, {kv_dtype} cache", **tags):
        order = rnd.order([(1, n_one), (SLOTS, n_many)])
        runs = {users: Load(opened, slots, max_tokens, seed=rnd.index * 10 + users).run(users, n)
                for users, n in order}
        steps = step_times(slots)
        rnd.data.update({"one_user": runs[1], "users_16": runs[SLOTS], "steps_ms": steps,
                         "ratio": runs[SLOTS]["output_throughput"] / runs[1]["output_throughput"],
                         "step_bound_ratio": bound(steps, max_tokens)})
        print(f"  {shape} round {rnd.index + 1}: 1 user {runs[1]['output_throughput']:.1f} tok/s, 16 users "
              f"{runs[SLOTS]['output_throughput']:.1f} ({rnd.data['ratio']:.2f}x); step bound "
              f"{rnd.data['step_bound_ratio']:.2f}x", flush=True)


def row(run: Run, shape: str, precision: str = "fp32", kv_dtype: str = "float32", **tags: Any) -> dict[str, Any]:
    """The medians over the kept rounds of measure()'s series."""
    kept = [r.data for r in run.kept(shape=shape, config=f"{precision} weights, {kv_dtype} cache", **tags)]

    def med(get: Any) -> float:
        return statistics.median(get(r) for r in kept)

    return {"shape": shape, "precision": precision, "kv_dtype": kv_dtype, "max_tokens": MAX_TOKENS[shape],
            "one_user_tok_s": med(lambda r: r["one_user"]["output_throughput"]),
            "users_16_tok_s": med(lambda r: r["users_16"]["output_throughput"]), "ratio": med(lambda r: r["ratio"]),
            "step_bound_ratio": med(lambda r: r["step_bound_ratio"]),
            **{k: med(lambda r, k=k: r["steps_ms"][k]) for k in kept[0]["steps_ms"]}}


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    run = Run()
    shapes = args.shapes.split(",")
    for shape in shapes:
        measure(run, shape, args.rounds, args.threads)
    rows = [row(run, shape) for shape in shapes]
    print(f"\n{args.threads} threads, medians of the kept rounds")
    print("| shape | 1 user tok/s | 16 users tok/s | ratio | step-time bound | decode 1 / 16 rows ms "
          "| prefill 64 ms (alone / in 8) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['shape']} | {r['one_user_tok_s']:,.1f} | {r['users_16_tok_s']:,.1f} | {r['ratio']:.2f}x | "
              f"{r['step_bound_ratio']:.2f}x | {r['decode_1_ms']:.2f} / {r['decode_16_ms']:.2f} | "
              f"{r['prefill_64_ms']:.1f} / {r['prefill_8x64_ms_per_prompt']:.1f} |")
    settings = cli.settings(args, slots=SLOTS, prompt=PROMPT, prefill_chunk=PREFILL_CHUNK, temperature=TEMPERATURE,
                            spin="step", graph="model.static.onnx")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label),
                  args.results)


if __name__ == "__main__":
    main()
