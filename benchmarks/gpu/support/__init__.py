"""What benchmarks/gpu/ scripts share: onnxruntime-gpu carried to the GPU machine, the torch baseline."""
