"""encode_prompts for a model whose tokenizer adds its begin token: every prompt starts with it, and a prompt
longer than n_ctx keeps it before its last tokens; without a config (or for a GPT) the prompts are as before."""

from __future__ import annotations

from gptport.config import ModelConfig
from gptport.runtime.loader import encode_prompts
from gptport.tokenizer import BPETokenizer


def test_the_begin_token_starts_each_prompt_and_survives_truncation(tok: BPETokenizer) -> None:
    cfg = ModelConfig(vocab_size=tok.vocab_size, n_ctx=32, bos_id=7, add_bos=True)
    warnings: list[str] = []
    short, long, empty = encode_prompts(tok, ["ka to", "ka " * 100, ""], 32, warn=warnings.append, config=cfg)
    assert short == [7, *tok.encode("ka to")] and empty == [7]
    assert len(long) == 32 and long[0] == 7 and long[1:] == tok.encode("ka " * 100)[-31:]
    assert len(warnings) == 1
    gpt = ModelConfig(vocab_size=tok.vocab_size, n_ctx=32)
    for config in (None, gpt):
        assert encode_prompts(tok, ["ka to", ""], 32, config=config) == [tok.encode("ka to"), [tok.eot_id]]
