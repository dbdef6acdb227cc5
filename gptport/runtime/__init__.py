"""Inference without torch: onnxruntime sessions per provider, the static KV cache and the server's
slots, the generation loop, sampling, streaming detokenization, evaluation and the bench. Imports the
shared base only; a test imports every module here in a fresh interpreter and fails on torch."""
