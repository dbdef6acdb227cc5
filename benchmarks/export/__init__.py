"""Export: what the exported artifacts give: the weight-quantization schemes (accuracy gate and speed), the
graphs on OpenVINO beside onnxruntime's CPU provider, and the web bundle in a browser beside transformers.js;
and what comes in: real GGUF files of llama.cpp's types through import-gguf, against transformers."""
