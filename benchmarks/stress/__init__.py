"""Stress: `gptport serve` under overload (a flood: fast 429s, admitted latency, recovery), idle and slow
sockets, and a soak of 10,000 requests watching memory, descriptors and threads."""
