"""Decode: one process generating, no HTTP: batch-1 decode and prefill per precision, against torch and against
llama.cpp on the same weights, where a step's time goes (operators, GEMM ceiling, cache reads), speculative
decoding and prompt lookup, and the cost of token masks and of a wide decode span."""
