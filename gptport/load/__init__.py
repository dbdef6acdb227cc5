"""Client-side load on an OpenAI-compatible server: bench-serve's load generator and statistics. (The soak
lives with its benchmark, benchmarks/harness/soak.py; the server child process with the tests,
tests/support/server_proc.py.)"""
