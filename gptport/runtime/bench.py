"""Measurements: prefill and decode speed per (engine, provider, precision, batch, prompt length),
against the torch baseline and the machine's memory read bandwidth. No torch here: the baseline's engine
comes from the caller (`open_torch`: gptport.training.torch_engine.open_torch, or the CLI's open_engine).

Decode tokens/s counts generated tokens only (batch x steps after the first token), never the prompt.
"""

from __future__ import annotations

import itertools
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from gptport import __version__, contract
from gptport.errors import GptportError, UsageError
from gptport.machine import describe
from gptport.runtime.accept import Accepting
from gptport.runtime.choice import CacheLayout, GraphChoice, RunOptions, Spin
from gptport.runtime.engine import Bursting, Engine, bursting, positions
from gptport.runtime.host_measures import measure_bandwidth, peak_rss_mb, peak_rss_reset, weight_bytes_per_token

if TYPE_CHECKING:
    from gptport.runtime.loader import Opened

TorchOpener = Callable[[Path, str, int], "Opened"]  # (model_dir, provider, threads) -> the torch engine


@dataclass(frozen=True)
class BenchPlan:
    providers: Sequence[str] = ("cpu",)
    precisions: Sequence[str] = ("fp32",)
    batches: Sequence[int] = (1,)
    prompt_lens: Sequence[int] = (64,)
    gen_len: int = 128
    repeat: int = 5
    warmup: int = 1
    threads: int = 0
    torch_baseline: bool = True
    kv_caches: Sequence[str] = ("auto",)  # auto | static | concat (loader.graph_path)
    kv_dtypes: Sequence[str] = ("float32",)  # float32 | int8 (the static graph's int8 cache)
    probe_mib: int = 1024  # the bandwidth probe's buffer: far larger than the caches
    draft: Path | None = None  # speculative rows (batch 1, static cache, CPU) with this draft model beside plain
    draft_tokens: int | None = None  # drafts per step (None: adaptive)
    draft_precision: str | None = None  # the draft's variant (None: each row's precision)
    draft_threads: int | None = None  # the draft session's threads (None: speculative.DRAFT_THREADS)
    bursts: int = 0  # greedy decode steps a run on export --cuda's graphs (cuda_engine.DeviceModel.bursts)


@dataclass
class Row:
    """One configuration's figures (JSON schema of `gptport bench --json`)."""

    engine: str
    provider: str
    precision: str
    batch: int
    prompt_len: int
    gen_len: int
    kv_cache: str = "-"  # concat (model.onnx's contract) or static (preallocated, appended in place); torch: -
    bursts: int = 0  # greedy decode steps a run (0: one a run); latencies are then a burst's mean
    prefill_tok_s: float | None = None
    prefill_tok_s_std: float | None = None
    decode_tok_s: float | None = None
    decode_tok_s_std: float | None = None
    ttft_ms: float | None = None
    latency_ms_p50: float | None = None
    latency_ms_p90: float | None = None
    latency_ms_p99: float | None = None
    speedup_vs_torch: float | None = None
    prefill_speedup_vs_torch: float | None = None
    weight_bytes_per_token: int | None = None
    bandwidth_gb_s: float | None = None  # CPU rows: read bandwidth, mean of probes before the warm-up and after
    bandwidth_fraction: float | None = None
    session_s: float | None = None
    peak_rss_mb: float | None = None  # of the whole process, in MiB (host memory; GPU memory is not measured)
    providers_ran: list[str] = field(default_factory=list)
    samples: int = 0
    error: str | None = None
    draft: str | None = None  # speculative rows: the draft model's directory name
    draft_precision: str | None = None  # and the draft's variant
    acceptance: float | None = None  # drafts the target kept
    tokens_per_step: float | None = None  # tokens per target step
    speedup_vs_plain: float | None = None  # decode tok/s over the plain row of the same graph and shape


def time_generation(engine: Engine, vocab: int, batch: int, prompt_len: int, gen_len: int, seed: int
                    ) -> tuple[float, float, list[float]]:
    """One greedy run on random ids: (prefill seconds, time to first token, per-step decode seconds). An
    engine asked for greedy bursts (cuda_engine.DeviceModel.bursts) runs them while k tokens are left,
    their session made before the clock starts; a burst's time is spread evenly over its k tokens, so
    the per-token latencies are a burst's mean, not what a streaming client sees token by token. Each row
    takes its tokens through accept.Accepting (no end ids: every run is gen_len tokens), off the clock."""
    burster = bursting(engine)
    if burster is not None:
        burster.prepare_bursts()
    k = burster.bursts if burster is not None else 0
    takers = [Accepting(gen_len, frozenset()) for _ in range(batch)]
    step = engine.step(last_only=True)
    ids = np.random.default_rng(seed).integers(0, vocab, (batch, prompt_len), dtype=np.int64)
    mask = np.ones_like(ids)
    pos = positions(mask)
    past = engine.empty_past(batch)
    t0 = time.perf_counter()
    logits, past = step(ids, mask, pos, past)
    t_prefill = time.perf_counter() - t0
    nxt = logits[:, -1].argmax(-1).astype(np.int64)[:, None]  # (B, 1)
    ttft = time.perf_counter() - t0
    _take(takers, nxt)
    steps: list[float] = []
    while len(steps) < gen_len - 1:
        if burster is not None and mask.shape[1] + k <= engine.n_ctx and gen_len - 1 - len(steps) >= k:
            t = time.perf_counter()  # k steps in one run
            got = burster.burst(past, nxt[:, 0])  # (B, k)
            steps += [(time.perf_counter() - t) / k] * k
            _take(takers, got)
            nxt = got[:, -1:]  # (B, 1)
            mask, pos = np.ones((batch, mask.shape[1] + k), dtype=np.int64), pos[:, -1:] + k
            continue
        mask = np.ones((batch, mask.shape[1] + 1), dtype=np.int64)
        pos = pos[:, -1:] + 1
        t = time.perf_counter()
        logits, past = step(nxt, mask, pos, past)
        nxt = logits[:, -1].argmax(-1).astype(np.int64)[:, None]
        steps.append(time.perf_counter() - t)
        _take(takers, nxt)
    return t_prefill, ttft, steps


def _take(takers: list[Accepting], tokens: np.ndarray) -> None:
    """Each row's tokens (B, n) taken in order by its Accepting."""
    for taker, row in zip(takers, tokens.tolist(), strict=True):
        for tok in row:
            taker.accept(tok)


def _fill(row: Row, engine: Engine, vocab: int, plan: BenchPlan,
          probe: Callable[[], float] | None = None) -> None:
    """The row's figures over plan.repeat runs after plan.warmup; with `probe`, the memory bandwidth is
    measured before the warm-up (whose run refills the caches the probe flushed) and after the last
    run, and the row gets the mean. Peak RSS: the engine's creation and its runs, not the probe's."""
    prefill, decode, ttfts, latencies = [], [], [], []
    peaks = [peak_rss_mb()]  # the session's creation
    bandwidths = [probe()] if probe is not None else []
    peak_rss_reset()  # forget the probe's buffer
    for i in range(plan.warmup + plan.repeat):
        t_prefill, ttft, steps = time_generation(engine, vocab, row.batch, row.prompt_len, row.gen_len, seed=i)
        peaks.append(peak_rss_mb())
        if i < plan.warmup:
            continue
        prefill.append(row.batch * row.prompt_len / t_prefill)
        decode.append(row.batch * len(steps) / sum(steps))
        ttfts.append(ttft)
        latencies.extend(steps)
    lat = np.array(latencies) * 1e3
    row.prefill_tok_s, row.decode_tok_s = statistics.mean(prefill), statistics.mean(decode)
    row.prefill_tok_s_std = statistics.stdev(prefill) if len(prefill) > 1 else 0.0
    row.decode_tok_s_std = statistics.stdev(decode) if len(decode) > 1 else 0.0
    row.ttft_ms = statistics.median(ttfts) * 1e3
    row.latency_ms_p50, row.latency_ms_p90, row.latency_ms_p99 = (float(np.percentile(lat, q)) for q in (50, 90, 99))
    row.samples = len(decode)
    row.peak_rss_mb = max((p for p in peaks if p is not None), default=None)
    if probe is not None:
        row.bandwidth_gb_s = statistics.mean([*bandwidths, probe()]) / 1e9


def _draft_row(plain: Row, model: Any, plan: BenchPlan) -> Row:
    """Speculative decoding of the plain row's runs (the same random prompts, greedy): decode tok/s counts
    every new token over the drafting steps (the prompt's prefill apart), with the acceptance rate and
    the tokens per target step."""
    from gptport.runtime.loader import open_graph
    from gptport.runtime.sampling import Sampling
    from gptport.runtime.speculative import ModelDrafter, SpecStats, draft_threads, speculate

    assert plan.draft is not None
    row = Row("onnx", plain.provider, plain.precision, 1, plain.prompt_len, plain.gen_len, kv_cache="static",
              draft=plan.draft.name, draft_precision=plan.draft_precision or plain.precision,
              providers_ran=plain.providers_ran)
    try:
        # its workers (if any) stop spinning after each step: the target's session needs the cores next
        draft = open_graph(plan.draft, GraphChoice.parse(row.draft_precision, CacheLayout.STATIC),
                           RunOptions(plain.provider, draft_threads(plan.draft_threads), Spin.STEP))
    except GptportError as e:
        row.error = f"--draft {plan.draft}: {e}"
        return row
    stats, speeds = SpecStats(), []
    for i in range(plan.warmup + plan.repeat):
        ids = np.random.default_rng(i).integers(0, model.config.vocab_size, plain.prompt_len).tolist()
        counted = SpecStats()
        out = speculate(model, ModelDrafter(draft), ids, plain.gen_len, Sampling(), -1, k=plan.draft_tokens,
                        stats=counted)
        if i >= plan.warmup:
            stats.add(counted)
            speeds.append(len(out.new_ids) / out.decode_s)
    row.decode_tok_s = statistics.mean(speeds)
    row.decode_tok_s_std = statistics.stdev(speeds) if len(speeds) > 1 else 0.0
    row.acceptance, row.tokens_per_step, row.samples = stats.acceptance, stats.tokens_per_step, len(speeds)
    row.speedup_vs_plain = row.decode_tok_s / plain.decode_tok_s if plain.decode_tok_s else None
    return row


def _shapes(plan: BenchPlan, n_ctx: int) -> Iterator[tuple[int, int]]:
    for batch in plan.batches:
        for prompt_len in plan.prompt_lens:
            if prompt_len + plan.gen_len <= n_ctx:
                yield batch, prompt_len


def run(model_dir: Path, plan: BenchPlan, say: Callable[[str], None] = lambda m: None,
        warn: Callable[[str], None] = lambda m: None, open_torch: TorchOpener | None = None) -> dict[str, Any]:
    """Measure every configuration of `plan`; a configuration that cannot run is a row with its error.
    `say` gets progress, `warn` what the user must see (a graph written with `export --no-gate`);
    `open_torch` opens the torch baseline, which `plan.torch_baseline` needs."""
    from gptport.runtime import burst
    from gptport.runtime.loader import open_graph

    if plan.torch_baseline and open_torch is None:
        raise UsageError("bench.run: plan.torch_baseline needs open_torch "
                         "(gptport.training.torch_engine.open_torch)")

    bandwidth = measure_bandwidth(plan.threads, plan.probe_mib)
    say(f"memory read bandwidth: {bandwidth / 1e9:.1f} GB/s")

    def probe() -> float:  # a shared host's bandwidth drifts: each CPU row probes it around its runs
        return measure_bandwidth(plan.threads, plan.probe_mib)

    rows: list[Row] = []
    config: dict[str, Any] = {}
    for provider, precision, cache, kv in itertools.product(plan.providers, plan.precisions, plan.kv_caches,
                                                            plan.kv_dtypes):
        peak_rss_reset()
        t0 = time.perf_counter()
        try:
            model = open_graph(model_dir, GraphChoice.parse(precision, cache, kv), RunOptions(provider, plan.threads),
                               say=warn)
        except GptportError as e:
            label = cache if kv == "float32" else f"{cache} {kv}"
            rows.append(Row("onnx", provider, precision, 0, 0, plan.gen_len, kv_cache=label, error=str(e)))
            say(f"onnx {provider} {precision} {label}: {e}")
            continue
        kv_label = model.cache if kv == "float32" else contract.CACHE_STATIC_KV8
        if plan.bursts:
            why = burst.refusal(model, provider)
            if why:
                rows.append(Row("onnx", provider, precision, 0, 0, plan.gen_len, kv_cache=kv_label,
                                bursts=plan.bursts, error=why))
                say(f"onnx {provider} {precision} {kv_label}: {why}")
                continue
            cast(Bursting, model).bursts = plan.bursts  # Capability.BURST (burst.refusal)
        session_s = time.perf_counter() - t0
        assert model.path is not None  # open_graph's models know their file
        wbytes = weight_bytes_per_token(model.path)
        for batch, prompt_len in _shapes(plan, model.n_ctx):
            say(f"onnx {provider} {precision} {kv_label} batch {batch} prompt {prompt_len}")
            row = Row("onnx", provider, precision, batch, prompt_len, plan.gen_len, kv_cache=kv_label,
                      bursts=plan.bursts, session_s=session_s, weight_bytes_per_token=wbytes,
                      providers_ran=model.session.get_providers())
            _fill(row, model, model.config.vocab_size, plan, probe if provider == "cpu" else None)
            if row.bandwidth_gb_s:
                row.bandwidth_fraction = wbytes * row.decode_tok_s / row.batch / (row.bandwidth_gb_s * 1e9)
            rows.append(row)
            if plan.draft is not None and batch == 1 and model.cache == "static":
                say(f"onnx {provider} {precision} static prompt {prompt_len}, drafts from {plan.draft.name}")
                rows.append(_draft_row(row, model, plan))
        del model
    if plan.torch_baseline:
        rows.extend(_torch_rows(model_dir, plan, say, open_torch))
    _speedups(rows)
    return {"machine": machine(bandwidth, plan.threads), "versions": versions(),
            "model": config, "rows": [asdict(r) for r in rows]}


def _torch_rows(model_dir: Path, plan: BenchPlan, say: Callable[[str], None], open_torch: TorchOpener) -> list[Row]:
    """The same loop over the torch model from model.safetensors (needs the train extra)."""
    rows = []
    for provider in sorted({"cuda" if p in ("cuda", "tensorrt") else "cpu" for p in plan.providers}):
        peak_rss_reset()
        t0 = time.perf_counter()
        try:
            opened = open_torch(model_dir, provider, plan.threads)
        except GptportError as e:
            rows.append(Row("torch", provider, "fp32", 0, 0, plan.gen_len, error=str(e)))
            continue
        session_s = time.perf_counter() - t0
        for batch, prompt_len in _shapes(plan, opened.engine.n_ctx):
            say(f"torch {provider} batch {batch} prompt {prompt_len}")
            row = Row("torch", provider, "fp32", batch, prompt_len, plan.gen_len, session_s=session_s,
                      providers_ran=[f"torch-{opened.provider}"])
            _fill(row, opened.engine, opened.tok.vocab_size, plan)
            rows.append(row)
    return rows


def _speedups(rows: list[Row]) -> None:
    """Each ONNX row's decode and prefill speed over the torch row of the same device, batch and prompt."""
    base = {(r.provider, r.batch, r.prompt_len): r for r in rows if r.engine == "torch" and r.decode_tok_s}
    for r in rows:
        ref = base.get(("cuda" if r.provider in ("cuda", "tensorrt") else "cpu", r.batch, r.prompt_len))
        if r.engine == "onnx" and ref and r.decode_tok_s and ref.decode_tok_s and ref.prefill_tok_s:
            r.speedup_vs_torch = r.decode_tok_s / ref.decode_tok_s
            r.prefill_speedup_vs_torch = (r.prefill_tok_s or 0.0) / ref.prefill_tok_s


def machine(bandwidth: float, threads: int) -> dict[str, Any]:
    """The CPU (machine.describe: name, cores, vector extensions), the threads and the probed bandwidth."""
    host = describe()
    return {**host, "cpus": host["cores"], "threads": threads or None,
            "memory_read_gb_s": round(bandwidth / 1e9, 2), "python": platform.python_version()}


def versions() -> dict[str, str]:
    """Versions of what ran, read from package metadata (torch is not imported for this)."""
    from importlib import metadata

    out = {"gptport": __version__, "numpy": np.__version__}
    for dist in ("onnxruntime-gpu", "onnxruntime", "onnxruntime-openvino", "torch", "tokenizers"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out
