"""The training loop: AdamW, warm-up then cosine decay, gradient accumulation and clipping, bf16
autocast on CUDA, optional torch.compile, evals with perplexity and bits per byte, atomic
checkpoints, exact --resume, and a clean stop on Ctrl-C. Under torchrun the same loop runs on every
rank with DistributedDataParallel (gptport/distributed.py): rank 0 alone writes and reports."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch

from gptport.config import ModelConfig, TrainConfig
from gptport.errors import ArtifactError, UsageError, first_line
from gptport.paths import LOG, OPTIMIZER
from gptport.tokenizer import BPETokenizer
from gptport.training import checkpoint
from gptport.training.distributed import Dist, check_world, wrap
from gptport.training.model import GPT
from gptport.training.shards import Shards, eval_windows, step_batches


@dataclass(frozen=True)
class EvalRecord:
    """One line of logs/train.jsonl."""

    step: int
    train_loss: float
    val_loss: float
    val_ppl: float
    val_bpb: float
    tokens_per_s: float
    lr: float
    elapsed_s: float


@dataclass
class Hooks:
    """Callbacks for progress display; the loop itself prints nothing."""

    on_step: Callable[[int, float, float], None] = lambda step, loss, tok_s: None
    on_eval: Callable[[EvalRecord], None] = lambda record: None
    on_checkpoint: Callable[[int], None] = lambda step: None
    on_notice: Callable[[str], None] = lambda message: None  # what the user should know (said once)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU is available to torch here")
    if name == "mps" and not torch.backends.mps.is_available():
        raise UsageError("--device mps: Apple's MPS backend is not available here")
    return torch.device(name)


def native_bf16(device: torch.device) -> bool:
    """Whether the device computes bf16 natively: CUDA GPUs from Ampere on, CPUs with AVX512-BF16 or AMX."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return device.type == "cpu" and torch.cpu._is_avx512_bf16_supported()


def make_autocast(mode: str, device: torch.device) -> tuple[contextlib.AbstractContextManager[Any], str]:
    """bf16 autocast where the hardware runs bf16 natively (where it doubles training speed), fp32
    elsewhere or when asked; and a notice for the user ("" for none) when bf16 was asked for on a
    device without native bf16: emulated on the CPU or CUDA, fp32 where torch has no bf16 autocast."""
    if mode == "fp32" or (mode == "auto" and not native_bf16(device)):
        return contextlib.nullcontext(), ""
    if device.type not in ("cuda", "cpu"):
        return contextlib.nullcontext(), (f"autocast bf16 asked, but torch has no bf16 autocast on {device.type} "
                                          "here: training in fp32")
    notice = "" if native_bf16(device) else (
        f"autocast bf16 asked, but this {'GPU' if device.type == 'cuda' else 'CPU'} has no native bf16: "
        "torch emulates it (slower than fp32 here; autocast=auto picks fp32)")
    return torch.autocast(device.type, dtype=torch.bfloat16), notice


def compiled_graphs() -> int:
    """How many graphs torch.compile has compiled in this process so far (Dynamo's count): 0 when every
    call ran eagerly (the compiled function never called, or Dynamo gave up and fell back)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def run_clock(kind: str) -> Callable[[], float]:
    """What --minutes and tokens/s count: the wall clock, or ("cpu") this process's CPU seconds over its torch
    threads, which is the wall time on an idle machine and is not stretched by other processes' load (for a
    budget that is the same on a shared host; run under OMP_WAIT_POLICY=PASSIVE so that threads waiting for
    a descheduled partner sleep instead of spinning, or the spinning counts)."""
    if kind == "wall":
        return time.perf_counter
    threads = torch.get_num_threads()
    return lambda: time.process_time() / threads


def lr_at(progress: float, tcfg: TrainConfig, warmup_fraction: float) -> float:
    """Linear warm-up over `warmup_fraction` of the run, then cosine decay to lr * min_lr_ratio."""
    if progress < warmup_fraction:
        return tcfg.lr * (progress / warmup_fraction)
    span = max(1e-9, 1.0 - warmup_fraction)
    t = min(1.0, (progress - warmup_fraction) / span)
    floor = tcfg.lr * tcfg.min_lr_ratio
    return floor + 0.5 * (tcfg.lr - floor) * (1.0 + math.cos(math.pi * t))


def make_optimizer(model: GPT, tcfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices and embeddings (dim >= 2) only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tcfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = device.type == "cuda"
    return torch.optim.AdamW(groups, lr=tcfg.lr, betas=(tcfg.beta1, tcfg.beta2), fused=fused)


class _StopFlag:
    """Ctrl-C sets the flag: the loop finishes its step, checkpoints and returns. A second Ctrl-C aborts.
    Under torchrun SIGTERM sets it too: torchrun forwards the signal it gets (SIGINT from a terminal's
    Ctrl-C, SIGTERM from a scheduler) to every rank, and SIGKILLs what is left after --shutdown-timeout."""

    def __init__(self, distributed: bool = False) -> None:
        self.set = False
        self.distributed = distributed

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        signums = [signal.SIGINT, signal.SIGTERM] if self.distributed else [signal.SIGINT]
        try:
            previous = [signal.signal(s, self._handle) for s in signums]
        except ValueError:  # not the main thread: leave signals alone
            yield
            return
        try:
            yield
        finally:
            for s, handler in zip(signums, previous, strict=True):
                signal.signal(s, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.set:
            raise KeyboardInterrupt
        self.set = True


@dataclass
class TrainResult:
    step: int
    records: list[EvalRecord]
    interrupted: bool
    seconds: float


class Trainer:
    """Trains the model of `model_dir` on prepared shards, checkpointing into the same directory."""

    def __init__(self, model_dir: Path, cfg: ModelConfig, tcfg: TrainConfig, shards: Shards,
                 tok: BPETokenizer, token_bytes: np.ndarray, resume: bool = False, hooks: Hooks | None = None,
                 ctx: Dist | None = None, device: torch.device | None = None,
                 allow_world_size_change: bool = False) -> None:
        """`ctx` and `device` come from distributed.init under torchrun; without them, one process."""
        tcfg.validate()
        self.dir, self.cfg, self.tcfg, self.shards, self.tok = model_dir, cfg, tcfg, shards, tok
        self.ctx = ctx or Dist()
        self.hooks = hooks if (hooks and self.ctx.main) else Hooks()
        self.device = device or pick_device(tcfg.device)
        if tcfg.threads > 0:
            torch.set_num_threads(tcfg.threads)
        torch.manual_seed(tcfg.seed)
        self.rng = np.random.default_rng(tcfg.seed)  # the data order: in the same state on every rank
        self.model = GPT(cfg).to(self.device)
        if self.ctx.rank:  # dropout: a stream of its own per rank (rank 0's is the single process's)
            torch.manual_seed(tcfg.seed + 1_000_003 * self.ctx.rank)
        self.step, self.elapsed = 0, 0.0
        self.optimizer = make_optimizer(self.model, tcfg, self.device)
        if resume:
            self._resume(allow_world_size_change)
        self.token_bytes = torch.from_numpy(token_bytes).to(self.device)
        windows = eval_windows(shards.val, cfg.n_ctx, tcfg.eval_batches * tcfg.batch_size)
        self.windows = windows[self.ctx.rank::self.ctx.world]  # this rank's share of the validation windows
        self.ddp = wrap(self.model, self.ctx) if self.ctx.enabled else None
        loss: Callable[..., torch.Tensor] = self.ddp if self.ddp is not None else self.model.loss
        self.loss_fn = torch.compile(loss) if tcfg.compile else loss
        self.autocast, notice = make_autocast(tcfg.autocast, self.device)
        if notice:
            self.hooks.on_notice(notice)

    def _resume(self, allow_world_size_change: bool) -> None:
        card = checkpoint.read_card(self.dir)
        if card.model != self.cfg:
            raise UsageError(f"{self.dir}: --resume with a different model shape than config.json holds; "
                             "drop --preset/--set model.* or train a new directory")
        state, rng = checkpoint.load_resume(self.dir, self.model, self.optimizer)
        saved_world = int(state.get("world_size", 1))
        check_world(saved_world, self.ctx.world, allow_world_size_change, str(self.dir))
        self.step, self.elapsed = int(state["step"]), float(state["elapsed_s"])
        rank = self.ctx.rank
        if saved_world != self.ctx.world:  # weights, moments and schedule kept; a new data order from here
            self.rng = np.random.default_rng([self.tcfg.seed, self.step, self.ctx.world])
            torch.manual_seed(self.tcfg.seed + 1_000_003 * rank + self.step)
            return
        suffix = f".{rank}" if rank else ""
        try:
            self.rng.bit_generator.state = state["data_rng"]
            torch.set_rng_state(rng["torch" + suffix])
        except (KeyError, TypeError, ValueError, RuntimeError) as e:  # bytes damaged on disk
            raise ArtifactError(f"{self.dir / OPTIMIZER}: its RNG state is damaged ({first_line(e)}); "
                                "cannot --resume") from e
        if "cuda" + suffix in rng and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda" + suffix], self.device)

    # --- schedule -------------------------------------------------------------------------------
    def _progress(self) -> float:
        if self.tcfg.minutes > 0:
            return self.elapsed / (self.tcfg.minutes * 60)
        return self.step / (self.tcfg.schedule_steps or self.tcfg.steps)

    def _warmup_fraction(self) -> float:
        horizon = self.tcfg.schedule_steps or self.tcfg.steps
        return min(0.5, self.tcfg.warmup_steps / horizon) if self.tcfg.minutes <= 0 else 0.02

    def _done(self) -> bool:
        if self.tcfg.minutes > 0:
            return self.elapsed >= self.tcfg.minutes * 60
        return self.step >= self.tcfg.steps

    # --- the loop -------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        stop = _StopFlag(distributed=self.ctx.enabled)
        records: list[EvalRecord] = []
        tcfg = self.tcfg
        every_ckpt = tcfg.checkpoint_every or tcfg.eval_every
        loss_sum, loss_n, tokens, t_window = 0.0, 0, 0, 0.0
        clock = run_clock(tcfg.clock)
        t_start, wall_start = clock(), time.perf_counter()
        elapsed_before = self.elapsed  # time of earlier runs of this training (--resume), as `clock` counts
        stopping = False  # the stop flag as all ranks agree on it
        with stop.installed():
            while not self._done() and not stopping:
                t0 = clock()
                lr = lr_at(self._progress(), tcfg, self._warmup_fraction())
                loss = self._train_step(lr)
                dt = clock() - t0
                self.step += 1
                elapsed = elapsed_before + clock() - t_start  # evals and checkpoints count
                # every rank must take the same decisions (stop, eval, the LR of --minutes): the slowest
                # rank's clock and any rank's signal count, one small all-reduce per step
                self.elapsed, flag = self.ctx.all_reduce([elapsed, float(stop.set)], op="max")
                stopping = flag > 0
                t_window += dt
                loss_sum, loss_n = loss_sum + loss, loss_n + 1
                tokens += tcfg.batch_size * tcfg.grad_accum * self.ctx.world * self.cfg.n_ctx
                self.hooks.on_step(self.step, loss, tokens / max(t_window, 1e-9))
                if self.step % tcfg.eval_every == 0 or self._done():
                    record = self._evaluate(loss_sum, loss_n, tokens / max(t_window, 1e-9), lr)
                    records.append(record)
                    self.hooks.on_eval(record)
                    loss_sum, loss_n, tokens, t_window = 0.0, 0, 0, 0.0
                if self.step % every_ckpt == 0 or self._done():
                    self.save()
            if stopping:
                self.save()
        return TrainResult(self.step, records, stopping, time.perf_counter() - wall_start)

    def _train_step(self, lr: float) -> float:
        tcfg = self.tcfg
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        total = 0.0
        rank, accum = self.ctx.rank, tcfg.grad_accum
        batches = step_batches(self.shards.train, self.cfg.n_ctx, tcfg.batch_size, self.rng,
                               slots=self.ctx.world * accum, mine=range(rank * accum, (rank + 1) * accum))
        for i, (x, y) in enumerate(batches):
            xt = torch.from_numpy(x).to(self.device, non_blocking=True)  # (B, T)
            yt = torch.from_numpy(y).to(self.device, non_blocking=True)  # (B, T)
            # DDP averages gradients over the ranks once, in the last micro-batch's backward; with the
            # division by accum here the step's gradient is the mean over all world × accum micro-batches
            quiet = self.ddp is not None and i < accum - 1
            with self.ddp.no_sync() if quiet else contextlib.nullcontext():  # type: ignore[union-attr]
                with self.autocast:
                    loss = self.loss_fn(xt, yt)
                (loss / accum).backward()
            total += loss.item()
        if tcfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), tcfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total / tcfg.grad_accum

    @torch.no_grad()
    def _evaluate(self, loss_sum: float, loss_n: int, tokens_per_s: float, lr: float) -> EvalRecord:
        """Validation loss (nats/token), perplexity and bits per byte over fixed windows; each rank takes
        its share of the windows and the sums are all-reduced, so the figures are the single process's.
        The training loss is the mean over every rank's steps since the last eval."""
        self.model.eval()
        n_ctx, bs = self.cfg.n_ctx, self.tcfg.batch_size
        nats, n_tok, n_bytes = 0.0, 0, 0
        for i in range(0, len(self.windows), bs):
            starts = self.windows[i:i + bs]
            idx = starts[:, None] + np.arange(n_ctx + 1)[None, :]  # (B, T+1)
            window = torch.from_numpy(self.shards.val[idx].astype(np.int64)).to(self.device)  # (B, T+1)
            x, y = window[:, :-1], window[:, 1:]
            with self.autocast:
                losses = self.model.loss(x, y, reduction="none")  # (B*T,)
            nats += losses.sum().item()
            n_tok += losses.numel()
            n_bytes += int(self.token_bytes[y.flatten()].sum().item())
        nats, n_tok, n_bytes, loss_sum, loss_n = self.ctx.all_reduce([nats, n_tok, n_bytes, loss_sum, loss_n])
        train_loss = loss_sum / loss_n
        val_loss = nats / n_tok
        record = EvalRecord(step=self.step, train_loss=train_loss, val_loss=val_loss,
                            val_ppl=math.exp(min(val_loss, 50.0)),
                            val_bpb=nats / math.log(2) / max(n_bytes, 1), tokens_per_s=tokens_per_s,
                            lr=lr, elapsed_s=self.elapsed)
        if not self.ctx.main:
            return record
        log = self.dir / LOG
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(record)) + "\n")
        return record

    def save(self) -> None:
        """Checkpoint: the resume state (one atomic file), then the published weights and config.json.
        Every rank calls it (its RNG state is gathered); rank 0 writes."""
        rng: dict[str, torch.Tensor] = {}
        for r, t in enumerate(self.ctx.all_gather(torch.get_rng_state())):
            rng["torch" + (f".{r}" if r else "")] = t
        if self.device.type == "cuda":
            for r, t in enumerate(self.ctx.all_gather(torch.cuda.get_rng_state(self.device))):
                rng["cuda" + (f".{r}" if r else "")] = t
        graphs = self.ctx.all_gather(torch.tensor([compiled_graphs()])) if self.tcfg.compile else []  # per rank
        if not self.ctx.main:
            return
        state: dict[str, Any] = {"step": self.step, "elapsed_s": self.elapsed,
                                 "data_rng": self.rng.bit_generator.state, "train": asdict(self.tcfg)}
        if self.ctx.enabled:
            state["world_size"] = self.ctx.world
        if self.tcfg.compile:
            state["compiled_graphs"] = [int(t) for t in graphs]  # what --compile did, not only that it was asked
        checkpoint.save_resume(self.dir, state, self.model, self.optimizer, rng)  # one file: the resume point
        checkpoint.save_model(self.dir, self.model, self.cfg, self.tok, self.step)  # config.json last
        self.hooks.on_checkpoint(self.step)

