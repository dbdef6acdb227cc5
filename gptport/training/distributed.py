"""Training on several processes, as torchrun starts them: the rank, world size and backend that
torchrun's environment gives, and the few collectives the trainer needs (barrier, all-reduce,
all-gather of RNG states). Without torchrun's environment everything here is a no-op over one rank.

The ranks are torchrun's and the rendezvous is torchrun's; gptport has no launcher of its own
(`gptport train --nproc-per-node N` only execs torchrun for the one-machine case)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gptport.config import TrainConfig
from gptport.errors import UsageError

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# Ranks wait this long in a collective: rank 0 tokenizes the corpus while the others wait at a
# barrier, so it must cover tokenizing a large corpus. A dead rank is noticed far sooner (torchrun).
TIMEOUT = timedelta(minutes=60)


def under_torchrun() -> bool:
    """True when torchrun (torch.distributed.run) started this process."""
    return all(k in os.environ for k in TORCHRUN_ENV)


def env_world() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment; (0, 1) without it."""
    if not under_torchrun():
        return 0, 1
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


@dataclass(frozen=True)
class Dist:
    """This process's place among the ranks. `backend` is "" for a single process."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    backend: str = ""
    device: torch.device = torch.device("cpu")  # where collective tensors live (cuda:local_rank for NCCL)

    @property
    def enabled(self) -> bool:
        return self.world > 1 or bool(self.backend)

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes files and prints."""
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def all_reduce(self, values: Sequence[float], op: str = "sum") -> list[float]:
        """Sum or max of `values` over all ranks, in float64."""
        if not self.enabled:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)  # (N,)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return t.cpu().tolist()

    def broadcast(self, values: Sequence[float]) -> list[float]:
        """Rank 0's `values` on every rank."""
        if not self.enabled:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)  # (N,)
        dist.broadcast(t, src=0)
        return t.cpu().tolist()

    def all_gather(self, t: Tensor) -> list[Tensor]:
        """Every rank's copy of a tensor of the same shape, on the CPU, in rank order."""
        if not self.enabled:
            return [t.cpu()]
        local = t.to(self.device)
        out = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(out, local)
        return [o.cpu() for o in out]


def init(device_name: str) -> tuple[Dist, torch.device]:
    """Join torchrun's process group: NCCL on CUDA (one GPU per local rank), Gloo on the CPU.
    Returns the rank's place and the device it trains on."""
    rank, world = env_world()
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available())
    if device_name == "mps":
        raise UsageError("--device mps: DistributedDataParallel does not run on Apple's MPS; use cpu")
    if cuda:
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA GPU is available to torch here")
        if local_rank >= torch.cuda.device_count():
            raise UsageError(f"rank {rank}: local rank {local_rank} has no GPU of its own (this machine has "
                             f"{torch.cuda.device_count()}); lower --nproc-per-node")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, timeout=TIMEOUT)
    return Dist(rank, world, local_rank, backend, device), device


def shutdown(ctx: Dist) -> None:
    """Leave the process group after a run that ended well. The ranks meet at a barrier first: a rank
    that tore its Gloo connections down while its peer still used them was aborted by Gloo
    ("terminate called without an active exception")."""
    if ctx.enabled and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def leave(ctx: Dist) -> None:
    """A rank's end after a run that ended well (every file written): `shutdown`, then the process ends
    without the interpreter's finalization, where Gloo's worker threads could still hold tensors whose
    destruction aborted a finished rank now and then (SIGABRT, "terminate called without an active
    exception", seen in tests under load; pytorch/pytorch#179291 describes the mechanism)."""
    shutdown(ctx)
    if ctx.enabled:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


class LossModule(nn.Module):
    """The model's training loss as a module's forward, so that DistributedDataParallel (which
    hooks forward) can wrap it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor, y: Tensor) -> Tensor:  # (B, T), (B, T) -> ()
        return self.model.loss(x, y)


def wrap(model: nn.Module, ctx: Dist) -> nn.Module:
    """The loss module under DistributedDataParallel: gradients averaged over the ranks in backward."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DDP(LossModule(model), device_ids=ids)


def check_world(saved: int, world: int, allow_change: bool, where: str) -> None:
    """--resume on another world size is refused unless asked for (the data order depends on it)."""
    if saved != world and not allow_change:
        raise UsageError(f"{where}: --resume on {world} rank(s), but the checkpoint was trained on {saved}; "
                         f"run on {saved} rank(s), or pass --allow-world-size-change (keeps the weights and "
                         "optimizer, restarts the data order)")


def resolve_accum(tcfg: TrainConfig, world: int) -> TrainConfig:
    """grad_accum for --global-batch: sequences per optimizer step over all ranks, which batch_size ×
    world size must divide."""
    if tcfg.global_batch <= 0:
        return tcfg
    per_step = tcfg.batch_size * world
    if tcfg.global_batch % per_step:
        raise UsageError(f"--global-batch {tcfg.global_batch} is not a multiple of --batch-size {tcfg.batch_size} "
                         f"× world size {world} = {per_step}; choose a global batch that these divide")
    return replace(tcfg, grad_accum=tcfg.global_batch // per_step)


def launch(nproc: int, argv: list[str]) -> None:
    """`gptport train --nproc-per-node N`: torchrun's own launcher (torch.distributed.run), run in this
    process, starts N ranks of `gptport train` without the option. A rank's failure becomes one line
    naming the rank that failed first (its message is above it), with that rank's exit code."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from gptport.errors import GptportError

    try:
        run(parse_args(torchrun_argv(nproc, argv)[3:]))
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        how = f"killed by {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
        error = GptportError(f"rank {rank} of {nproc} failed first ({how}); torchrun stopped the others")
        error.exit_code = failure.exitcode if failure.exitcode > 0 else 1
        raise error from e
    except SignalException as e:  # the ranks got the signal too: each stopped after rank 0's checkpoint
        error = GptportError(f"interrupted ({e.sigval.name}): torchrun stopped the ranks; continue with --resume")
        error.exit_code = 128 + int(e.sigval)
        raise error from e


def torchrun_argv(nproc: int, argv: list[str]) -> list[str]:
    """The torchrun command line that runs this `gptport train` on `nproc` ranks of this machine,
    with a rendezvous on 127.0.0.1 at a port the OS picks."""
    if nproc < 1:
        raise UsageError(f"--nproc-per-node must be at least 1, not {nproc}")
    rest: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc-per-node":
            skip = True
        elif not arg.startswith("--nproc-per-node="):
            rest.append(arg)
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "-m", "gptport", *rest]
