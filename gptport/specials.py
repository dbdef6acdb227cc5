"""A model's special tokens at inference, read once from its config and its tokenizer: the ids that end a
sequence and the begin token a prompt starts with. A GPT trained by gptport has neither a begin token nor
eos_ids: its prompts start bare (an empty one from <|endoftext|>) and it ends on <|endoftext|>, as before.
An imported Llama-family model ends on any of its eos_ids (generation_config.json's, config.json's and the
tokenizer's, as transformers' generate stops on any of them) and, where its tokenizer adds one
(add_bos), its prompts start with bos_id, as transformers' tokenizer(text) encodes them. No torch here.
"""

from __future__ import annotations

from collections.abc import Collection

from gptport.config import ModelConfig
from gptport.tokenizer import BPETokenizer


def end_ids(config: ModelConfig, tok: BPETokenizer) -> frozenset[int]:
    """The tokens that end a sequence: the config's eos_ids, else the tokenizer's end-of-text."""
    return frozenset(config.eos_ids or (tok.eot_id,))


def as_ends(ends: int | Collection[int]) -> frozenset[int]:
    """One end id or a set of them, as a set (what the generation loops take)."""
    return frozenset((ends,)) if isinstance(ends, int) else frozenset(ends)


def start_ids(config: ModelConfig) -> list[int]:
    """What every encoded prompt starts with: [bos_id] when the tokenizer adds it, else nothing."""
    return [config.bos_id] if config.add_bos and config.bos_id is not None else []


def prompt_ids(config: ModelConfig, tok: BPETokenizer, text: str) -> list[int]:
    """A text prompt's token ids as the model's tokenizer encodes a prompt: its begin token first where it
    adds one; an empty prompt is the begin token alone, or <|endoftext|> for a model without one."""
    ids = [*start_ids(config), *tok.encode(text)]
    return ids or [tok.eot_id]


def document_start(config: ModelConfig, tok: BPETokenizer) -> int:
    """The token a scored text follows, so that its first token is predicted too: the begin token where the
    model has one, else <|endoftext|> (lm-eval's prefix token for rolling log-likelihoods)."""
    return tok.eot_id if config.bos_id is None else config.bos_id
