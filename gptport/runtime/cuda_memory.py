"""Memory that onnxruntime runs on, addressed by pointer: the static cache's buffers and a decode step's
inputs and logits, on the CUDA device or, with the same code, on the host. No torch here.

A graph is bound to any rows of a buffer by pointer and shape (IOBinding.bind_input / bind_output with
buffer_ptr), so a step over rows [lo, lo + n) of a (S, H, C, hd) buffer reads and writes those rows in
place wherever the buffer lives. What onnxruntime's Python API does not do, copies between parts of such
buffers and the copy of a few rows of logits to the host, is done here: by ctypes.memmove on the host,
by the CUDA runtime (cudaMemcpy, cudaMemcpy2D, cudaMemset) that onnxruntime's CUDA provider loaded.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from gptport.errors import ProviderError

HOST, CUDA = "cpu", "cuda"
_D2H, _D2D = 2, 3  # cudaMemcpyKind: cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice


class Memory:
    """Allocation and copies on the host: OrtValues over numpy arrays (which they keep alive)."""

    device = HOST
    device_id = 0

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> ort.OrtValue:
        """A zero-filled tensor that stays where it is for as long as it lives."""
        return ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, dtype=dtype))

    def copy_2d(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int) -> None:
        """`height` rows of `width` bytes from src to dst, each address `*_pitch` bytes after the last."""
        for r in range(height):
            ctypes.memmove(dst + r * dst_pitch, src + r * src_pitch, width)

    def read(self, src: int, out: np.ndarray) -> None:
        """out's bytes from `src` (out is contiguous host memory)."""
        ctypes.memmove(out.ctypes.data, src, out.nbytes)


class CudaMemory(Memory):
    """The same on a CUDA device, through the CUDA runtime library onnxruntime's provider loaded."""

    device = CUDA

    def __init__(self, device_id: int = 0) -> None:
        self.device_id = device_id
        self.cudart = _cudart()

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> ort.OrtValue:
        value = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), np.dtype(dtype).type, CUDA, self.device_id)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        self._check(self.cudart.cudaMemset(ctypes.c_void_p(value.data_ptr()), 0, ctypes.c_size_t(nbytes)),
                    "cudaMemset")  # never-written positions are read as zeros, never as NaN
        self._check(self.cudart.cudaDeviceSynchronize(), "cudaDeviceSynchronize")  # before onnxruntime reads it
        return value

    def copy_2d(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int) -> None:
        self._check(self.cudart.cudaMemcpy2D(ctypes.c_void_p(dst), ctypes.c_size_t(dst_pitch), ctypes.c_void_p(src),
                                             ctypes.c_size_t(src_pitch), ctypes.c_size_t(width),
                                             ctypes.c_size_t(height), _D2D), "cudaMemcpy2D")
        # a device-to-device copy returns before it is done: finished before onnxruntime's stream reads it
        self._check(self.cudart.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def read(self, src: int, out: np.ndarray) -> None:
        self._check(self.cudart.cudaMemcpy(ctypes.c_void_p(out.ctypes.data), ctypes.c_void_p(src),
                                           ctypes.c_size_t(out.nbytes), _D2H), "cudaMemcpy")

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            name = self.cudart.cudaGetErrorString(status)
            raise ProviderError(f"{what} failed on CUDA device {self.device_id}: {name.decode() if name else status}")


def _cudart() -> ctypes.CDLL:
    """The CUDA runtime library this process loaded (onnxruntime's CUDA provider links it), else the
    newest one the loader finds."""
    maps = Path("/proc/self/maps")
    loaded = sorted({line.split()[-1] for line in maps.read_text().splitlines() if "libcudart.so" in line}
                    ) if maps.is_file() else []
    names = [*loaded, "libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    if sys.platform == "win32":
        names = ["cudart64_13.dll", "cudart64_12.dll"]
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        return lib
    raise ProviderError("the CUDA runtime library (libcudart) is not loaded or found: install 'gptport[cuda]'")


def memory(device: str, device_id: int = 0) -> Memory:
    """The memory of `device` ("cpu" or "cuda")."""
    return CudaMemory(device_id) if device == CUDA else Memory()


def bind(binding: ort.IOBinding, name: str, mem: Memory, value: ort.OrtValue, shape: tuple[int, ...],
         dtype: np.dtype, offset: int = 0, output: bool = False) -> None:
    """Bind `shape` elements of `value`'s memory, from `offset` bytes on, as input (or output) `name`."""
    how = binding.bind_output if output else binding.bind_input
    how(name, mem.device, mem.device_id, np.dtype(dtype).type, list(shape), value.data_ptr() + offset)
