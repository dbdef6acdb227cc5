"""Where a batch-1 static-cache decode step's time goes on an NVIDIA GPU, for the graphs `export --cuda` writes
(benchmarks/gpu/static_decode.py measures their speed): per configuration, the median wall time of
- replay: session.run_with_iobinding alone (the captured graph replayed, or the uncaptured run);
- replay+read: with the logits row copied back to the host (a synchronisation);
- step: the three input uploads, the run and the read (DeviceDecodeStep.run + rows);
- decode: DeviceSlots.decode (the step with its bookkeeping);
- generate: bench's greedy loop, per token (sampling and detokenising-free);
and, from a CUPTI trace (torch.profiler, which records every kernel of the process, onnxruntime's too), the
kernels a step launches, their summed GPU time and the costliest ones; the same trace of PyTorch's compiled
static decoder (benchmarks/gpu/support/torch_static.py) beside it. Shapes are prepared as static_decode does.

    PYTHONPATH=/tmp/site python3 -m benchmarks.gpu.decode_profile          (on the GPU machine)
    python -m benchmarks.gpu.decode_profile --cpu-dry-run                   (the tiny shape, timings only)
"""

from __future__ import annotations

import statistics
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.gpu import static_decode as sd
from benchmarks.gpu.providers import gpu_name
from benchmarks.harness import cli, results
from benchmarks.harness.run import Run

CONFIGS = ["decode fp32 cuda-graph", "decode fp32", "static fp16 cuda-graph", "static fp16",
           "decode fp32 cuda-graph burst", "static fp16 cuda-graph burst"]


def timed(fn: Callable[[], Any], n: int) -> float:
    """The median wall time of `fn` over n calls, in microseconds."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e6


def kernels(fn: Callable[[], Any], n: int, sync: Callable[[], None]) -> dict[str, Any]:
    """The CUDA kernels of n calls of `fn` from a CUPTI trace: per call, their count and summed GPU time,
    the wall span, and the 8 costliest kernels (name, count and µs per call)."""
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        wall = time.perf_counter() - t0
    count: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower() and "memset" not in e.name.lower():
            count[e.name] += 1
            total[e.name] += e.time_range.end - e.time_range.start  # µs
    top = sorted(total, key=total.__getitem__, reverse=True)[:8]
    return {"kernels_per_step": sum(count.values()) / n, "gpu_us_per_step": sum(total.values()) / n,
            "wall_us_per_step": wall / n * 1e6,
            "top": [{"kernel": k[:120], "per_step": count[k] / n, "us_per_step": total[k] / n} for k in top]}


def ours(shape: str, name: str, provider: str, n: int) -> dict[str, Any]:
    """The breakdown of configuration `name` (static_decode.CONFIGS) on the shape's model."""
    d = sd.WORK / shape
    model = sd.engine(d, provider, name)
    step = model.step(last_only=True)
    ids = np.arange(1, sd.PROMPT + 1, dtype=np.int64)[None]  # (1, P)
    logits, past = step(ids, np.ones_like(ids), np.arange(sd.PROMPT, dtype=np.int64)[None], past := model.empty_past(1))
    slots, tok = past.slots, np.array([int(logits[0, -1].argmax())])
    row = np.arange(1)
    slots.decode(row, tok)  # the first decode step: captured here when graphs are on
    sync = _sync(provider)
    if model.bursts:  # per token: a burst's figures over its k tokens
        return burst_figures(model, slots, tok, n, sync)
    dstep = slots._decode_step(0, 1)
    session = slots.session
    out: dict[str, Any] = {"graph_id": dstep.graph_id, "providers": session.get_providers()}
    out["replay_us"] = timed(lambda: session.run_with_iobinding(dstep.binding, dstep.options), n)
    out["replay_read_us"] = timed(lambda: (session.run_with_iobinding(dstep.binding, dstep.options),
                                           dstep.rows(row)), n)
    out["step_us"] = timed(lambda: (dstep.run(session), dstep.rows(row)), n)
    out["upload_us"] = timed(lambda: [v.update_inplace(a) for v, a in dstep._uploads], n)
    out["read_us"] = timed(lambda: dstep.rows(row), n)
    out["argmax_us"] = timed(lambda: int(dstep.rows(row)[0].argmax()), n) - out["read_us"]
    left = model.config.n_ctx - int(slots.lengths[0]) - 2
    steps = min(n, left)
    out["decode_us"] = timed(lambda: slots.decode(row, tok), steps)
    out["generate_us"] = 1e6 / sd.decode_speed(model, 0)
    if provider == "cuda":
        out["trace"] = kernels(lambda: session.run_with_iobinding(dstep.binding, dstep.options), 20, sync)
    return out


def burst_figures(model: Any, slots: Any, tok: np.ndarray, n: int, sync: Callable[[], None]) -> dict[str, Any]:
    """A burst's replay, its run with the uploads and the tokens' read, and the generate loop, each per
    token (over its k tokens); its kernels per token."""
    k = model.bursts
    model.prepare_bursts()
    session = model._burster[1]
    slots.burst(tok, session, k)  # the first burst: captured here when graphs are on
    bstep = slots._bursts[(1, k)]
    out: dict[str, Any] = {"graph_id": bstep.graph_id, "providers": session.get_providers(), "k": k}
    out["replay_us"] = timed(lambda: session.run_with_iobinding(bstep.binding, bstep.options), n) / k
    out["step_us"] = timed(lambda: (bstep.run(session), bstep.tokens(1)), n) / k
    out["generate_us"] = 1e6 / sd.decode_speed(model, 0)
    if model.provider == "cuda":
        trace = kernels(lambda: session.run_with_iobinding(bstep.binding, bstep.options), 20, sync)
        out["trace"] = {**trace, "kernels_per_step": trace["kernels_per_step"] / k,
                        "gpu_us_per_step": trace["gpu_us_per_step"] / k}
    return out


def theirs(shape: str, provider: str) -> dict[str, Any]:
    """PyTorch's compiled static decoder (fp16 on CUDA, fp32 uncompiled on the CPU): its step's wall time
    with the token left on the device, and its kernels."""
    import torch

    from benchmarks.gpu.support.torch_static import StaticDecoder
    from gptport import tokenizer as bpe
    from gptport.training.checkpoint import load_model

    d = sd.WORK / shape
    cuda = provider == "cuda"
    model, _ = load_model(d, bpe.load(d), provider)
    model = model.to(torch.float16 if cuda else torch.float32).eval()
    dec = StaticDecoder(model, 1)
    step = torch.compile(dec, mode="reduce-overhead", fullgraph=True) if cuda else dec
    tok = torch.ones((1, 1), dtype=torch.long, device=provider)
    pos = torch.tensor([sd.PROMPT], device=provider)
    sync = _sync(provider)
    with torch.no_grad():
        for _ in range(3):
            step(tok, pos.clone())
        out: dict[str, Any] = {"dtype": "float16" if cuda else "float32", "compiled": cuda}
        out["step_us"] = timed(lambda: step(tok, pos).argmax(-1, keepdim=True), 200)
        out["step_synced_us"] = timed(lambda: (step(tok, pos).argmax(-1, keepdim=True).cpu()), 200)
        if cuda:
            out["trace"] = kernels(lambda: step(tok, pos).argmax(-1, keepdim=True), 20, sync)
    return out


def _sync(provider: str) -> Callable[[], None]:
    if provider != "cuda":
        return lambda: None
    import torch

    return torch.cuda.synchronize


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="which of " + ", ".join(CONFIGS))
    ap.add_argument("--no-torch", dest="torch", action="store_false", help="leave PyTorch's decoder out")
    ap.add_argument("--steps", type=int, default=200, help="timed calls per figure")
    ap.add_argument("--budget-s", type=float, default=300, help="stages starting later are skipped, said so")
    ap.add_argument("--cpu-dry-run", action="store_true", help="the tiny shape on the CPU, no kernel trace")
    args = ap.parse_args()
    if args.cpu_dry_run:
        sd.WORK = sd.ROOT_WORK / "gpu-profile-dry-run"
        args.shapes = "tiny"
        args.results = args.results if "--results" in sys.argv else sd.WORK
    else:
        sd.with_cuda_libraries("benchmarks.gpu.decode_profile")
    provider, gpu, t_start = "cpu" if args.cpu_dry_run else "cuda", gpu_name(), time.perf_counter()
    run, rows, data = Run(), [], {}
    sd.WORK.mkdir(parents=True, exist_ok=True)

    def stage(name: str, fn: Callable[[], Any]) -> Any:
        if time.perf_counter() - t_start > args.budget_s:
            data[name] = {"error": f"skipped: the {args.budget_s:.0f} s budget was spent"}
            return None
        print(f"== {name}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            data[name] = fn()
        except Exception as e:  # a stage's failure is a finding: record it, go on
            data[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
            print(data[name]["error"], file=sys.stderr)
        data[f"{name} seconds"] = time.perf_counter() - t0
        return data[name]

    def write() -> None:
        doc = results.document(results.benchmark_name(__spec__), run, rows, cli.settings(args),
                               gpu=None if args.cpu_dry_run or gpu == "no GPU" else gpu, label=args.label,
                               details={"gpu": gpu, **data})
        results.write(doc, args.results)

    for shape in args.shapes.split(","):
        with run.round(shape=shape):
            got = stage(f"prepare {shape}", lambda s=shape: sd.prepare(s)[1])
            if got is None or "error" in got:
                continue
            for name in args.configs.split(","):
                r = stage(f"{shape} {name}", lambda s=shape, n=name: ours(s, n, provider, args.steps))
                if isinstance(r, dict) and "error" not in r:
                    trace = r.get("trace", {})
                    rows.append({"table": "breakdown", "shape": shape, "config": name,
                                 **{k: round(v, 1) for k, v in r.items() if k.endswith("_us")},
                                 "kernels": trace.get("kernels_per_step"),
                                 "gpu_us": round(trace["gpu_us_per_step"], 1) if trace else None})
            r = stage(f"{shape} torch", lambda s=shape: theirs(s, provider)) if args.torch else None
            if isinstance(r, dict) and "error" not in r:
                trace = r.get("trace", {})
                rows.append({"table": "breakdown", "shape": shape, "config": f"torch {r['dtype']}",
                             "step_us": round(r["step_us"], 1), "decode_us": round(r["step_synced_us"], 1),
                             "kernels": trace.get("kernels_per_step"),
                             "gpu_us": round(trace["gpu_us_per_step"], 1) if trace else None})
        write()
    for r in rows:
        print("  " + " ".join(f"{k}={v}" for k, v in r.items() if v is not None))


if __name__ == "__main__":
    main()
