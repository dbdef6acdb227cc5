"""Serving: the OpenAI-compatible server and its load generator."""
