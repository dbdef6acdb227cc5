"""`gptport export-web` of Llama-family models, in a real headless Chromium with the lock file's onnxruntime-web
and tokenizers.js: a tiny random Llama (byte-level BPE that adds its begin token) and Qwen3 (SentencePiece-style
BPE with byte fallback, <s> first) from tests/support/hf_models.py, through import-hf and `gptport export` with
its int8 variant gated, bundled with that variant. The page gives the greedy tokens and text that `gptport
generate` gives on the graph the bundle ships, its cache of n_kv_head heads, the begin token first, stopping on an
end token of generation_config.json that is not the tokenizer's; its tokenizer encodes and decodes as gptport's;
export-web refuses a variant that is missing or was never gated."""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptport import contract
from gptport import tokenizer as bpe
from gptport.errors import UsageError
from gptport.export import gguf_tokenizer, web_graph
from gptport.export.web import export_web
from tests.support import hf_models, hf_tokenizers
from tests.support.chromium import CHROMIUM_ARGS, chromium_path
from tests.support.cli import assert_one_line_error, gptport
from tests.support.web_page import WEBGPU, Page, has_webgpu, opened

pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("npm") is None, reason="no npm: export-web fetches onnxruntime-web "
                                 "with it (install Node.js)")]
needs_browser = pytest.mark.skipif(chromium_path() is None, reason="no Chromium: `apt-get install chromium` "
                                   "(Debian), or set GPTPORT_CHROMIUM")

CASES = [("llama", "byte-level"), ("qwen3", "metaspace")]
# Weights drawn N(0, 0.05) rather than hf_models' 0.3: far enough from uniform for greedy decoding to mean
# something, near enough that the int8 variant passes export's gate (top-1 >= 98%) on the test corpus.
STD = 0.05
PROMPTS = ["ka to ri men", "the ", "\n", "To be or not", "日本 café 🙂"]
NEW = 24
TEXTS = ["  double  spaces", "tab\tand\nnewline", "émoji 🚀 ünïcode", "<s>x</s>", "don't", "1234567", "x\u0085's",
         "  \ufeff", "Ⅻ ١٢٣", "\u2581a", "<|begin_of_text|>hi<|eot_id|>"]


@dataclass
class Case:
    hf: hf_models.HfModel
    model: Path  # the imported model directory, exported with its gated int8 variant
    bundle: Path  # export-web --precision int8
    shipped: Path  # a model directory whose int8 graph is the bundle's, for `gptport generate`
    want: dict[str, dict[str, Any]]  # `gptport generate --json` on the shipped graph, per prompt


@pytest.fixture(scope="module", params=CASES, ids=[a for a, _ in CASES])
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path,
         corpus_file: Path, web_cache: Path) -> Case:
    arch, kind = request.param
    root = tmp_path_factory.mktemp(f"web_{arch}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hf_models, "widen", functools.partial(hf_models.widen, std=STD))
        hf = hf_models.build(arch, kind, root / "hf", tokenizer_dir, corpus_file)
    model = root / "m"
    for args in (("import-hf", str(hf.path), "--out", str(model)),
                 ("export", str(model), "--precision", "fp32,int8", "--heldout", str(corpus_file), "--no-static"),
                 ("export-web", str(model), "--out", str(root / "web"), "--precision", "int8")):
        r = gptport(*args)  # web_cache is in the environment
        assert r.returncode == 0, (args[0], r.stderr)
    shipped = root / "shipped"
    shipped.mkdir()
    for name in (bpe.TOKENIZER_FILE, "tokenizer_meta.json", "config.json"):
        shutil.copy(model / name, shipped / name)
    shutil.copy(root / "web" / web_graph.GRAPHS["int8"], shipped / contract.onnx_file("int8"))
    r = gptport("generate", str(shipped), *PROMPTS, "--precision", "int8", "--max-new-tokens", str(NEW), "--json")
    assert r.returncode == 0, r.stderr
    want = {p: json.loads(line) for p, line in zip(PROMPTS, r.stdout.splitlines(), strict=True)}
    return Case(hf, model, root / "web", shipped, want)


def test_manifest_says_what_it_ships(case: Case) -> None:
    """The int8 variant, gated, at transformers.js's q8 name; its weights the gated graph's, every MatMulNBits
    set to float compute; the page's config: n_kv_head heads, the begin token added, every end token."""
    manifest = json.loads((case.bundle / "manifest.json").read_text())
    assert (manifest["precision"], manifest["graph"], manifest["source_graph"], manifest["gated"]) == \
        ("int8", "onnx/model_quantized.onnx", "model.int8.onnx", True)
    assert "onnx/model.onnx" not in manifest["files"]  # one graph: not the fp32 one beside it
    source = onnx.load(str(case.model / "model.int8.onnx"))
    shipped = onnx.load(str(case.bundle / manifest["graph"]))
    assert {i.name: i.raw_data for i in shipped.graph.initializer} == \
        {i.name: i.raw_data for i in source.graph.initializer}
    nbits = [n for n in shipped.graph.node if n.op_type == "MatMulNBits"]
    levels = {a.i for n in nbits for a in n.attribute if a.name == "accuracy_level"}
    assert nbits and levels == {0} and manifest["matmulnbits"] == {"nodes": len(nbits), "accuracy_level": 0}
    assert manifest["files"][manifest["graph"]]["bytes"] < (case.model / "model.onnx").stat().st_size
    cfg = manifest["config"]
    assert cfg["n_kv_head"] < cfg["n_head"] and cfg["add_bos"] and cfg["bos_id"] == case.hf.tokenizer.bos_token_id
    assert case.hf.stop_id in cfg["end_ids"] and case.hf.tokenizer.eos_token_id in cfg["end_ids"]
    config = json.loads((case.bundle / "config.json").read_text())
    assert config["num_key_value_heads"] == cfg["n_kv_head"] and config["head_dim"] == cfg["head_dim"]


@pytest.fixture(scope="module")
def page(playwright: Any, case: Case) -> Iterator[Page]:
    yield from opened(playwright, case.bundle)


@needs_browser
def test_page_gives_generates_tokens_and_text(page: Page, case: Case) -> None:
    assert page.info["precision"] == "int8" and page.info["config"]["n_kv_head"] < page.info["config"]["n_head"]
    for prompt, want in case.want.items():
        got = page.generate(prompt, max_new_tokens=NEW)
        assert (got["token_ids"], got["text"], got["finish_reason"]) == \
            (want["token_ids"], want["text"], want["finish_reason"]), prompt
        assert got["prompt_tokens"] == want["prompt_tokens"] == len(case.hf.tokenizer(prompt)["input_ids"])
    page.check_clean()


@needs_browser
def test_page_stops_on_an_end_token_that_is_not_the_tokenizers(page: Page, case: Case) -> None:
    """The prompt hf_models made to reach generation_config.json's own end token: the page stops on it."""
    want = case.want[case.hf.prompt]
    assert want["finish_reason"] == "eot"
    past = page.generate(case.hf.prompt, max_new_tokens=len(want["token_ids"]) + 1, ignore_eos=True)
    assert past["token_ids"][:-1] == want["token_ids"]
    assert past["token_ids"][-1] == case.hf.stop_id != case.hf.tokenizer.eos_token_id


@needs_browser
def test_page_checks_itself(page: Page) -> None:
    checks = page.page.evaluate("window.gptport.selfCheck()")
    assert checks and all(c["ok"] for c in checks), checks
    page.page.wait_for_function("document.getElementById('check').textContent.includes('match')")


@needs_browser
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=60) | st.sampled_from(TEXTS), ids=st.lists(st.integers(0, 400), max_size=12))
def test_page_tokenizer_equals_gptports(page: Page, case: Case, text: str, ids: list[int]) -> None:
    """Encoding text, and decoding any ids (byte-fallback runs that are not UTF-8 included), as gptport does."""
    tok = bpe.load(case.model)
    assert page.page.evaluate("(t) => window.gptport.tokenize(t)", text) == tok.encode(text)
    assert page.page.evaluate("(i) => window.gptport.detokenize(i)", ids) == tok.decode(ids)


def tokenizer_kinds(corpus: Path) -> dict[str, str]:
    """tokenizer.json of each kind import-hf and import-gguf write: byte-level BPEs with each pre-tokenizer
    (their merges trained across digits, apostrophes and spaces, so that each split is seen in the ids) and
    SentencePiece-style BPEs with byte fallback (Metaspace, and the legacy Replace/Strip sequence)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    base = Tokenizer(models.BPE())
    base.pre_tokenizer, base.decoder = byte_level, decoders.ByteLevel()
    text = corpus.read_text(encoding="utf-8")[:20000] + "\n".join(TEXTS * 40)
    base.train_from_iterator([text], trainers.BpeTrainer(vocab_size=800, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        special_tokens=["<|endoftext|>", "<|im_end|>"]))
    splits = {"llama-3": gguf_tokenizer.LLAMA3, "qwen2": gguf_tokenizer.QWEN2, "gpt-4o": gguf_tokenizer.GPT4O,
              "tekken": gguf_tokenizer.TEKKEN}
    pres = {"gpt-2": pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            "smollm": pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]),
            **{name: pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(rx), behavior="isolated"), byte_level])
               for name, rx in splits.items()}}
    out = {}
    for name, pre in pres.items():
        spec = json.loads(base.to_str())
        spec["model"]["ignore_merges"] = name in ("llama-3", "gpt-4o", "tekken")
        tok = Tokenizer.from_str(json.dumps(spec))
        tok.pre_tokenizer = pre
        out[name] = tok.to_str()
    out["metaspace"] = hf_tokenizers.metaspace(corpus).to_str()
    out["metaspace-legacy"] = hf_tokenizers.metaspace(corpus, legacy=True).to_str()
    return out


KIND_TEXTS = [*TEXTS, "it's  ok\u0085's \ufeff\ufeff  \ufeff", "x١٢٣ Ⅻ 2024 ½", "We'LL see\r\n\r\n  7"]
KIND_IDS = [[3 + 0xE6, 3 + 0x97], [3 + 0xEF, 3 + 0xBB, 3 + 0xBF, 40], [40, 3 + 0xE6, 3 + 0x97, 3 + 0xA5], [5, 300]]
JS_KINDS = """async ([kinds, texts, idLists]) => {
  const { makeTokenizer } = await import("./tokenizer.js");
  const { Tokenizer } = await import("./runtime/tokenizers.min.mjs");
  const out = {};
  for (const [name, text] of Object.entries(kinds)) {
    const ours = makeTokenizer(JSON.parse(text));
    const raw = new Tokenizer(JSON.parse(text), { clean_up_tokenization_spaces: false });
    out[name] = { ours: texts.map((t) => ours.encode(t)), ours_text: idLists.map((ids) => ours.decode(ids)),
                  raw: texts.map((t) => raw.encode(t, { add_special_tokens: false }).ids),
                  raw_text: idLists.map((ids) => raw.decode(ids, { skip_special_tokens: false })) };
  }
  return out;
}"""


@needs_browser
def test_page_tokenizer_equals_gptports_for_each_kind(page: Page, corpus_file: Path) -> None:
    """tokenizer.js encodes and decodes as `tokenizers` for every kind of tokenizer.json; tokenizers.js alone
    does not (its ByteLevel regex's \\s, its ASCII-only Digits, its ByteFallback decoding)."""
    from tokenizers import Tokenizer

    kinds = tokenizer_kinds(corpus_file)
    got = page.page.evaluate(JS_KINDS, [kinds, KIND_TEXTS, KIND_IDS])
    differs = {}
    for name, text in kinds.items():
        tok = Tokenizer.from_str(text)
        ids = [tok.encode(t, add_special_tokens=False).ids for t in KIND_TEXTS]
        texts = [tok.decode(i, skip_special_tokens=False) for i in KIND_IDS]
        assert (got[name]["ours"], got[name]["ours_text"]) == (ids, texts), name
        differs[name] = (got[name]["raw"] != ids, got[name]["raw_text"] != texts)
    assert differs["gpt-2"][0] and differs["smollm"][0] and differs["metaspace"][1], differs
    page.check_clean()


@needs_browser
def test_webgpu_gives_generates_tokens(playwright: Any, case: Case) -> None:
    """The quantized graph on WebGPU (SwiftShader): the same tokens as on the CPU."""
    browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS + WEBGPU)
    try:
        if not has_webgpu(browser, case.bundle):
            pytest.skip("this Chromium offers no WebGPU adapter (SwiftShader Vulkan missing)")
        page = Page(browser, case.bundle, device="webgpu")
        try:
            for prompt in PROMPTS[:2]:
                assert page.generate(prompt, max_new_tokens=NEW)["token_ids"] == case.want[prompt]["token_ids"]
            page.check_clean()
        finally:
            page.close()
    finally:
        browser.close()


def test_refuses_a_variant_missing_or_never_gated(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "web"
    assert_one_line_error(gptport("export-web", str(case.model), "--out", str(out), "--precision", "int4"), 2,
                          "model.int4.onnx", f"gptport export {case.model} --precision fp32,int4")
    assert_one_line_error(gptport("export-web", str(case.model), "--out", str(out), "--precision", "fp16"), 2,
                          "--precision 'fp16'", "fp32, int8, int4")
    ungated = tmp_path / "ungated"
    shutil.copytree(case.model, ungated)
    graph = onnx.load(str(ungated / "model.int8.onnx"))
    next(p for p in graph.metadata_props if p.key == contract.META_GATED).value = "false"  # as --no-gate writes it
    onnx.save(graph, str(ungated / "model.int8.onnx"))
    assert_one_line_error(gptport("export-web", str(ungated), "--out", str(out), "--precision", "int8"), 2,
                          "model.int8.onnx", "--no-gate")
    monkeypatch.setattr(web_graph, "AUTO_FP32_BYTES", 0)  # every fp32 graph too big for auto
    with pytest.raises(UsageError, match="too much for a browser bundle and .* has no gated int8 or int4 variant"):
        export_web(ungated, out)
    assert web_graph.choose(case.model, "auto")[0] == "int8"  # auto takes the gated variant
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".web")]
