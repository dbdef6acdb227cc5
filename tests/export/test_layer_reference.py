"""run_layers, the torch reference one layer at a time from weights read by name, against the whole GPT: each
layer's output and cache and the logits the same numbers in float32 (GPT-2's choices, the Llama family's with
grouped kv heads, q/k norm, biases, Llama 3.1's rope scaling, an untied head; left padding), float64 the same as
float64_reference's and near float32; the weights read layer by layer as the layers run; a wrong shape refused."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from gptport import safetensors_file
from gptport.config import ModelConfig
from gptport.errors import ArtifactError, InputError
from gptport.export import float64_reference
from gptport.export.float64_reference import float64_copy
from gptport.export.layer_reference import LayerOut, compare_layers, run_layers, run_together
from gptport.export.tolerance import Tolerance
from gptport.training.checkpoint import write_weights
from gptport.training.model import GPT

VARIANTS = {
    "gpt2": {},
    "sinusoidal": {"pos_encoding": "sinusoidal", "gelu": "exact", "dropout": 0.1},
    "llama": {"pos_encoding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "n_kv_head": 2, "head_dim": 16,
              "bias": False, "qkv_bias": True, "qk_norm": True, "out_bias": True, "mlp_bias": True,
              "tie_embeddings": False, "rope_scaling": "llama3", "rope_factor": 8.0, "rope_original_n_ctx": 16},
}


def tiny(tmp_path: Path, **kw: object) -> tuple[GPT, dict[str, np.ndarray]]:
    """A seeded 3-layer GPT, every weight (norms and biases too) random, and its weights as model.safetensors
    holds them (a tied head stored once, as wte.weight)."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=101, n_ctx=32, d_model=32, n_layer=3, n_head=4, **kw)  # type: ignore[arg-type]
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    write_weights(tmp_path / "model.safetensors", model, 0)
    return model, safetensors_file.read_numpy(tmp_path / "model.safetensors")


def inputs() -> tuple[np.ndarray, np.ndarray]:
    """Two rows of 9 tokens, the second left-padded by 4."""
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 101, (2, 9)).astype(np.int64)
    mask = np.ones((2, 9), dtype=np.int64)
    ids[1, :4], mask[1, :4] = 0, 0
    return ids, mask


def same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal to float32 rounding (the same operations in the same order: bit-equal on the CPUs measured)."""
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def split(items: list[LayerOut | np.ndarray]) -> tuple[list[LayerOut], np.ndarray]:
    *layers, logits = items
    assert all(isinstance(out, LayerOut) for out in layers) and isinstance(logits, np.ndarray)
    return layers, logits  # type: ignore[return-value]


def traced(model: GPT, ids: np.ndarray, mask: np.ndarray) -> tuple[list[tuple[torch.Tensor, ...]], np.ndarray]:
    """GPT.forward's logits and each block's (output, key, value), taken by forward hooks."""
    seen: list[tuple[torch.Tensor, ...]] = []
    hooks = [b.register_forward_hook(lambda m, a, out: seen.append((out[0], *out[1]))) for b in model.h]
    with torch.no_grad():
        logits, _ = model(torch.from_numpy(ids), torch.from_numpy(mask))
    for h in hooks:
        h.remove()
    return seen, logits.numpy()


@pytest.mark.parametrize("variant", VARIANTS, ids=list(VARIANTS))
def test_float32_layers_and_logits_are_the_models(tmp_path: Path, variant: str) -> None:
    model, weights = tiny(tmp_path, **VARIANTS[variant])
    ids, mask = inputs()
    want_layers, want_logits = traced(model, ids, mask)
    layers, logits = split(list(run_layers(model.cfg, weights.__getitem__, ids, mask)))
    cfg = model.cfg
    assert [out.index for out in layers] == list(range(cfg.n_layer))
    for out, (hidden, key, value) in zip(layers, want_layers, strict=True):
        assert out.hidden.dtype == np.float32 and out.hidden.shape == (2, 9, cfg.d_model)
        assert out.key.shape == out.value.shape == (2, cfg.n_kv_head, 9, cfg.head_dim)
        same(out.hidden, hidden.numpy())
        same(out.key, key.numpy())
        same(out.value, value.numpy())
    assert logits.shape == (2, 9, cfg.vocab_size)
    same(logits, want_logits)
    *_, last = run_layers(cfg, weights.__getitem__, ids, mask, last_only=True)
    with torch.no_grad():
        want_last, _ = model(torch.from_numpy(ids), torch.from_numpy(mask), last_only=True)
    assert last.shape == (2, 1, cfg.vocab_size)
    same(last, want_last.numpy())


@pytest.mark.parametrize("variant", ["gpt2", "llama"])
def test_float64_is_float64_references_and_near_float32(tmp_path: Path, variant: str) -> None:
    model, weights = tiny(tmp_path, **VARIANTS[variant])
    ids, mask = inputs()
    layers, logits = split(list(run_layers(model.cfg, weights.__getitem__, ids, mask, dtype=torch.float64)))
    with torch.no_grad():
        want, present = float64_copy(model)(torch.from_numpy(ids), torch.from_numpy(mask))
    assert logits.dtype == np.float64 and layers[0].key.dtype == np.float64
    np.testing.assert_allclose(logits, want.numpy(), rtol=1e-12, atol=1e-12)
    for out, (key, value) in zip(layers, present, strict=True):
        np.testing.assert_allclose(out.key, key.numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(out.value, value.numpy(), rtol=1e-12, atol=1e-12)
    _, logits32 = split(list(run_layers(model.cfg, weights.__getitem__, ids, mask)))
    gap = np.abs(logits - logits32).max()
    assert 0 < gap < 1e-4 * np.abs(logits).max()  # float32's rounding: there, and small


def test_weights_are_read_a_layer_at_a_time_as_the_layers_run(tmp_path: Path) -> None:
    model, weights = tiny(tmp_path, **VARIANTS["llama"])
    asked: list[str] = []

    def weight(name: str) -> np.ndarray:
        asked.append(name)
        return weights[name]

    ids, mask = inputs()
    steps = run_layers(model.cfg, weight, ids, mask)
    for i in range(model.cfg.n_layer):
        assert next(steps).index == i  # type: ignore[union-attr]
        assert torch.is_grad_enabled()  # no_grad stays inside the generator
        assert {name.split(".")[1] for name in asked if name.startswith("h.")} == {str(j) for j in range(i + 1)}
    next(steps)
    layer_names = [name for name in asked if name.startswith("h.")]
    assert sorted(layer_names) == sorted(k for k in weights if k.startswith("h."))  # each read once
    assert asked[0] == "wte.weight" and asked[-2:] == ["ln_f.weight", "lm_head.weight"]


def test_a_weight_of_the_wrong_shape_or_ids_past_the_vocabulary_are_refused_in_one_line(tmp_path: Path) -> None:
    model, weights = tiny(tmp_path)
    ids, mask = inputs()
    bad = dict(weights, **{"h.1.mlp.c_fc.weight": weights["h.1.mlp.c_fc.weight"][:, :-1]})
    with pytest.raises(ArtifactError, match=r"weight h\.1\.mlp\.c_fc\.weight: shape \(128, 31\), the config asks "
                                            r"for \(128, 32\)"):
        list(run_layers(model.cfg, bad.__getitem__, ids, mask))
    with pytest.raises(InputError, match=r"weight wte\.weight: 101 rows, asked for rows 7\.\.101"):
        list(run_layers(model.cfg, weights.__getitem__, np.array([[7, 101]]), None))


def test_compare_layers_passes_the_same_weights_and_names_the_first_layer_of_a_weight_off_by_ten_percent(
        tmp_path: Path) -> None:
    model, weights = tiny(tmp_path, **VARIANTS["llama"])
    cfg, ids, mask = model.cfg, *inputs()

    def checks(got_weights: dict[str, np.ndarray]) -> dict[str, bool]:
        got, got_logits = split(list(run_layers(cfg, got_weights.__getitem__, ids, mask)))
        exact = run_layers(cfg, weights.__getitem__, ids, mask, dtype=torch.float64)
        found = compare_layers(run_layers(cfg, weights.__getitem__, ids, mask), lambda i: got[i], got_logits,
                               Tolerance(), exact)
        assert all(c.ref_error is not None for c in found)
        return {c.quantity: c.ok for c in found}

    assert list(checks(weights)) == [f"layer {i} {q}" for i in range(3) for q in ("hidden", "keys", "values")] + [
        "logits"]
    assert all(checks(weights).values())
    off = checks(dict(weights, **{"h.1.mlp.c_fc.weight": weights["h.1.mlp.c_fc.weight"] * 1.1}))
    assert all(off[f"layer 0 {q}"] for q in ("hidden", "keys", "values")) and off["layer 1 keys"]
    assert not off["layer 1 hidden"] and not off["layer 2 keys"] and not off["logits"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_float64_copy_is_the_model_widened_bit_for_bit(tmp_path: Path, variant: str) -> None:
    """Its embeddings look up float32 rows and widen them: the same numbers as a whole widened copy's."""
    model, _ = tiny(tmp_path, **VARIANTS[variant])
    ids, mask = inputs()
    with torch.no_grad():
        want, want_present = copy.deepcopy(model).double()(torch.from_numpy(ids), torch.from_numpy(mask))
        got, present = float64_copy(model)(torch.from_numpy(ids), torch.from_numpy(mask))
    assert got.dtype == torch.float64 and torch.equal(got, want)
    for pair, want_pair in zip(present, want_present, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(pair, want_pair, strict=True))


@pytest.mark.parametrize("variant", ["gpt2", "llama"])
def test_float64_copy_widens_a_head_rows_at_a_time_to_the_same_logits(tmp_path: Path, variant: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A head of more than HEAD_ROWS outputs (here 16: 101 in six whole blocks and a part, an untied head with
    a bias too) widened block by block: the whole widened model's logits to float64's last bits."""
    monkeypatch.setattr(float64_reference, "HEAD_ROWS", 16)
    model, _ = tiny(tmp_path, **VARIANTS[variant])
    if variant == "llama":
        model.lm_head.bias = torch.nn.Parameter(torch.randn(model.cfg.vocab_size))
    ids, mask = inputs()
    with torch.no_grad():
        want, _ = copy.deepcopy(model).double()(torch.from_numpy(ids), torch.from_numpy(mask))
        got, _ = float64_copy(model)(torch.from_numpy(ids), torch.from_numpy(mask))
    assert got.shape == want.shape and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("hold", [2 << 30, 0], ids=["held", "dropped at each move"])
@pytest.mark.parametrize("variant", ["gpt2", "llama"])
def test_runs_together_read_each_tensor_once_and_give_each_runs_numbers(tmp_path: Path, variant: str, hold: int,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Within LayerMemo's budget, or past it (each move between the layers and the head drops the other side's
    modules): the same numbers, each tensor read once."""
    from gptport.export import layer_reference
    from gptport.weights import ModelWeights

    monkeypatch.setattr(layer_reference, "HOLD_BYTES", hold)

    model, weights = tiny(tmp_path, **VARIANTS[variant])
    ids, mask = inputs()
    runs = [{"input_ids": ids, "attention_mask": mask}, {"input_ids": ids[:1, 2:], "dtype": torch.float64},
            {"input_ids": ids[1:], "attention_mask": mask[1:], "last_only": True}]
    alone = [list(run_layers(model.cfg, weights, **kw)) for kw in runs]
    stored, read = ModelWeights(tmp_path / "model.safetensors"), list[str]()
    real, into = ModelWeights.__getitem__, ModelWeights.into
    monkeypatch.setattr(ModelWeights, "__getitem__", lambda self, n: read.append(n) or real(self, n))
    monkeypatch.setattr(ModelWeights, "into", lambda self, n, out: read.append(n) or into(self, n, out))
    together = run_together(model.cfg, stored, runs)
    assert read and len(read) == len(set(read))  # every tensor read once for the three runs and both float types
    for got, want in zip(together, alone, strict=True):
        for a, b in zip(got, want, strict=True):
            if isinstance(b, np.ndarray):
                assert isinstance(a, np.ndarray) and np.array_equal(a, b)
            else:
                assert isinstance(a, LayerOut) and all(np.array_equal(getattr(a, f), getattr(b, f))
                                                       for f in ("hidden", "key", "value"))


@pytest.mark.parametrize("variant", VARIANTS, ids=list(VARIANTS))
def test_a_step_on_the_past_is_the_models_step_on_its_cache(tmp_path: Path, variant: str) -> None:
    model, weights = tiny(tmp_path, **VARIANTS[variant])
    ids, mask = inputs()
    *layers, _ = run_layers(model.cfg, weights, ids, mask)
    past = [(out.key, out.value) for out in layers]
    step, full = np.array([[5], [7]]), np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)  # (2, 1), (2, 10)
    *stepped, logits = run_layers(model.cfg, weights, step, full, past=past)
    with torch.no_grad():
        _, cache = model(torch.from_numpy(ids), torch.from_numpy(mask))
        want, present = model(torch.from_numpy(step), torch.from_numpy(full), past=cache)
    same(logits, want.numpy())
    for out, (k, v) in zip(stepped, present, strict=True):
        assert out.key.shape == (2, model.cfg.n_kv_head, 10, model.cfg.head_dim)
        same(out.key, k.numpy())
        same(out.value, v.numpy())


@pytest.mark.parametrize("variant", ["gpt2", "llama"])
def test_the_greedy_reference_through_one_memo_is_the_models_greedy(tmp_path: Path, variant: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """reference_greedy's passes through one LayerMemo (modules held, or refilled each pass): the torch model's own
    greedy tokens and last-position logits, step by step on its cache."""
    from gptport.export import layer_check, layer_reference
    from gptport.weights import ModelWeights

    model, _ = tiny(tmp_path, **VARIANTS[variant])
    stored, prompt = ModelWeights(tmp_path / "model.safetensors"), [3, 1, 4, 1, 5]
    with torch.no_grad():
        logits, cache = model(torch.tensor([prompt]))
        want_tokens, want_scores = [], []
        for _ in range(5):
            want_scores.append(logits[0, -1].numpy())
            want_tokens.append(int(logits[0, -1].argmax()))
            logits, cache = model(torch.tensor([[want_tokens[-1]]]), past=cache)
    for hold in (2 << 30, 0):
        monkeypatch.setattr(layer_reference, "HOLD_BYTES", hold)
        tokens, scores = layer_check.reference_greedy(model.cfg, stored, prompt, 5)
        assert tokens == want_tokens
        same(scores, np.stack(want_scores))
