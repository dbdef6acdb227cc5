"""Parity that scales: a built graph checked against the torch model run one layer at a time (layer_reference.py),
so the check holds one layer of torch weights and its float64 twin, never the model, and the graph is run as a
chain of pieces cut from its file (chunked.py), never more than CHUNK_BYTES of its weights at once.

- check_contract: on a few lengths, left padding included, each layer's output, keys and values and the logits
  within the relative bounds of tolerance.py (record 0031).
- check_static: the static-cache graph's logits against the same reference.
- greedy (Greedy, run by either in the same opening of the pieces): the reference's greedy continuation of a
  prompt, token by token; the graph prefilled with the prompt and stepped through those tokens on its own cache
  (past in, present out) must choose each of them, or one the reference scores within its rounding of it.
The reference runs before the graph's pieces open: the peak is the larger of the two, not both."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gptport import contract
from gptport.config import ModelConfig
from gptport.errors import ValidationError
from gptport.export import chunked, layer_reference
from gptport.export.tolerance import Tolerance, compare
from gptport.export.validate import ParityRow

CHECK_SPAN = 32  # tokens of the unpadded case (fewer where n_ctx is smaller)
GREEDY_STEPS = 8  # tokens of the greedy check: each a pass of the reference over the whole model


@dataclass
class Case:
    """One input of the check and the reference's logits for it (kept for the static-cache graph's check)."""

    name: str
    ids: np.ndarray  # (B, T) int64
    mask: np.ndarray  # (B, T) int64, left padding as 0
    positions: np.ndarray  # (B, T) int64
    logits: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # (B, T, V) the reference's
    exact: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))  # (B, T, V) its float64 twin's


def cases(cfg: ModelConfig, seed: int = 0) -> list[Case]:
    """An unpadded row of min(n_ctx, CHECK_SPAN) tokens, and two rows of 9 with the second left-padded by 4."""
    rng = np.random.default_rng(seed)
    span = min(cfg.n_ctx, CHECK_SPAN)
    out = [Case(f"(1, {span})", rng.integers(0, cfg.vocab_size, (1, span)), np.ones((1, span), np.int64),
                np.arange(span, dtype=np.int64)[None])]
    if cfg.n_ctx >= 9:
        mask = np.ones((2, 9), np.int64)
        mask[1, :4] = 0
        pos = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
        out.append(Case("(2, 9) padded", rng.integers(0, cfg.vocab_size, (2, 9)), mask, pos))
    return out


Chain = tuple[list[dict[str, np.ndarray]], list[np.ndarray]]  # a run's calls (but the cache) and its first past


@dataclass(frozen=True)
class Greedy:
    """The greedy check's prompt and the reference's tokens after it with the scores each was chosen from
    (reference_greedy's), checked in the same opening of the graph's pieces as the parity cases."""

    prompt: Sequence[int]
    chosen: tuple[list[int], np.ndarray]


def pieces(graph: Path, taps: Sequence[str], cfg: ModelConfig, weights: Mapping[str, np.ndarray],
           budget: int = chunked.CHUNK_BYTES, prepack: bool = True) -> chunked.Chunked:
    """The graph at `graph` cut into pieces of at most `budget` bytes of float32 layer weights (`prepack`:
    chunked.Chunked's)."""
    spans = chunked.ranges(cfg.n_layer, chunked.layer_bytes(weights), budget)
    return chunked.Chunked(graph, taps, cfg.n_layer, spans, prepack)


def check_contract(graph: Path, taps: Sequence[str], cfg: ModelConfig, weights: Mapping[str, np.ndarray],
                   tol: Tolerance, checked: list[Case], greedy: Greedy | None = None,
                   budget: int = chunked.CHUNK_BYTES) -> tuple[list[ParityRow], int]:
    """The contract graph at `graph` against the layer-by-layer reference on `checked` (cases()): per case, each
    layer's output, keys and values, then the logits, each within `tol` of its magnitude and of the reference's
    own float32 error (the float64 run); their top-1 agreement at the real positions. Stores each case's
    reference logits in it. With `greedy`, its steps run in the same opening of the pieces and, where every
    case passed, are checked as greedy_verdict checks them (the tokens compared; 0 without). The rows, that."""
    import torch

    runs = [{"input_ids": case.ids, "attention_mask": case.mask, "position_ids": case.positions, "dtype": dtype}
            for case in checked for dtype in (torch.float32, torch.float64)]  # a few MiB a layer at these lengths
    outs = layer_reference.run_together(cfg, weights, runs)  # each layer read once for every case and both types
    references = list(zip(outs[::2], outs[1::2], strict=True))
    for case, (want, exact) in zip(checked, references, strict=True):
        case.logits, case.exact = want[-1], exact[-1]  # type: ignore[assignment]
    chains: list[Chain] = [([{contract.INPUT_IDS: case.ids, contract.ATTENTION_MASK: case.mask,
                              contract.POSITION_IDS: case.positions}],
                            [np.zeros((case.ids.shape[0], cfg.n_kv_head, 0, cfg.head_dim), np.float32)]
                            * (2 * cfg.n_layer)) for case in checked]
    made = _run(graph, taps, cfg, weights, budget, chains + ([greedy_chain(cfg, greedy, False)] if greedy else []))
    rows = []
    for case, (want, exact), [(logits, hidden, presents)] in zip(checked, references, made, strict=False):

        def got(i: int, presents: list[np.ndarray] = presents, hidden: list[np.ndarray] = hidden
                ) -> layer_reference.LayerOut:
            return layer_reference.LayerOut(i, hidden[i], presents[2 * i], presents[2 * i + 1])

        checks = layer_reference.compare_layers(want, got, logits, tol, exact)
        real = case.mask.astype(bool)
        top1 = float((logits.argmax(-1) == case.logits.argmax(-1))[real].mean())
        rows.append(ParityRow(case.name, tuple(checks), top1))
    return rows, _greedy_after(rows, made, greedy, tol)


def _greedy_after(rows: list[ParityRow], made: list[list[tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]]],
                  greedy: Greedy | None, tol: Tolerance) -> int:
    """The greedy chain's verdict (made's last chain) where there is one and every parity row passed; else 0."""
    return greedy_verdict(made[-1], greedy, tol) if greedy and all(r.ok for r in rows) else 0


def _run(graph: Path, taps: Sequence[str], cfg: ModelConfig, weights: Mapping[str, np.ndarray], budget: int,
         chains: Sequence[Chain]) -> list[list[tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]]]:
    """`chains` through one opening of the float32 graph's pieces (no prepacking: chunked.Chunked)."""
    cut = pieces(graph, taps, cfg, weights, budget, prepack=False)
    try:
        return cut.chains(chains)
    finally:
        cut.close()


def static_calls(ids: np.ndarray, steps: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """The static-cache graph's inputs (but the cache) for a prefill of `ids` (B, T), unpadded, then one call per
    token of `steps` for every row."""
    B, T = ids.shape
    calls = [{contract.INPUT_IDS: ids, contract.POSITION_IDS: np.tile(np.arange(T, dtype=np.int64), (B, 1)),
              contract.SEQLENS_K: np.full(B, T - 1, np.int32), contract.TOTAL_SEQUENCE_LENGTH: np.array(T, np.int32),
              contract.LOGITS_INDEX: np.tile(np.arange(T, dtype=np.int64), (B, 1))}]
    for j, token in enumerate(steps):
        calls.append({contract.INPUT_IDS: np.full((B, 1), token, np.int64),
                      contract.POSITION_IDS: np.full((B, 1), T + j, np.int64),
                      contract.SEQLENS_K: np.full(B, T + j, np.int32),
                      contract.TOTAL_SEQUENCE_LENGTH: np.array(T + j + 1, np.int32),
                      contract.LOGITS_INDEX: np.zeros((B, 1), np.int64)})
    return calls


def contract_calls(ids: np.ndarray, steps: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """The contract graph's inputs (but the cache) for a prefill of `ids` (B, T), unpadded, then each of `steps`."""
    B, T = ids.shape
    calls = [{contract.INPUT_IDS: ids, contract.ATTENTION_MASK: np.ones((B, T), np.int64),
              contract.POSITION_IDS: np.tile(np.arange(T, dtype=np.int64), (B, 1))}]
    for j, token in enumerate(steps):
        calls.append({contract.INPUT_IDS: np.full((B, 1), token, np.int64),
                      contract.ATTENTION_MASK: np.ones((B, T + j + 1), np.int64),
                      contract.POSITION_IDS: np.full((B, 1), T + j, np.int64)})
    return calls


def check_static(graph: Path, taps: Sequence[str], cfg: ModelConfig, weights: Mapping[str, np.ndarray],
                 checked: list[Case], tol: Tolerance, greedy: Greedy | None = None,
                 budget: int = chunked.CHUNK_BYTES) -> tuple[list[ParityRow], int]:
    """The static-cache graph's logits on the unpadded cases check_contract ran, against the reference's kept there
    (its cache is checked by the greedy steps: `greedy`, run in the same opening of the pieces as check_contract
    runs its own). The rows, and the greedy tokens compared where every case passed (0 without `greedy`)."""
    unpadded = [c for c in checked if c.mask.all()]
    chains: list[Chain] = [(static_calls(case.ids, []), [np.zeros((case.ids.shape[0], cfg.n_kv_head, case.ids.shape[1],
                                                                    cfg.head_dim), np.float32)] * (2 * cfg.n_layer))
                           for case in unpadded]  # each cache the case's length
    made = _run(graph, taps, cfg, weights, budget, chains + ([greedy_chain(cfg, greedy, True)] if greedy else []))
    rows = []
    for case, [(got, _, _)] in zip(unpadded, made, strict=False):
        check = compare(contract.LOGITS, got, case.logits, tol, case.exact)
        rows.append(ParityRow(case.name, (check,), float((got.argmax(-1) == case.logits.argmax(-1)).mean())))
    return rows, _greedy_after(rows, made, greedy, tol)


def reference_greedy(cfg: ModelConfig, weights: Mapping[str, np.ndarray], prompt: Sequence[int], n: int
                     ) -> tuple[list[int], np.ndarray]:
    """The reference's greedy continuation of `prompt`: n tokens and the scores each was chosen from (n, V); each
    step a pass over the model's weights for its one new token, on the keys and values of the steps before, through
    one LayerMemo (its modules refilled in place, the head read once where it fits)."""
    tokens: list[int] = []
    scores = []
    ids, past, memo = list(prompt), None, layer_reference.LayerMemo(weights)
    for _ in range(n):
        *layers, logits = layer_reference.run_layers(cfg, memo, np.array([ids]), last_only=True, past=past)
        past = [(out.key, out.value) for out in layers if isinstance(out, layer_reference.LayerOut)]
        scores.append(np.asarray(logits)[0, -1])  # (V,)
        tokens.append(int(scores[-1].argmax()))
        ids = [tokens[-1]]
    return tokens, np.stack(scores)


def decode(graph: Path, taps: Sequence[str], cfg: ModelConfig, weights: Mapping[str, np.ndarray], static: bool,
           prompt: Sequence[int], steps: Sequence[int], budget: int = chunked.CHUNK_BYTES) -> list[np.ndarray]:
    """The graph in pieces prefilled with `prompt`, then stepped through `steps` on its own cache: each call's
    logits of its last position (V,)."""
    ids = np.array([prompt], np.int64)
    width = ids.shape[1] + len(steps) + 1 if static else 0
    past = [np.zeros((1, cfg.n_kv_head, width, cfg.head_dim), np.float32)] * (2 * cfg.n_layer)
    cut = pieces(graph, taps, cfg, weights, budget)
    try:
        made = cut.run((static_calls if static else contract_calls)(ids, steps), past)
    finally:
        cut.close()
    return [logits[0, -1] for logits, _, _ in made]


def greedy_chain(cfg: ModelConfig, greedy: Greedy, static: bool) -> Chain:
    """The graph prefilled with the greedy check's prompt, then stepped through the reference's tokens (but the
    last) on its own cache."""
    tokens, _ = greedy.chosen
    ids = np.array([greedy.prompt], np.int64)
    width = ids.shape[1] + len(tokens) if static else 0
    past = [np.zeros((1, cfg.n_kv_head, width, cfg.head_dim), np.float32)] * (2 * cfg.n_layer)
    return (static_calls if static else contract_calls)(ids, tokens[:-1]), past


def greedy_verdict(made: Sequence[tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]], greedy: Greedy,
                   tol: Tolerance) -> int:
    """greedy_chain's run: each of the graph's choices the reference's or one the reference scores within its
    rounding of it, else a ValidationError. Returns the tokens compared."""
    tokens, scores = greedy.chosen
    for j, (logits, _, _) in enumerate(made):
        choice = int(logits[0, -1].argmax())
        if scores[j, choice] < scores[j].max() - tol.bound(float(np.abs(scores[j]).max())):
            raise ValidationError(f"export: greedy decoding differs from torch at new token {j} (the graph chose "
                                  f"{choice}, torch {tokens[j]})")
    return len(tokens)
