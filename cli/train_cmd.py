"""`gptport train`: tokenize the corpus into shards and train the GPT of a model directory.

torch is imported inside the command, so that the rest of the CLI starts without it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gptport import checkpoint_paths as paths
from gptport import tokenizer as bpe
from gptport.cli.common import EncodingErrors, err, human_bytes
from gptport.errors import InputError, UsageError

if TYPE_CHECKING:
    from gptport.config import ModelConfig, TrainConfig
    from gptport.corpus import CorpusReader
    from gptport.data import Shards
    from gptport.train import EvalRecord

EXAMPLES = """Examples:

  gptport train corpus.txt --model-dir models/mymodel --preset tiny

  gptport train corpus.txt --model-dir models/mymodel --preset small --minutes 30 --set dropout=0.2

  gptport train corpus.txt --model-dir models/mymodel --steps 4000 --resume
"""


def train(
    corpus: Annotated[list[str], typer.Argument(help="Text files, directories, or '-' for stdin.",
                                                show_default=False)],
    model_dir: Annotated[Path, typer.Option("--model-dir", help="Model directory holding the tokenizer.")],
    preset: Annotated[str, typer.Option(help="tiny, small, gpt2-124m, or a .toml file.")] = "tiny",
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a setting: key=value "
                                                   "(d_model=256, model.dropout=0.1, train.lr=3e-4).")] = None,
    steps: Annotated[int | None, typer.Option(help="Optimizer steps to train, in all.")] = None,
    minutes: Annotated[float | None, typer.Option(help="Train for this wall time instead of --steps.")] = None,
    schedule_steps: Annotated[int | None, typer.Option(help="Horizon of the LR schedule (default: --steps); "
                                                       "set it to stop early and --resume later exactly.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Sequences per micro-batch.")] = None,
    grad_accum: Annotated[int | None, typer.Option(help="Micro-batches per optimizer step.")] = None,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate.")] = None,
    eval_every: Annotated[int | None, typer.Option(help="Steps between evals and checkpoints.")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda or mps.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of weights, batches and dropout.")] = None,
    val_fraction: Annotated[float | None, typer.Option(help="Share of tokens held out for validation.")] = None,
    compile_: Annotated[bool | None, typer.Option("--compile/--no-compile", help="torch.compile the loss.")] = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's choice).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run checkpointed in --model-dir.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Start over, replacing a trained model.")] = False,
    glob: Annotated[str, typer.Option(help="Which files to take from directories.")] = "*.txt",
    encoding_errors: Annotated[EncodingErrors, typer.Option(help="strict or replace.")] = EncodingErrors.strict,
) -> None:
    """Train the GPT of a model directory on a corpus, tokenized with the directory's tokenizer."""
    from gptport.corpus import CorpusReader, resolve_sources
    tok = bpe.load(model_dir)
    has_model = (model_dir / paths.CONFIG).exists()
    if has_model and not (resume or force):
        raise InputError(f"{model_dir}: already holds a trained model; pass --resume to continue it "
                         "or --force to start over")
    if resume and not (model_dir / paths.OPTIMIZER).exists():
        raise InputError(f"{model_dir}: nothing to --resume (no {paths.OPTIMIZER})")
    options = {k: v for k, v in dict(
        steps=steps, minutes=minutes, schedule_steps=schedule_steps, batch_size=batch_size,
        grad_accum=grad_accum, lr=lr, eval_every=eval_every, device=device, seed=seed,
        val_fraction=val_fraction, compile=compile_, threads=threads).items() if v is not None}
    if steps is not None and minutes is not None:
        raise UsageError("give --steps or --minutes, not both")
    if steps is not None:
        options["minutes"] = 0.0
    cfg, tcfg = _configs(model_dir, tok.vocab_size, preset, set_ or [], options, resume)
    if force and not resume:
        for name in (paths.TRAINER, paths.OPTIMIZER, paths.LOG):
            (model_dir / name).unlink(missing_ok=True)

    reader = CorpusReader(resolve_sources(corpus, glob), encoding_errors.value)
    shards = prepare_with_progress(model_dir, reader, tok, tcfg.val_fraction)
    from gptport import data

    data.check_fits(shards, cfg.n_ctx)
    budget = f"{tcfg.minutes:g} min" if tcfg.minutes > 0 else f"{tcfg.steps} steps"
    err.print(f"Model: {cfg.n_params() / 1e6:.2f}M parameters (d_model {cfg.d_model}, {cfg.n_layer} layers, "
              f"{cfg.n_head} heads, n_ctx {cfg.n_ctx}, vocab {cfg.vocab_size}); training for {budget}")
    train_with_progress(model_dir, cfg, tcfg, shards, tok, resume)


def _configs(model_dir: Path, vocab_size: int, preset: str, sets: list[str], options: dict[str, Any],
             resume: bool) -> tuple[ModelConfig, TrainConfig]:
    """New run: preset, then --set, then options. Resume: config.json's model and the resume state's
    settings, then --set train.* and options."""
    from gptport.config import ModelConfig, Preset, TrainConfig, apply_overrides, load_preset

    if not resume:
        chosen = apply_overrides(load_preset(preset), sets)
        cfg = ModelConfig(vocab_size=vocab_size, **chosen.model)
        tcfg = TrainConfig(**{**chosen.train, **options})
    else:
        changes = apply_overrides(Preset("resume"), sets)
        from gptport.checkpoint import read_card, read_resume_state

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

    from gptport import data

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
         resume: bool) -> list[EvalRecord]:
    """Train with a live progress bar; return the eval records."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from gptport.data import token_bytes
    from gptport.train import Hooks, Trainer

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

        trainer = Trainer(model_dir, cfg, tcfg, shards, tok, token_bytes(tok), resume=resume,
                          hooks=Hooks(on_step=on_step, on_eval=on_eval))
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
