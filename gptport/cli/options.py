"""The options that pick a graph and say how to run it, declared once: each alias below is one option as
the commands listed beside it take it (llama.cpp's common/arg.cpp registers an option once and tags its
tools; an option whose help differs by command has one alias per wording). `graph_choice` and
`run_options` parse their words once into gptport.runtime.choice's types, which the commands pass whole."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from gptport.runtime.choice import GraphChoice, RunOptions

DRAFT_THREADS_HELP = ("The draft model's CPU threads (0: onnxruntime's default; default 1: a small draft's steps "
                      "are too short to share between threads).")

# which graph: generate, serve
Precision = Annotated[str, typer.Option(help="fp32, int8, int4 or fp16 (the exported variant).")]
# eval: one figure per precision
Precisions = Annotated[str, typer.Option(help="fp32, int8, int4 or fp16; comma-separated for several "
                                              "(e.g. fp32,int8: one figure each).")]
# distill-corpus
DistillPrecision = Annotated[str, typer.Option(help="The model's exported variant that generates.")]
# export: the variants to write
ExportPrecisions = Annotated[str, typer.Option(help="Comma-separated: fp32 (always), int8, int4, fp16.")]
# export-web: the graph to ship
WebPrecision = Annotated[str, typer.Option(
    help="The graph to ship: fp32, int8 or int4 (a variant that passed export's accuracy gate); auto: fp32 "
    "up to 100 MiB, else the gated int8 variant, else the gated int4.")]
# bench: every combination is a row
BenchPrecisions = Annotated[str, typer.Option(help="Comma-separated variants: fp32, int8, int4, fp16.")]
# generate, eval
GraphFormat = Annotated[str, typer.Option("--graph-format", help="onnx, or ort: the .ort file of "
                                          "`export --ort-format` (contract graph).")]
# generate
KvCache = Annotated[str, typer.Option(help="Graph: static (KV cache preallocated and appended in place, "
                                      "CPU only), concat (model.onnx's contract) or auto (static where "
                                      "exported and on the CPU).")]
# serve
ServeKvCache = Annotated[str, typer.Option(help="static (CPU), concat (model.onnx's contract, any provider) or "
                                           "auto (static where exported and on the CPU).")]
# bench
BenchKvCaches = Annotated[str, typer.Option(help="Comma-separated graphs: auto (what generate uses), static "
                                            "(preallocated cache, CPU), concat (model.onnx).")]
# generate, eval, serve
KvDtype = Annotated[str, typer.Option("--kv-dtype", help="float32, or int8: the static-cache graph with an int8 KV "
                                      "cache (export --kv-dtype int8; CPU).")]
# export: also write the int8-cache twins
ExportKvDtype = Annotated[str, typer.Option("--kv-dtype", help="int8: also write each static-cache graph with an "
                                            "int8 KV cache (model.static.kv8.onnx, ...; 4x smaller), scales "
                                            "calibrated on the gate's text, gated against the float32 cache "
                                            "(top-1 ≥ 98%, bits per byte within 1%).")]
# bench
BenchKvDtypes = Annotated[str, typer.Option("--kv-dtype", help="Comma-separated cache types of the static graph: "
                                            "float32, int8 (export --kv-dtype int8).")]

# how to run it: generate, eval, serve
Provider = Annotated[str, typer.Option(help="cpu, cuda, tensorrt or openvino.")]
# bench
BenchProviders = Annotated[str, typer.Option(help="Comma-separated: cpu, cuda, tensorrt, openvino.")]
# generate, serve
Threads = Annotated[int, typer.Option(help="CPU intra-op threads (0: onnxruntime's default).")]
# eval, distill-corpus
RuntimeThreads = Annotated[int, typer.Option(help="CPU threads (0: the runtime's default).")]
# bench
BenchThreads = Annotated[int, typer.Option(help="CPU threads for onnxruntime and torch (0: their default).")]
# serve
Spin = Annotated[str, typer.Option(help="What onnxruntime's idle threads do: 'step' spin while a step runs "
                                   "and sleep between steps (the HTTP side gets the cores), 'always' spin "
                                   "between steps too, 'never' sleep at once.")]
# generate
Fallback = Annotated[bool, typer.Option("--fallback", help="If the provider does not run here, "
                                        "say so and use the next one (tensorrt → cuda → cpu).")]

# the draft model of speculative decoding: generate, serve, bench
Draft = Annotated[Path | None, typer.Option("--draft", help="Speculative decoding: this model directory (a "
                                            "small model with the same tokenizer) drafts, the model verifies "
                                            "several tokens per step. Same output as without.")]
ServeDraft = Annotated[Path | None, typer.Option("--draft", help="Speculative decoding while one request decodes "
                                                 "alone: this model directory (same tokenizer) drafts, the model "
                                                 "verifies several tokens per step. Same output as without.")]
BenchDraft = Annotated[Path | None, typer.Option("--draft", help="Also decode with this draft model (speculative "
                                                 "decoding, batch 1, static cache): acceptance, tokens per step, "
                                                 "tok/s beside plain.")]
# generate, serve
DraftTokens = Annotated[int | None, typer.Option("--draft-tokens", help="Drafts per step, fixed (default: "
                                                 "adaptive, from the acceptance rate).")]
BenchDraftTokens = Annotated[int | None, typer.Option("--draft-tokens", help="Drafts per step with --draft "
                                                     "(default: adaptive).")]
DraftPrecision = Annotated[str | None, typer.Option("--draft-precision", help="The draft model's exported "
                                                    "variant: fp32, int8, int4 or fp16 (default: --precision's). "
                                                    "It speeds drafting only; the output is the model's either "
                                                    "way.")]
ServeDraftPrecision = Annotated[str | None, typer.Option("--draft-precision", help="The draft model's exported "
                                                         "variant: fp32, int8, int4 or fp16 (default: "
                                                         "--precision's). It speeds drafting only; replies are "
                                                         "the model's either way.")]
BenchDraftPrecision = Annotated[str | None, typer.Option("--draft-precision", help="The draft's exported variant "
                                                         "(default: each row's precision).")]
# generate, serve, bench
DraftThreads = Annotated[int | None, typer.Option("--draft-threads", help=DRAFT_THREADS_HELP)]


def graph_choice(precision: str = "fp32", kv_cache: str = "auto", kv_dtype: str = "float32",
                 graph_format: str = "onnx") -> GraphChoice:
    """--precision, --kv-cache, --kv-dtype and --graph-format as one GraphChoice, each checked once."""
    from gptport.runtime.choice import GraphChoice

    return GraphChoice.parse(precision, kv_cache, kv_dtype, graph_format)


def run_options(provider: str = "cpu", threads: int = 0, spin: str = "always", fallback: bool = False) -> RunOptions:
    """--provider, --threads, --spin and --fallback as one RunOptions (--spin checked)."""
    from gptport.runtime.choice import RunOptions

    return RunOptions.parse(provider, threads, spin, fallback)
