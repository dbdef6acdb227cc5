"""`gptport train --preset llama-tiny --set ...`: each choice of the Llama family builds the model it names,
takes effect, is recorded in config.json and trains; a bad value, or a setting the other choices leave
without effect, is one line naming the key."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from gptport import tokenizer as bpe
from gptport.config import ModelConfig
from gptport.corpus import CorpusReader, resolve_sources
from gptport.errors import UsageError
from gptport.preset import apply_overrides, load_preset, refuse_inert
from gptport.training import shards as data
from gptport.training.model import GPT
from gptport.training.train import Trainer
from tests.support.cli import assert_one_line_error, gptport

SMALL = ["n_ctx=32", "d_model=32", "n_layer=2", "eval_batches=1", "warmup_steps=1"]
# each --set choice on llama-tiny, with the config values it must give
CHOICES: list[tuple[list[str], dict[str, object]]] = [
    (["n_kv_head=1"], {"n_kv_head": 1}),  # multi-query
    (["n_kv_head=4"], {"n_kv_head": 4}),  # every query head its own keys and values
    (["head_dim=16"], {"head_dim": 16}),  # heads wider than d_model
    (["norm=layernorm"], {"norm": "layernorm"}),
    (["norm=layernorm", "bias=true"], {"norm": "layernorm", "bias": True}),
    (["ln_eps=1e-6"], {"ln_eps": 1e-6}),
    (["mlp=gelu"], {"mlp": "gelu", "d_ff": 128}),
    (["mlp=gelu", "gelu=exact"], {"gelu": "exact"}),
    (["d_ff=96"], {"d_ff": 96}),
    (["pos_encoding=learned"], {"pos_encoding": "learned"}),
    (["pos_encoding=sinusoidal"], {"pos_encoding": "sinusoidal"}),
    (["rope_theta=500000"], {"rope_theta": 500000.0}),
    (["rope_scaling=linear", "rope_factor=4"], {"rope_scaling": "linear", "rope_factor": 4.0}),
    (["rope_scaling=llama3", "rope_factor=8", "rope_original_n_ctx=16", "rope_low_freq_factor=1",
      "rope_high_freq_factor=2"], {"rope_scaling": "llama3", "rope_high_freq_factor": 2.0}),
    (["qkv_bias=true"], {"qkv_bias": True}),
    (["out_bias=true"], {"out_bias": True}),
    (["mlp_bias=true"], {"mlp_bias": True}),
    (["qk_norm=true"], {"qk_norm": True}),
    (["tie_embeddings=true"], {"tie_embeddings": True}),
    (["bos_id=1", "add_bos=true", "eos_ids=0,2"], {"bos_id": 1, "add_bos": True, "eos_ids": [0, 2]}),
]


def config(sets: list[str], vocab_size: int = 512) -> ModelConfig:
    """The config `gptport train --preset llama-tiny --set ...` builds."""
    chosen = apply_overrides(load_preset("llama-tiny"), [*SMALL, *sets])
    cfg = ModelConfig(vocab_size=vocab_size, **chosen.model)  # type: ignore[arg-type]
    refuse_inert(cfg, sets)
    return cfg


def logits(cfg: ModelConfig, ids: torch.Tensor) -> torch.Tensor:
    """The model's logits with seeded weights large enough (std 0.3) that attention is far from uniform, so
    positions and norms show in them."""
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
        return model(ids)[0]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    """A model directory's tokenizer and token shards, copied by each run."""
    out = tmp_path_factory.mktemp("choices") / "base"
    shutil.copytree(tokenizer_dir, out)
    data.prepare(out, CorpusReader(resolve_sources([corpus_file])), bpe.load(out), 0.1)
    return out


@pytest.mark.parametrize(("sets", "expect"), CHOICES, ids=[" ".join(s) for s, _ in CHOICES])
def test_each_choice_takes_effect_is_recorded_and_trains(sets: list[str], expect: dict[str, object],
                                                         shards: Path, tmp_path: Path) -> None:
    from gptport.config import TrainConfig

    cfg = config(sets)
    base = config([])
    ids = torch.randint(0, cfg.vocab_size, (2, 32), generator=torch.Generator().manual_seed(1))
    model = GPT(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.n_params()
    if not {"bos_id", "add_bos", "eos_ids"} & set(expect):  # the special tokens change what is generated only
        assert (logits(cfg, ids) - logits(base, ids)).abs().max() > 1e-4, "the choice changed nothing"
    d = tmp_path / "m"
    shutil.copytree(shards, d)
    tok = bpe.load(d)
    tcfg = TrainConfig(steps=3, batch_size=4, lr=1e-2, warmup_steps=1, eval_every=3, eval_batches=1, device="cpu",
                       seed=0)
    trainer = Trainer(d, cfg, tcfg, data.load_prepared(d), tok, bpe.token_bytes(tok))
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    result = trainer.run()
    assert result.step == 3 and all(math.isfinite(r.val_loss) for r in result.records)
    assert all(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items()), "a weight is not trained"
    saved = json.loads((d / "config.json").read_text())["model"]
    for key, value in expect.items():
        assert saved[key] == value, key


# (--set, what the one line must say): a value of the wrong type, a choice that does not exist, a shape the
# model cannot have, a setting the other choices leave without effect, a key that is not one
BAD = [
    (["n_kv_head=3"], "model.n_head (4) must be a multiple of model.n_kv_head (3)"),
    (["n_kv_head=two"], "--set n_kv_head=two: expected an integer"),
    (["norm=batchnorm"], "model.norm must be 'layernorm' or 'rmsnorm', not 'batchnorm'"),
    (["mlp=relu"], "model.mlp must be 'gelu', 'swiglu' or 'geglu', not 'relu'"),
    (["pos_encoding=alibi"], "model.pos_encoding must be 'learned', 'sinusoidal' or 'rope', not 'alibi'"),
    (["rope_scaling=yarn"], "model.rope_scaling must be 'none', 'linear', 'llama3' or 'longrope', not 'yarn'"),
    (["rope_theta=-1"], "model.rope_theta must be a finite positive number, not -1.0"),
    (["rope_theta=inf"], "model.rope_theta must be a finite positive number, not inf"),
    (["rope_theta=abc"], "--set rope_theta=abc: expected a number"),
    (["ln_eps=-1e-5"], "model.ln_eps must be a finite number >= 0, not -1e-05"),
    (["ln_eps=nan"], "model.ln_eps must be a finite number >= 0, not nan"),
    (["head_dim=7"], "model.head_dim must be even for rope positions, not 7"),
    (["qk_norm=yes"], "--set qk_norm=yes: expected true or false"),
    (["add_bos=true"], "model.add_bos is true but model.bos_id is not set"),
    (["bos_id=600"], "model.bos_id: token 600 is outside the vocabulary (0..511)"),
    (["eos_ids=a,b"], "--set eos_ids=a,b: expected comma-separated integers"),
    (["gelu=exact"], "--set gelu=exact: has no effect, model.mlp is 'swiglu'"),
    (["rope_factor=4"], "--set rope_factor=4: has no effect, model.rope_scaling is 'none'"),
    (["rope_scaling=linear", "rope_factor=2", "rope_low_freq_factor=2"],
     "--set rope_low_freq_factor=2: has no effect, model.rope_scaling is 'linear'"),
    (["pos_encoding=learned", "rope_theta=5e5"], "--set rope_theta=5e5: has no effect, model.pos_encoding is "
     "'learned'"),
    (["bias=true", "qkv_bias=true"], "--set qkv_bias=true: has no effect, model.bias is true"),
    (["vocab_size=100"], "--set vocab_size: the vocabulary is the tokenizer's"),
    (["n_kv_heads=2"], "--set n_kv_heads: unknown setting"),
]


@pytest.mark.parametrize(("sets", "says"), BAD, ids=[" ".join(s) for s, _ in BAD])
def test_a_bad_choice_is_refused_naming_the_key(sets: list[str], says: str) -> None:
    with pytest.raises(UsageError) as e:
        config(sets)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_the_cli_refuses_a_bad_choice_in_one_line_before_writing(tmp_path: Path, tokenizer_dir: Path,
                                                                corpus_file: Path) -> None:
    d = tmp_path / "m"
    shutil.copytree(tokenizer_dir, d)
    base = ["train", str(corpus_file), "--model-dir", str(d), "--preset", "llama-tiny", "--steps", "1",
            "--device", "cpu", *[x for s in SMALL for x in ("--set", s)]]
    assert_one_line_error(gptport(*base, "--set", "n_kv_head=3"), 2, "model.n_kv_head (3)")
    assert_one_line_error(gptport(*base, "--set", "gelu=exact"), 2, "--set gelu=exact: has no effect",
                          "model.mlp is 'swiglu'")
    assert not (d / "config.json").exists() and not (d / "data").exists()
