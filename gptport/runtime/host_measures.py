"""What bench measures of the host and the graph besides the model's speed: the memory's read bandwidth,
the weight bytes one decode step reads, and this process's peak resident memory. No torch here."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np


def measure_bandwidth(threads: int = 0, mib: int = 1024, tries: int = 5) -> float:
    """Memory read bandwidth in bytes/s: `threads` threads each reducing a disjoint part of a buffer
    far larger than the caches (numpy releases the GIL in reductions), with four reductions (float32
    sum and max, uint64 bitwise or, BLAS dot: the first is compute-bound on some CPUs); the best of
    `tries` runs of the fastest. The weights a decode step reads stream through the same memory."""
    n_threads = threads or os.cpu_count() or 1
    buf = np.ones(mib * (1 << 20) // 4, dtype=np.float32)
    parts = np.array_split(buf, n_threads)
    kernels: list[Callable[[np.ndarray], object]] = [  # parts are 8-byte multiples
        np.sum, np.max, lambda p: np.bitwise_or.reduce(p.view(np.uint64)), lambda p: np.dot(p, p)]
    best = float("inf")
    for kernel in kernels:
        for _ in range(tries):
            workers = [threading.Thread(target=kernel, args=(p,)) for p in parts]
            t0 = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            best = min(best, time.perf_counter() - t0)
    return buf.nbytes / best


def weight_bytes_per_token(path: Path) -> int:
    """Bytes of weights one decode step reads: every initializer except those only gathered from
    (the token and position tables, of which a step reads one row)."""
    import onnx

    proto = onnx.load_model(str(path), load_external_data=False)
    consumers: dict[str, set[str]] = {}
    for node in proto.graph.node:
        for name in node.input:
            consumers.setdefault(name, set()).add(node.op_type)
    total = 0
    for init in proto.graph.initializer:
        ops = consumers.get(init.name, set())
        if ops and ops <= {"Gather", "GatherBlockQuantized"}:
            continue
        size = next((int(e.value) for e in init.external_data if e.key == "length"), None)
        total += size if size is not None else len(init.raw_data) or onnx.numpy_helper.to_array(init).nbytes
    return total


def peak_rss_reset() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux), so each row reports its own peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb(status: str = "/proc/self/status") -> float | None:
    """This process's peak resident memory in MB (MiB): Linux's VmHWM (which peak_rss_reset can
    reset), else getrusage's ru_maxrss (macOS, the BSDs); None where neither exists (Windows)."""
    try:
        with open(status) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    try:
        import resource
    except ImportError:
        return None
    return maxrss_mb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def maxrss_mb(ru_maxrss: int) -> float:
    """getrusage's ru_maxrss in MB (MiB): it counts bytes on macOS, KiB on Linux and the BSDs."""
    return ru_maxrss / (1 << 20) if sys.platform == "darwin" else ru_maxrss / 1024
