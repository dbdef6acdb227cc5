"""What the benchmarks share: the models they measure (models), the rounds and their machine probe (run,
probe), the results layout and its writer (results), the servers and loads of the serving benchmarks
(servers, loads), onnxruntime's profiles summarised (ort_profile), the common options (cli)."""
