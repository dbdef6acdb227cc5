"""Training: what the `tiny` preset reaches in a fixed wall time on the CPU, data-parallel ranks against one
process with the same global batch, and the classic GPT against the Llama family's choices at equal parameters
and equal minutes."""
