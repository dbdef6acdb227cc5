"""Training, on PyTorch: the GPT module, the token shards it reads, the train loop (one process or
torchrun), checkpoints, and the torch model as an engine (the reference ONNX is checked against).
Imports the shared base and the runtime below it; nothing in runtime or serve imports this."""
