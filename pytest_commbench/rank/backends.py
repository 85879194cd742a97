"""Where buffers live. The CPU backend keeps them in host memory as numpy arrays; a device
backend (`gpu.DeviceBackend`, one per vendor of `protocol.DEVICE_VENDORS`) on the GPU."""

from __future__ import annotations

import time

import numpy as np

from .protocol import DEVICE_VENDORS, poison_value


class HostBackend:
    name = "cpu"
    device = False  # buffers in host memory; no GPU world to set up
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

    def uploaded(self) -> None:
        """Wait for the uploads (host copies are done when they return)."""

    def synchronize(self) -> None:
        """Wait for all outstanding work of this rank (host code is synchronous)."""

    def clock(self) -> float:
        return time.perf_counter()


def make_backend(name: str):
    if name in DEVICE_VENDORS:
        from .gpu import DeviceBackend  # imports cupy: only where there is a GPU

        return DeviceBackend(DEVICE_VENDORS[name])
    if name != "cpu":
        raise ValueError(f"no rank backend {name!r} (cpu, {', '.join(DEVICE_VENDORS)})")
    return HostBackend()
