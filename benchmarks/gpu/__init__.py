"""GPU: the CUDA and TensorRT providers against torch and the CPU: parity, greedy text, speed and serving."""
