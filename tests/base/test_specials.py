"""A model's special tokens at inference: a GPT ends on <|endoftext|> and its prompts start bare (an empty one
from <|endoftext|>), as before the Llama family; a model with eos_ids ends on any of them, and one whose
tokenizer adds its begin token starts every prompt with it, an empty one too; a scored text follows the begin
token where the model has one."""

from __future__ import annotations

from gptport import specials
from gptport.config import ModelConfig
from gptport.tokenizer import BPETokenizer


def test_a_gpt_keeps_its_end_of_text(tok: BPETokenizer) -> None:
    cfg = ModelConfig(vocab_size=tok.vocab_size)
    assert specials.end_ids(cfg, tok) == {tok.eot_id}
    assert specials.prompt_ids(cfg, tok, "ka to") == tok.encode("ka to")
    assert specials.prompt_ids(cfg, tok, "") == [tok.eot_id]
    assert specials.document_start(cfg, tok) == tok.eot_id and specials.start_ids(cfg) == []


def test_a_llama_family_model_ends_on_any_eos_and_starts_with_its_begin_token(tok: BPETokenizer) -> None:
    cfg = ModelConfig(vocab_size=tok.vocab_size, bos_id=7, add_bos=True, eos_ids=(9, 3, 9))
    assert specials.end_ids(cfg, tok) == {3, 9}
    assert specials.prompt_ids(cfg, tok, "ka to") == [7, *tok.encode("ka to")]
    assert specials.prompt_ids(cfg, tok, "") == [7]
    assert specials.document_start(cfg, tok) == 7
    no_bos = ModelConfig(vocab_size=tok.vocab_size, bos_id=7, add_bos=False)  # Qwen's: a bos id, never added
    assert specials.prompt_ids(no_bos, tok, "ka") == tok.encode("ka") and specials.document_start(no_bos, tok) == 7
    assert specials.as_ends(5) == {5} and specials.as_ends([5, 6]) == {5, 6}
