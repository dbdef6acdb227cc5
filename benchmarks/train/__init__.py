"""Training: what the `tiny` preset reaches in a fixed wall time on the CPU, and data-parallel ranks against one
process with the same global batch."""
