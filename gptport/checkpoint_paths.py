"""Names of the files a trained model directory holds (no torch here, so the CLI can check them)."""

from pathlib import Path

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TRAINER = "trainer.json"
OPTIMIZER = "optimizer.safetensors"
DIGESTS = "digests.json"  # sha256 of large files keyed by size, mtime and inode (provenance.py's cache)
LOG = str(Path("logs") / "train.jsonl")
