"""The whole road of an imported Llama-family model, through the CLI: `gptport import-hf` of a tiny random
transformers Llama (byte-level BPE that adds its begin token), Qwen2 (ChatML tokens, no begin token) and Qwen3
(a SentencePiece-style BPE with byte fallback that adds <s>), then `gptport export` (the contract graph and
the static-cache graphs, which generate then runs), then `gptport generate` gives the tokens transformers'
generate gives on the same weights, with the begin token where the tokenizer adds it and stopping on an end
token of generation_config.json that is not the tokenizer's; its streamed text is transformers' decode of
them; and `gptport eval` scores a text as transformers' logits do, after the begin token."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.support.cli import gptport
from tests.support.hf_models import HfModel, build, greedy

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")
torch = pytest.importorskip("torch")

CASES = [("llama", "byte-level"), ("qwen2", "chatml"), ("qwen3", "metaspace")]
NEW_TOKENS = 24
EVAL_TEXT = "ka to ri men sol ve qua lin dor ex pu ny the and ing er café 日本\n"


@pytest.fixture(scope="module", params=CASES, ids=[a for a, _ in CASES])
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path,
             corpus_file: Path) -> tuple[HfModel, Path, str]:
    arch, kind = request.param
    root = tmp_path_factory.mktemp(f"hf_{arch}")
    hf = build(arch, kind, root / "hf", tokenizer_dir, corpus_file)
    out = root / "m"
    r = gptport("import-hf", str(hf.path), "--out", str(out))
    assert r.returncode == 0, r.stderr
    r = gptport("export", str(out))
    assert r.returncode == 0, r.stderr
    return hf, out, r.stderr


def test_export_writes_the_contract_graph_and_the_static_graphs(exported: tuple[HfModel, Path, str]) -> None:
    hf, out, said = exported
    for name in ("model.onnx", "model.static.onnx", "model.append.onnx"):
        assert (out / name).is_file(), said
    config, genai = (json.loads((out / name).read_text())["model"] for name in ("config.json", "genai_config.json"))
    assert genai["eos_token_id"] == config["eos_ids"] and hf.stop_id in config["eos_ids"]
    assert genai["decoder"]["num_key_value_heads"] == config["n_kv_head"] < config["n_head"]


def test_generate_gives_transformers_tokens_and_stops_on_any_end_token(exported: tuple[HfModel, Path, str]) -> None:
    hf, out, _ = exported
    config = json.loads((out / "config.json").read_text())["model"]
    prompt_ids = hf.tokenizer(hf.prompt)["input_ids"]
    assert (prompt_ids[0] == config["bos_id"]) == config["add_bos"]  # the begin token where the tokenizer adds it
    want = greedy(hf.model, prompt_ids, NEW_TOKENS)  # transformers' generate, on generation_config.json's ends
    assert want[-1] == hf.stop_id and hf.stop_id != hf.tokenizer.eos_token_id  # ended on generation_config's
    assert hf.stop_id in config["eos_ids"]
    r = gptport("generate", str(out), hf.prompt, "--max-new-tokens", str(NEW_TOKENS), "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["token_ids"] == want[:-1] and got["finish_reason"] == "eot"
    assert got["prompt_tokens"] == len(prompt_ids)
    assert got["text"] == hf.tokenizer.decode(want[:-1])  # streamed piece by piece, spaces and all


def test_eval_scores_the_text_after_the_begin_token(exported: tuple[HfModel, Path, str], tmp_path: Path) -> None:
    hf, out, _ = exported
    config = json.loads((out / "config.json").read_text())["model"]
    eot = json.loads((out / "config.json").read_text())["eot_id"]
    text = tmp_path / "heldout.txt"
    text.write_text(EVAL_TEXT, encoding="utf-8")
    r = gptport("eval", str(out), str(text), "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    first = config["bos_id"] if config["bos_id"] is not None else eot
    ids = torch.tensor([[first, *hf.tokenizer(EVAL_TEXT, add_special_tokens=False)["input_ids"]]])
    assert ids.shape[1] <= config["n_ctx"]  # one window: every token scored after all before it
    with torch.no_grad():
        logp = torch.log_softmax(hf.model(ids).logits[0, :-1].double(), dim=-1)
    nll = -logp.gather(1, ids[0, 1:, None]).mean().item()
    assert got["tokens"] == ids.shape[1] - 1
    assert math.isclose(got["perplexity"], math.exp(nll), rel_tol=1e-4)


def test_distill_corpus_writes_the_continuations_without_special_tokens(exported: tuple[HfModel, Path, str],
                                                                        corpus_file: Path, tmp_path: Path) -> None:
    """distill-corpus runs on an imported model: four samples, separated as always, none holding a special
    token's text (the begin token it generates after, where the tokenizer adds one, is left out)."""
    hf, out, _ = exported
    r = gptport("distill-corpus", str(out), str(corpus_file), "--out", str(tmp_path / "d.txt"), "--prompts", "4",
                "--prompt-tokens", "8", "--new-tokens", "16", "--temperature", "0", "--batch", "2")
    assert r.returncode == 0, r.stderr
    samples = (tmp_path / "d.txt").read_text(encoding="utf-8").split("\n<|endoftext|>\n")  # its separator
    assert len(samples) == 5 and samples[-1] == ""
    text = "".join(samples)
    for special in hf.tokenizer.all_special_tokens:
        assert special not in text, special
