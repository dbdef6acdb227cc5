"""Names of the files a model directory holds, each written down once (no torch here, so that the CLI
can check them). The graph files' names follow from their precision and cache: contract.onnx_file."""

from pathlib import Path

# train-tokenizer
TOKENIZER = "tokenizer.json"
TOKENIZER_META = "tokenizer_meta.json"  # sha256 of tokenizer.json, vocabulary size, special-token ids
GPT2_VOCAB, GPT2_MERGES = "vocab.json", "merges.txt"  # the same BPE in GPT-2's two-file format
HF_TOKENIZER_CONFIG = "tokenizer_config.json"  # what transformers' AutoTokenizer and onnxruntime-genai read
CHAT_TEMPLATE = "chat_template.jinja"  # an imported model's chat template, as transformers >= 4.43 saves it
CHAT_TEMPLATES_DIR = "additional_chat_templates"  # its named ones (tool_use.jinja, ...), as transformers 5 saves them

# train
DATA_DIR = "data"  # token shards, a cache keyed by the corpus and the tokenizer
DATA_META = "meta.json"  # in DATA_DIR
TRAIN_SHARD, VAL_SHARD = "train.bin", "val.bin"  # in DATA_DIR
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TRAINER = "trainer.json"
OPTIMIZER = "optimizer.safetensors"
LOG = str(Path("logs") / "train.jsonl")
TRAINED = (CONFIG, WEIGHTS, TRAINER, OPTIMIZER, LOG)  # what a training run writes besides its shards

# export, and what reads graphs
GENAI = "genai_config.json"  # lets onnxruntime-genai run the directory
REQUIRED_OPERATORS = "required_operators.config"  # export --ort-format: the operators a minimal build needs
DIGESTS = "digests.json"  # sha256 of large files keyed by size, mtime and inode (provenance.py's cache)
