"""The CPU platform: MPI ranks on host memory, numpy buffers; runs anywhere, CI included."""

from __future__ import annotations

import os

from .base import Platform


class CpuPlatform(Platform):
    name = "cpu"
    vendor = "any"
    compiler = "python"
    interconnect = "shared-memory"
    backend = "cpu"
    languages = ("python",)
    max_ranks = int(os.environ.get("COMMBENCH_CPU_MAX_RANKS", "16"))
