"""The static-cache decode on an NVIDIA GPU, in one run of at most ~8 minutes on an H100 or H200: the graphs
`export --cuda` writes (fp32: TensorScatter + Attention-24; fp16: GroupQueryAttention), the cache bound on
the device, decode steps replayed as CUDA graphs, against today's contract graph and PyTorch's own best on
the same model in the same run.

For each shape (gpt2-124m first, then small; vocabularies 32,768 and 4,096 from the standard library's
sources, as benchmarks.gpu.providers; `--shapes smollm2-shape` adds the Llama family at SmolLM2-135M's size,
smollm2_shape.toml, whose grouped heads have the fp16 graph only): seeded random weights (speed does not
depend on them), exported fp32 and fp16 with --no-gate --cuda (the decode graph is still checked against
torch). Then, each stage recorded even when another fails, stopping when the time budget is spent:
- decode: batch-1 greedy decode tok/s (prompt 64, 128 new: `gptport bench`'s loop) of the contract graph
  fp32 and fp16 (today's), the decode graph fp32 and the fp16 static graph each with and without CUDA
  graphs and with CUDA graphs of 8-step greedy bursts (runtime/burst.py), and torch: gptport's GPT over a
  static cache under torch.compile(mode="reduce-overhead"), fp32 and fp16
  (benchmarks/gpu/support/torch_static.py); configurations interleaved over --rounds rounds;
- greedy: the device graphs' greedy tokens against the CPU provider's static-cache graph of the same
  precision (fp32: every row equal), and torch's compiled decoder's against gptport's torch model;
- serve (gpt2-124m): `gptport serve --provider cuda --slots 16` under `gptport bench-serve` at 8 and 16
  users, with the device graphs and with today's contract graph (--kv-cache concat);
then the `gpu`-marked tests (pytest -m gpu tests/gpu). The results file is named after the GPU.

    PYTHONPATH=/tmp/site python3 -m benchmarks.gpu.static_decode      (benchmarks/gpu/support/carry.py: onnxruntime-gpu)
    python -m benchmarks.gpu.static_decode --cpu-dry-run              (every stage on the CPU, the tiny shape)

--cpu-dry-run runs the same code on the CPU provider (the device graphs over host memory, the serve and test
stages as they run there, torch uncompiled) with the tiny shape, so that the script is known to work
before a GPU session spends its minutes; its results go to benchmarks/work/ unless --results says otherwise.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.gpu.providers import VOCAB, corpus_file, gptport, gpu_name
from benchmarks.harness import cli, results
from benchmarks.harness.models import WORK as ROOT_WORK
from benchmarks.harness.models import random_weights
from benchmarks.harness.run import Run
from gptport.runtime.choice import GraphChoice, RunOptions

WORK = ROOT_WORK / "gpu-static"
PROMPT, NEW = 64, 128
SHAPE_FILES = {"smollm2-shape": Path(__file__).parent / "smollm2_shape.toml"}  # the Llama family at SmolLM2's size
GOALS = {("gpt2-124m", "fp32"): 2000.0, ("gpt2-124m", "fp16"): 2500.0, ("small", "best"): 4000.0}


def with_cuda_libraries(module: str = "benchmarks.gpu.static_decode") -> None:
    """Re-run this process with the CUDA libraries of the nvidia-* packages (PyTorch's: cuBLAS, cuDNN, cuRAND,
    cudart) on LD_LIBRARY_PATH, which onnxruntime-gpu's provider loads, for it and its children (serve);
    `module`: the script re-run."""
    spec = importlib.util.find_spec("nvidia")
    dirs = sorted(str(p) for base in (spec.submodule_search_locations or []) for p in Path(base).glob("*/lib")
                  ) if spec is not None else []
    have = os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
    if dirs and not set(dirs) <= set(have):
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join([*dirs, *filter(None, have)])
        os.execv(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]])


def prepare(shape: str) -> tuple[Path, dict[str, float]]:
    """WORK/<shape>: a tokenizer, seeded random weights, every graph exported with --cuda (--no-gate); the
    export is reused where an earlier run of the same gptport source made it from the same weights file (a
    later call to a warm machine: decode_profile after static_decode)."""
    d, took = WORK / shape, {}
    t0 = time.perf_counter()
    if not (d / "tokenizer.json").exists():
        gptport("train-tokenizer", str(corpus_file()), "--vocab-size", str(VOCAB[shape]), "--out", str(d), "--force")
    if not (d / "model.safetensors").exists():  # a shape of its own is a preset file beside this script
        random_weights(d, str(SHAPE_FILES.get(shape, shape)))
    took["weights_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    from gptport.export import trace_cache

    weights = (d / "model.safetensors").stat()
    marker, stamp = d / "prepared.json", json.dumps({"source": trace_cache.source_digest(),
                                                     "weights": [weights.st_size, weights.st_mtime_ns]})
    if marker.exists() and marker.read_text() == stamp:  # a later call on the same warm machine, same code
        took["export_reused"] = 1.0
        return d, took
    marker.unlink(missing_ok=True)
    gptport("export", str(d), "--precision", "fp32,fp16", "--no-gate", "--cuda", "--force", timeout=1200)
    marker.write_text(stamp)
    took["export_s"] = time.perf_counter() - t0
    return d, took


CONFIGS = ["contract fp32", "contract fp16", "decode fp32 cuda-graph burst", "decode fp32 cuda-graph", "decode fp32",
           "static fp16 cuda-graph burst", "static fp16 cuda-graph", "static fp16"]


def engine(d: Path, provider: str, name: str) -> Any:
    """The engine of configuration `name` (CONFIGS). On the CPU (dry run) the device graphs run over host
    memory (cuda_engine.on_device), as the tests run them."""
    from gptport import contract
    from gptport.runtime import cuda_engine
    from gptport.runtime.loader import open_graph
    from gptport.runtime.onnx_engine import load

    kind, p, *how = name.split()
    if kind == "contract":
        return open_graph(d, GraphChoice.parse(precision=p, cache="concat"), RunOptions.parse(provider=provider))
    if provider == "cuda":
        model = open_graph(d, GraphChoice.parse(precision=p, cache="static"),
                           RunOptions.parse(provider=provider), cuda_graph="cuda-graph" in how)
    else:
        path = cuda_engine.graph_path(d, p, required=True)
        assert path is not None
        twin = load(d / contract.onnx_file("fp32", contract.CACHE_APPEND), provider) if p == "fp32" else None
        model = cuda_engine.on_device(load(path, provider), twin, cuda_graph=False)
        model.graphs = "cuda-graph" in how  # gpu_graph_id run options as on CUDA (ignored by the CPU provider)
    model.bursts = cuda_engine.BURST_STEPS if "burst" in how else 0  # greedy steps a run
    return model


def decode_speed(engine: Any, seed: int) -> float:
    """Batch-1 decode tok/s of one greedy run (bench.time_generation's loop: prompt 64, 128 new)."""
    from gptport.runtime.bench import time_generation

    _, _, steps = time_generation(engine, engine.config.vocab_size, 1, PROMPT, NEW, seed)
    return len(steps) / sum(steps)


def torch_speeds(d: Path, device: str, compiled: bool) -> dict[str, Any]:
    """torch_static.greedy on the shape's model, fp32 and fp16 (fp16 on CUDA only), with gptport's torch
    model's greedy tokens beside it."""
    import torch

    from benchmarks.gpu.support.torch_static import greedy
    from gptport import tokenizer as bpe
    from gptport.runtime.generate import generate
    from gptport.runtime.sampling import Sampling
    from gptport.training.checkpoint import load_model
    from gptport.training.torch_engine import TorchEngine

    model, _ = load_model(d, bpe.load(d), device)
    prompt = list(range(1, PROMPT + 1))
    want = generate(TorchEngine(model), [prompt], NEW, Sampling(), -1)[0].new_ids
    out: dict[str, Any] = {}
    for dtype in [torch.float32] + ([torch.float16] if device == "cuda" else []):
        got = greedy(copy.deepcopy(model), prompt, NEW, compiled, dtype)
        got["tokens_equal_gptport_torch"] = got.pop("tokens") == want if dtype == torch.float32 else None
        out[got["dtype"]] = got
    return out


def greedy_check(d: Path, opened: dict[str, Any]) -> dict[str, Any]:
    """Each device graph's greedy tokens (4 prompts x 64 new) against the CPU provider's static-cache graph
    of its precision: the share of rows equal and where the first difference is."""
    from gptport import contract
    from gptport.runtime.generate import generate
    from gptport.runtime.onnx_engine import load_cpu
    from gptport.runtime.sampling import Sampling

    prompts = [list(range(7 * i + 1, 7 * i + 1 + n)) for i, n in enumerate((5, 17, 1, 40))]
    out = {}
    for name in ("decode fp32 cuda-graph", "decode fp32 cuda-graph burst", "static fp16 cuda-graph",
                 "static fp16 cuda-graph burst"):
        if name not in opened:  # its opening failed, and says so
            continue
        p = name.split()[1]
        cpu = generate(load_cpu(d / contract.onnx_file(p, contract.CACHE_STATIC)), prompts, 64, Sampling(), -1)
        got = generate(opened[name], prompts, 64, Sampling(), -1)
        first = [next((i for i, (a, b) in enumerate(zip(x.new_ids, y.new_ids, strict=True)) if a != b), 64)
                 for x, y in zip(cpu, got, strict=True)]
        out[name] = {"rows_equal_cpu": sum(f == 64 for f in first) / len(first), "first_difference_at": first}
    return out


def serving(d: Path, provider: str, users: list[int], concat: bool) -> dict[str, Any]:
    """`gptport serve --provider P --slots 16` (its device graphs, or --kv-cache concat) under bench-serve."""
    from tests.support import server_proc

    port, tag = server_proc.free_port(), "concat" if concat else "device"
    url, log, path = server_proc.url_of(port), WORK / f"serve-{tag}.log", WORK / f"serve-{tag}.json"
    cmd = [sys.executable, "-m", "gptport.cli.main", "serve", str(d), "--provider", provider, "--port", str(port),
           "--slots", str(max(users)), *(["--kv-cache", "concat"] if concat else [])]
    with server_proc.running(cmd, url, log):
        gptport("bench-serve", url, "--concurrency", ",".join(map(str, users)), "--num-prompts", str(3 * max(users)),
                "--max-tokens", "128", "--json", str(path), timeout=600)
    return {"startup": next((ln for ln in log.read_text().splitlines() if "slots" in ln), ""),
            "results": [{k: r.get(k) for k in ("concurrency", "completed", "failed", "output_throughput",
                                               "median_ttft_ms", "median_tpot_ms")}
                        for r in json.loads(path.read_text()).get("results", [])]}


def start_tests() -> subprocess.Popen[str]:
    """pytest -m gpu tests/gpu in the background: its fixtures train and export on the CPU while this run
    exports; it is waited for before anything is timed."""
    log = open(WORK / "gpu-tests.log", "w")  # noqa: SIM115 - the child writes it until finish_tests
    return subprocess.Popen([sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-rs", "-n", "0", "-p",
                             "no:cacheprovider"], stdout=log, stderr=subprocess.STDOUT, text=True)


def finish_tests(proc: subprocess.Popen[str], limit: float) -> dict[str, Any]:
    """The background tests' summary line and exit code, once they end (killed past `limit` seconds)."""
    try:
        proc.wait(timeout=max(limit, 1))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return {"error": f"the gpu tests ran past the budget ({limit:.0f} s more were allowed)"}
    lines = (WORK / "gpu-tests.log").read_text().strip().splitlines()
    return {"returncode": proc.returncode, "summary": lines[-1] if lines else "", "tail": "\n".join(lines[-25:])}


def goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's goals against the measured rows (None where a figure is missing)."""
    speed = {(r["shape"], r["config"]): r["decode_tok_s"] for r in rows if r["table"] == "decode"}
    out = []
    for (shape, p), goal in GOALS.items():
        mine = [v for (s, c), v in speed.items() if s == shape and not c.startswith(("torch", "contract"))
                and (p == "best" or c.split()[1] == p)]
        best = max(mine, default=None)
        out.append({"table": "goals", "goal": f"{shape} {p} decode ≥ {goal:,.0f} tok/s", "value": best,
                    "met": best >= goal if best is not None else None})
    for shape in {s for s, _ in speed}:
        mine = max((v for (s, c), v in speed.items() if s == shape and not c.startswith(("torch", "contract"))),
                   default=None)
        best = max((v for (s, c), v in speed.items() if s == shape and c.startswith("torch")), default=None)
        ratio = mine / best if mine and best else None
        out.append({"table": "goals", "goal": f"{shape} ≥ 1.0x torch's best", "value": ratio,
                    "met": ratio >= 1.0 if ratio else None})
    served = {(r["shape"], r["graph"], r["concurrency"]): r["output_throughput"] for r in rows
              if r["table"] == "serving" and r.get("output_throughput")}
    for shape in {s for s, _, _ in served}:
        today, mine = served.get((shape, "contract", 8)), served.get((shape, "device", 16))
        ratio = mine / today if mine and today else None
        out.append({"table": "goals", "goal": f"{shape} serve at 16 users ≥ 2x today's 8-user throughput",
                    "value": ratio, "met": ratio >= 2.0 if ratio else None})
    return out


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="gpt2-124m,small")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved decode rounds (each config once a round)")
    ap.add_argument("--budget-s", type=float, default=450, help="stages starting later are skipped, said so")
    ap.add_argument("--stages", default="decode,greedy,torch,serve,tests")
    ap.add_argument("--cpu-dry-run", action="store_true", help="every stage on the CPU with the tiny shape")
    args = ap.parse_args()
    if args.cpu_dry_run:
        global WORK
        WORK = ROOT_WORK / "gpu-static-dry-run"
        args.shapes = "tiny"
        args.results = args.results if "--results" in sys.argv else WORK
    else:
        with_cuda_libraries()
    t_start = time.perf_counter()
    from gptport.runtime.providers import probe

    gpu, status = gpu_name(), probe("cuda")
    provider = "cpu" if args.cpu_dry_run else "cuda"
    if not args.cpu_dry_run and not status.ok:
        raise SystemExit(f"the CUDA provider does not run here: {status.reason} (see benchmarks/gpu/support/carry.py)")
    run, rows, data = Run(), [], {}

    def stage(name: str, rnd: Any, fn: Callable[[], Any]) -> Any:
        if name.split()[0] not in args.stages.split(",") and name.split()[0] not in ("prepare", "open"):
            return None
        if time.perf_counter() - t_start > args.budget_s:
            rnd.data[name] = {"error": f"skipped: the {args.budget_s:.0f} s budget was spent"}
            return None
        print(f"== {name}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            rnd.data[name] = fn()
        except Exception as e:  # a stage's failure is a finding: record it, go on with the next
            rnd.data[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
            print(rnd.data[name]["error"], file=sys.stderr)
        rnd.data[f"{name} seconds"] = time.perf_counter() - t0
        return rnd.data[name]

    def write() -> None:
        made = decode_rows(run, ready) + rows
        doc = results.document(results.benchmark_name(__spec__), run, made + goals(made), cli.settings(args),
                               gpu=None if args.cpu_dry_run or gpu == "no GPU" else gpu, label=args.label,
                               details={"gpu": gpu, "cuda": status.__dict__, **data})
        results.write(doc, args.results)

    WORK.mkdir(parents=True, exist_ok=True)
    tests = start_tests() if "tests" in args.stages.split(",") else None
    ready = []
    for shape in args.shapes.split(","):
        with run.round(shape=shape, stage="prepare") as rnd:
            prepared = stage(f"prepare {shape}", rnd, lambda s=shape: prepare(s)[1])
        if prepared is not None and "error" not in prepared:
            ready.append(shape)
    if tests is not None:  # before anything is timed: they use the GPU too
        data["gpu tests"] = finish_tests(tests, args.budget_s + 60 - (time.perf_counter() - t_start))
    write()
    for shape in ready:  # every shape's decode figures first, the slower checks after: the budget may end them
        measure(shape, WORK / shape, provider, args.rounds, run, stage, data)
        write()
    for shape in ready:
        rows += checks(shape, WORK / shape, provider, run, stage, data)
        write()
    made = decode_rows(run, ready) + rows
    for r in made + goals(made):
        print("  " + " ".join(f"{k}={v}" for k, v in r.items() if v is not None))


def measure(shape: str, d: Path, provider: str, rounds: int, run: Run, stage: Callable[..., Any],
            data: dict[str, Any]) -> None:
    """The shape's decode rounds and the device graphs' greedy tokens against the CPU provider's (decode_rows
    makes its rows)."""
    opened: dict[str, Any] = {}
    with run.round(shape=shape, stage="open") as rnd:
        for name in CONFIGS:
            got = stage(f"open {name}", rnd, lambda n=name: engine(d, provider, n))
            if got is None or (isinstance(got, dict) and "error" in got):
                continue
            rnd.data[f"open {name}"] = got.session.get_providers()
            # warm-up: capture, and a burst's session, before the timed rounds; a failure drops the config
            warm = stage(f"open {name} warm-up", rnd, lambda e=got: decode_speed(e, 0))
            if not (isinstance(warm, dict) and "error" in warm):
                opened[name] = got
    for rnd in run.series(rounds, shape=shape, stage="decode"):
        for name in rnd.order(list(opened)):
            stage(f"decode {name}", rnd, lambda e=opened[name], i=rnd.index: decode_speed(e, i))
    with run.round(shape=shape, stage="checks") as rnd:
        data[f"greedy {shape}"] = stage(f"greedy {shape}", rnd, lambda: greedy_check(d, opened))
    opened.clear()  # the sessions' GPU memory, before the next shape, torch and the servers take theirs


def decode_rows(run: Run, shapes: list[str]) -> list[dict[str, Any]]:
    """Each shape's decode rows from the rounds the run keeps as last judged (a later round's probe may
    discard earlier ones: the rows are made again at every write)."""
    run.judge()
    rows = []
    for shape in shapes:
        series = [r for r in run.rounds if r.tags == {"shape": shape, "stage": "decode"}]
        kept = run.kept(shape=shape, stage="decode")  # none kept: all, said so in the notes and the row
        names = dict.fromkeys(k.removeprefix("decode ") for r in series for k in r.data
                              if k.startswith("decode ") and not k.endswith(" seconds"))
        for name in names:
            speeds = [v for r in kept if isinstance(v := r.data.get(f"decode {name}"), float)]
            if speeds:
                rows.append({"table": "decode", "shape": shape, "config": name,
                             "decode_tok_s": statistics.mean(speeds),
                             "std": statistics.stdev(speeds) if len(speeds) > 1 else 0.0, "rounds": len(speeds),
                             "rounds_disturbed": not any(not r.discarded for r in series)})
    return rows


def checks(shape: str, d: Path, provider: str, run: Run, stage: Callable[..., Any],
           data: dict[str, Any]) -> list[dict[str, Any]]:
    """(gpt2-124m, tiny) serving at 8 and 16 users, then PyTorch's own best on the shape: its rows."""
    rows: list[dict[str, Any]] = []
    with run.round(shape=shape, stage="torch-serve") as rnd:
        if shape in ("gpt2-124m", "tiny"):
            for concat in (False, True):
                served = stage(f"serve {shape} {'concat' if concat else 'device'}", rnd,
                               lambda c=concat: serving(d, provider, [8, 16], c))
                rows += [{"table": "serving", "shape": shape, "graph": "contract" if concat else "device", **r}
                         for r in (served or {}).get("results", []) if isinstance(served, dict)]
        got = stage(f"torch {shape}", rnd, lambda: torch_speeds(d, provider, compiled=provider == "cuda"))
        for dtype, r in (got or {}).items():
            if isinstance(r, dict) and "decode_tok_s" in r:
                rows.append({"table": "decode", "shape": shape, "config": f"torch {dtype} "
                             f"{'compiled' if r['compiled'] else 'eager'}", "decode_tok_s": r["decode_tok_s"],
                             "tokens_equal_gptport_torch": r["tokens_equal_gptport_torch"]})
    return rows


if __name__ == "__main__":
    main()
