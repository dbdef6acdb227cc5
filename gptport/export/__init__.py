"""From a checkpoint to files other runtimes read: torch -> ONNX, the static-cache graph, quantized
variants and their accuracy gate, the parity checks against torch, and the onnxruntime-genai, Hugging
Face and GGUF writers. Sits above training and runtime: it checks the one against the other."""
