"""Names of the files a trained model directory holds (no torch here, so the CLI can check them)."""

from pathlib import Path

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TRAINER = "trainer.json"
OPTIMIZER = "optimizer.safetensors"
LOG = str(Path("logs") / "train.jsonl")
