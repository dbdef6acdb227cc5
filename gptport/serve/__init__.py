"""Serving: the OpenAI-compatible HTTP server over the batching engine (engine/), and on Ray Serve (ray/)."""
