"""Where buffers live. The CPU backend keeps them in host memory as numpy arrays."""

from __future__ import annotations

import time

import numpy as np

from .protocol import poison_value


class HostBackend:
    name = "cpu"
    staged = False  # the solution works on the data segment itself

    def empty(self, shape, dtype) -> np.ndarray:
        return np.empty(tuple(shape), dtype=np.dtype(dtype))

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return np.array(array, copy=True)

    def upload(self, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src)

    def to_host(self, buf: np.ndarray) -> np.ndarray:
        return np.array(buf, copy=True)

    def copy(self, buf: np.ndarray) -> np.ndarray:
        return np.array(buf, copy=True)

    def poison(self, buf: np.ndarray) -> None:
        buf.fill(poison_value(buf.dtype))

    def synchronize(self) -> None:
        """Wait for all outstanding work of this rank (host code is synchronous)."""

    def clock(self) -> float:
        return time.perf_counter()


def make_backend(name: str):
    if name == "cuda":
        from .gpu import CudaBackend  # imports cupy: only where there is a GPU

        return CudaBackend()
    return HostBackend()
