"""onnxruntime-genai's own generator on a model folder its builder wrote: batch-1 prefill and decode tokens/s,
printed as one JSON object. Run by the Python of the builder's venv (it has onnxruntime_genai; gptport's venv
need not), so this module imports nothing of gptport's or of the benchmarks'.

A run: a fresh generator (greedy, max_length prompt + new tokens + 1, min_length the same so that no end
token stops it early), append_tokens(prompt) timed as the prefill (it runs the model on the prompt), then
1 + NEW calls of generate_next_token: the first picks the token the prompt's logits give, each further one
runs one decode step and picks its token; those NEW are timed as the decode. The prompt is the token ids
100 .. 100 + PROMPT (random weights: any ids). WARMUP runs first, unmeasured; the figures are the mean over
REPEAT runs, like `gptport bench`'s.

    python -m benchmarks.harness.genai_decode MODEL_FOLDER [--prompt-len 64] [--gen-len 128] [--repeat 3]
        [--warmup 1] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from importlib import metadata
from typing import Any


def one_run(og: Any, model: Any, prompt: list[int], gen: int) -> tuple[float, float]:
    """(prefill seconds, decode seconds) of one generation of `gen` tokens after `prompt`."""
    params = og.GeneratorParams(model)
    length = len(prompt) + gen + 1
    params.set_search_options(max_length=length, min_length=length, do_sample=False)
    generator = og.Generator(model, params)
    t0 = time.perf_counter()
    generator.append_tokens(prompt)
    t1 = time.perf_counter()
    generator.generate_next_token()  # the prompt's token: no model run
    t2 = time.perf_counter()
    for _ in range(gen):
        if generator.is_done():
            raise SystemExit(f"genai stopped after {generator.token_count()} tokens, before {length}")
        generator.generate_next_token()
    t3 = time.perf_counter()
    return t1 - t0, t3 - t2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="the decoder session's intra-op threads (0: its default)")
    args = ap.parse_args()
    import onnxruntime_genai as og

    config = og.Config(args.folder)
    config.clear_providers()  # the CPU
    if args.threads:
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": args.threads}}}}))
    model = og.Model(config)
    prompt = list(range(100, 100 + args.prompt_len))
    for _ in range(args.warmup):
        one_run(og, model, prompt, args.gen_len)
    runs = [one_run(og, model, prompt, args.gen_len) for _ in range(args.repeat)]
    print(json.dumps({"prefill_tok_s": statistics.mean(args.prompt_len / p for p, _ in runs),
                      "decode_tok_s": statistics.mean(args.gen_len / d for _, d in runs),
                      "versions": {d: metadata.version(d) for d in ("onnxruntime-genai", "onnxruntime")}}))


if __name__ == "__main__":
    main()
