"""Client-side load on an OpenAI-compatible server: bench-serve's load generator and statistics, the soak."""
