"""Serve: `gptport serve` under `gptport bench-serve`'s load against llama.cpp's `llama-server`: throughput and
latency per concurrency, each engine's best configuration, prefix caching, structured outputs, Ray replicas,
the in-process ceiling of batching and where the scheduler's time goes."""
