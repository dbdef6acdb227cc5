"""Tokenizer: how fast `gptport train-tokenizer` trains a BPE against the bare `tokenizers` trainer."""
