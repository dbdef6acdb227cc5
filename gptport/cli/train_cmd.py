"""`gptport train`: tokenize the corpus into shards and train the GPT of a model directory.

torch is imported inside the command, so that the rest of the CLI starts without it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gptport import paths, provenance
from gptport import tokenizer as bpe
from gptport.cli.common import EncodingErrors, err, human_bytes
from gptport.errors import GptportError, InputError, UsageError

if TYPE_CHECKING:
    import torch

    from gptport.config import ModelConfig, TrainConfig
    from gptport.corpus import CorpusReader
    from gptport.training.distributed import Dist
    from gptport.training.shards import Shards
    from gptport.training.train import EvalRecord

EXAMPLES = """Examples:

  gptport train corpus.txt --model-dir models/mymodel --preset tiny

  gptport train corpus.txt --model-dir models/mymodel --preset small --minutes 30 --set dropout=0.2

  gptport train corpus.txt --model-dir models/mymodel --steps 4000 --resume

  gptport train corpus.txt --model-dir models/mymodel --nproc-per-node 4   (torchrun, 4 ranks)

  gptport train corpus.txt --model-dir models/draft --preset tiny --tokenizer-from models/mymodel

  torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500
      -m gptport train corpus.txt --model-dir /shared/models/mymodel --preset small
"""


def train(
    corpus: Annotated[list[str], typer.Argument(help="Text files, directories, or '-' for stdin.",
                                                show_default=False)],
    model_dir: Annotated[Path, typer.Option("--model-dir", help="Model directory holding the tokenizer.")],
    tokenizer_from: Annotated[Path | None, typer.Option(
        "--tokenizer-from", help="Copy the tokenizer of this model directory into --model-dir first (a draft "
        "model for `generate --draft` shares its target's tokenizer).")] = None,
    preset: Annotated[str, typer.Option(help="tiny, small, gpt2-124m, llama-tiny, or a .toml file.")] = "tiny",
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a setting: key=value "
                                                   "(d_model=256, model.dropout=0.1, train.lr=3e-4).")] = None,
    steps: Annotated[int | None, typer.Option(help="Optimizer steps to train, in all.")] = None,
    minutes: Annotated[float | None, typer.Option(help="Train for this wall time instead of --steps (--set "
                                                  "clock=cpu: CPU time over threads, as on an idle machine)."
                                                  )] = None,
    schedule_steps: Annotated[int | None, typer.Option(help="Horizon of the LR schedule (default: --steps); "
                                                       "set it to stop early and --resume later exactly.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Sequences per micro-batch (on each rank).")] = None,
    grad_accum: Annotated[int | None, typer.Option(help="Micro-batches per optimizer step (on each rank).")] = None,
    global_batch: Annotated[int | None, typer.Option(help="Sequences per optimizer step over all ranks "
                                                     "(= batch size × grad accum × world size); sets "
                                                     "--grad-accum.")] = None,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate.")] = None,
    eval_every: Annotated[int | None, typer.Option(help="Steps between evals and checkpoints.")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda or mps.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of weights, batches and dropout.")] = None,
    val_fraction: Annotated[float | None, typer.Option(help="Share of tokens held out for validation.")] = None,
    compile_: Annotated[bool | None, typer.Option("--compile/--no-compile", help="torch.compile the loss.")] = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's choice).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run checkpointed in --model-dir.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Start over, replacing a trained model.")] = False,
    nproc_per_node: Annotated[int | None, typer.Option(help="Run on this many ranks of this machine: starts "
                                                       "torchrun (DistributedDataParallel).")] = None,
    allow_world_size_change: Annotated[bool, typer.Option(
        "--allow-world-size-change", help="--resume on another number of ranks: keep the weights and "
        "optimizer, restart the data order.")] = False,
    glob: Annotated[str, typer.Option(help="Which files to take from directories.")] = "*.txt",
    encoding_errors: Annotated[EncodingErrors, typer.Option(help="strict or replace.")] = EncodingErrors.strict,
) -> None:
    """Train the GPT of a model directory on a corpus, tokenized with the directory's tokenizer.
    Under torchrun, every rank runs this; rank 0 tokenizes, writes and reports."""
    from gptport.training import distributed

    if tokenizer_from is not None:
        copy_tokenizer(tokenizer_from, model_dir)
    if nproc_per_node is not None:
        if distributed.under_torchrun():
            raise UsageError("--nproc-per-node: this process already runs under torchrun; give it to torchrun")
        distributed.launch(nproc_per_node, sys.argv[1:])  # the ranks are torchrun's; they did the work
        return
    if grad_accum is not None and global_batch is not None:
        raise UsageError("give --grad-accum or --global-batch, not both")
    if grad_accum is not None:
        global_batch = 0  # --grad-accum replaces a --global-batch the resumed run had
    options = {k: v for k, v in dict(
        steps=steps, minutes=minutes, schedule_steps=schedule_steps, batch_size=batch_size,
        grad_accum=grad_accum, global_batch=global_batch, lr=lr, eval_every=eval_every, device=device, seed=seed,
        val_fraction=val_fraction, compile=compile_, threads=threads).items() if v is not None}
    if steps is not None and minutes is not None:
        raise UsageError("give --steps or --minutes, not both")
    if steps is not None:
        options["minutes"] = 0.0
    rank, world = distributed.env_world()
    try:
        ctx = _train(corpus, model_dir, preset, set_ or [], options, resume, force, glob, encoding_errors,
                     allow_world_size_change)
    except GptportError as e:
        if distributed.under_torchrun():
            raise type(e)(f"rank {rank} of {world}: {e}") from e
        raise
    except RuntimeError as e:  # a collective failed (Gloo and NCCL raise RuntimeError): another rank died
        text = str(e).strip()
        if not (distributed.under_torchrun() and any(k in text.lower() for k in ("gloo", "nccl", "peer"))):
            raise
        raise GptportError(f"rank {rank} of {world}: a collective failed, another rank has gone "
                           f"({text.splitlines()[0]})") from e
    distributed.leave(ctx)  # a run that failed leaves its process group to the exit (and torchrun)


def copy_tokenizer(source: Path, model_dir: Path) -> None:
    """--tokenizer-from: the tokenizer of `source` into model_dir, unless model_dir holds it already; a
    different tokenizer there is refused. Every rank may run this: the files are renamed into place."""
    tok = bpe.load(source)
    if bpe.has_tokenizer(model_dir):
        there = bpe.load(model_dir)
        if there.sha256 != tok.sha256:
            raise InputError(f"--tokenizer-from {source}: {model_dir} already holds another tokenizer (sha256 "
                             f"{there.sha256[:12]}… there, {tok.sha256[:12]}… in {source})")
        return
    bpe.save(tok, model_dir, force=True)


def _train(corpus: list[str], model_dir: Path, preset: str, sets: list[str], options: dict[str, Any], resume: bool,
           force: bool, glob: str, encoding_errors: EncodingErrors, allow_world_size_change: bool) -> Dist:
    """The command's work on one rank (or the single process); returns the rank's place."""
    from gptport.corpus import CorpusReader, resolve_sources
    from gptport.training import distributed

    rank, world = distributed.env_world()
    tok = bpe.load(model_dir)
    has_model = (model_dir / paths.CONFIG).exists()
    if has_model and not (resume or force):
        raise InputError(f"{model_dir}: already holds a trained model; pass --resume to continue it "
                         "or --force to start over")
    if resume and not (model_dir / paths.OPTIMIZER).exists():
        raise InputError(f"{model_dir}: nothing to --resume (no {paths.OPTIMIZER})")
    cfg, tcfg = _configs(model_dir, tok.vocab_size, preset, sets, options, resume)
    tcfg = distributed.resolve_accum(tcfg, world)
    if resume:
        from gptport.training.checkpoint import read_resume_state

        saved = int(read_resume_state(model_dir).get("world_size", 1))
        distributed.check_world(saved, world, allow_world_size_change, str(model_dir))
        provenance.check_weights(model_dir)  # resumed from optimizer.safetensors, yet damage is said at once
    ctx, device = distributed.init(tcfg.device) if distributed.under_torchrun() else (distributed.Dist(), None)
    from gptport.training import shards as data

    if ctx.main:
        if force and not resume:
            for name in (paths.TRAINER, paths.OPTIMIZER, paths.LOG):
                (model_dir / name).unlink(missing_ok=True)
        reader = CorpusReader(resolve_sources(corpus, glob), encoding_errors.value)
        shards = prepare_with_progress(model_dir, reader, tok, tcfg.val_fraction)
        ctx.barrier()  # the shards are in place
    else:
        ctx.barrier()
        shards = data.load_prepared(model_dir)
    theirs = ctx.broadcast([float(shards.meta["tokens"])])[0]  # type: ignore[arg-type]
    if int(theirs) != int(shards.meta["tokens"]):  # type: ignore[arg-type]
        raise InputError(f"{model_dir / data.DATA_DIR}: holds {shards.meta['tokens']} tokens here but rank 0 "
                         f"prepared {int(theirs)}; every rank must see rank 0's model directory")
    data.check_fits(shards, cfg.n_ctx)
    budget = f"{tcfg.minutes:g} min" if tcfg.minutes > 0 else f"{tcfg.steps} steps"
    if ctx.main:
        family = "".join(f", {c}" for c in cfg.llama_choices()) + ("" if cfg.tie_embeddings else ", untied head")
        err.print(f"Model: {cfg.n_params() / 1e6:.2f}M parameters (d_model {cfg.d_model}, {cfg.n_layer} layers, "
                  f"{cfg.n_head} heads, n_ctx {cfg.n_ctx}, vocab {cfg.vocab_size}{family}); training for {budget}")
    if ctx.main and ctx.enabled:
        per_node = os.environ.get("LOCAL_WORLD_SIZE", "?")
        err.print(f"Distributed: {ctx.world} rank(s) ({per_node} on this machine), backend {ctx.backend} on "
                  f"{device}; global batch {tcfg.batch_size} × {tcfg.grad_accum} × {ctx.world} = "
                  f"{tcfg.batch_size * tcfg.grad_accum * ctx.world} sequences per step")
    train_with_progress(model_dir, cfg, tcfg, shards, tok, resume, ctx=ctx, device=device,
                        allow_world_size_change=allow_world_size_change)
    return ctx


def _configs(model_dir: Path, vocab_size: int, preset: str, sets: list[str], options: dict[str, Any],
             resume: bool) -> tuple[ModelConfig, TrainConfig]:
    """New run: preset, then --set, then options. Resume: config.json's model and the resume state's
    settings, then --set train.* and options."""
    from gptport.config import ModelConfig, TrainConfig
    from gptport.preset import Preset, apply_overrides, load_preset, refuse_inert

    if not resume:
        chosen = apply_overrides(load_preset(preset), sets)
        cfg = ModelConfig(vocab_size=vocab_size, **chosen.model)
        refuse_inert(cfg, sets)
        tcfg = TrainConfig(**{**chosen.train, **options})
    else:
        changes = apply_overrides(Preset("resume"), sets)
        from gptport.training.checkpoint import read_card, read_resume_state

        cfg = read_card(model_dir).model
        differ = [k for k, v in changes.model.items() if getattr(cfg, k) != v]
        if differ:
            raise UsageError(f"--resume keeps the model's shape; --set {', '.join(differ)} differs from "
                             f"{model_dir / paths.CONFIG}")
        saved = read_resume_state(model_dir).get("train", {})
        tcfg = TrainConfig(**{**saved, **changes.train, **options})
    tcfg.validate()
    return cfg, tcfg


def prepare_with_progress(model_dir: Path, reader: CorpusReader, tok: bpe.BPETokenizer, val_fraction: float) -> Shards:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from gptport.training import shards as data

    with Progress(TextColumn("tokenizing"), BarColumn(), TextColumn("{task.fields[done]}"),
                  TimeRemainingColumn(), console=err, transient=True) as bar:
        task = bar.add_task("tok", total=reader.known_bytes, done="")
        shards = data.prepare(model_dir, reader, tok, val_fraction,
                              on_progress=lambda n: bar.update(task, completed=n, done=human_bytes(n)))
    m = shards.meta
    how = "reused cached" if shards.reused else "wrote"
    err.print(f"Data: {how} shards of {m['tokens']:,} tokens ({m['train_tokens']:,} train, "
              f"{m['val_tokens']:,} val) from {human_bytes(int(m['bytes']))} in {m['documents']} document(s)")
    if m.get("replaced_bytes"):
        err.print(f"[yellow]replaced[/] {m['replaced_bytes']} byte(s) that were not UTF-8 by U+FFFD")
    return shards


def train_with_progress(model_dir: Path, cfg: ModelConfig, tcfg: TrainConfig, shards: Shards, tok: bpe.BPETokenizer,
         resume: bool, ctx: Dist | None = None, device: torch.device | None = None,
         allow_world_size_change: bool = False) -> list[EvalRecord]:
    """Train with a live progress bar (rank 0; the other ranks train silently); return the eval records."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from gptport.training.train import Hooks, Trainer

    if ctx is not None and not ctx.main:
        Trainer(model_dir, cfg, tcfg, shards, tok, bpe.token_bytes(tok), resume=resume, ctx=ctx, device=device,
                allow_world_size_change=allow_world_size_change).run()
        return []

    timed = tcfg.minutes > 0
    columns = [TextColumn("[bold]train"), BarColumn(), TextColumn("{task.fields[where]}"),
               TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tok_s]} tok/s"),
               TextColumn("{task.fields[val]}"), TimeRemainingColumn()]
    with Progress(*columns, console=err) as bar:
        task = bar.add_task("train", total=tcfg.minutes * 60 if timed else tcfg.steps,
                            loss="-", tok_s="-", val="", where="")
        trainer: Trainer | None = None

        def on_step(step: int, loss: float, tok_s: float) -> None:
            done = trainer.elapsed if (timed and trainer) else step
            where = f"step {step}" if timed else f"{step}/{tcfg.steps}"
            bar.update(task, completed=done, loss=f"{loss:.3f}", tok_s=f"{tok_s:,.0f}", where=where)

        def on_eval(r: EvalRecord) -> None:
            bar.update(task, val=f"val {r.val_loss:.3f} bpb {r.val_bpb:.3f}")
            bar.console.print(f"step {r.step:>6}  train {r.train_loss:.4f}  val {r.val_loss:.4f}  "
                              f"ppl {r.val_ppl:8.2f}  bpb {r.val_bpb:.4f}  {r.tokens_per_s:,.0f} tok/s")

        trainer = Trainer(model_dir, cfg, tcfg, shards, tok, bpe.token_bytes(tok), resume=resume,
                          hooks=Hooks(on_step=on_step, on_eval=on_eval,
                                      on_notice=lambda m: bar.console.print(f"[yellow]warning:[/] {m}")),
                          ctx=ctx, device=device,
                          allow_world_size_change=allow_world_size_change)
        result = trainer.run()
    if result.interrupted:
        err.print(f"[yellow]interrupted[/]: checkpoint saved at step {result.step}; "
                  "continue with the same command and --resume")
    elif not result.records:
        raise UsageError(f"no step ran: the run is already at step {result.step}; raise --steps to train more")
    last = result.records[-1] if result.records else None
    summary = f"val loss {last.val_loss:.4f}, ppl {last.val_ppl:.2f}, bpb {last.val_bpb:.4f}; " if last else ""
    err.print(f"[green]done[/]: step {result.step} in {result.seconds:.0f} s; {summary}"
              f"wrote {model_dir / paths.WEIGHTS}")
    return result.records
