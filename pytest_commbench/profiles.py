"""The platforms the benchmark knows, by name: the CPU and the GPU machines' profiles.

Plain data, on a floor of its own: the task manifest (`tasks`) checks a task's `platforms` and
`vendors` against it, and `platforms/` (which builds and runs tasks, so imports `tasks`) turns
a profile into a platform.
"""

from __future__ import annotations

from dataclasses import dataclass

# the feature of a task whose contract needs every rank on a GPU of its own (device topology,
# peer access between devices): shared placement lacks it
DISTINCT = "distinct-gpus"


@dataclass(frozen=True)
class GpuProfile:
    name: str
    vendor: str
    arch: str
    compiler: str
    gpus_per_node: int
    interconnect: str
    model: str  # substring of the GPU's marketing name that identifies it
    features: frozenset[str]
    # the languages its tasks are written in (what the platform builds), and whether
    # --platform=auto may pick it on a machine with its GPUs
    languages: tuple[str, ...] = ("cuda", "python")
    detected: bool = True


PROFILES = {
    "h200": GpuProfile("h200", "nvidia", "sm_90", "nvcc", 8, "nvlink", "H200",
                       frozenset({"nvlink", "sm_90", "nccl", "nccl-device", "nvshmem", "cuda-ipc",
                                  "cupy", "nvml", DISTINCT})),
    "b300": GpuProfile("b300", "nvidia", "sm_103a", "nvcc", 8, "nvlink", "B300",
                       frozenset({"nvlink", "sm_100", "nccl", "nccl-device", "nvshmem",
                                  "cuda-ipc", "cupy", "nvml", DISTINCT})),
    "gh200": GpuProfile("gh200", "nvidia", "sm_90", "nvcc", 1, "nvlink-c2c", "GH200",
                        frozenset({"sm_90", "nccl", "nvshmem", "cupy", DISTINCT})),
    "mi325x": GpuProfile("mi325x", "amd", "gfx942", "hipcc", 8, "xgmi", "MI325X",
                         frozenset({"xgmi", "rccl", "hip-ipc", "hip-fine-grained"}),
                         languages=("hip",)),
    # HIP tasks on an H200 through the project's HIP->CUDA header (include/hip_on_cuda): a
    # check of their host logic and kernels' results, never an AMD result (no wave64, no AMD
    # atomic scopes or fine-grained memory, no xGMI); only where asked for by name
    "h200-hip": GpuProfile("h200-hip", "nvidia", "sm_90", "nvcc", 8, "nvlink", "H200",
                           frozenset({"hip-ipc", "rccl", DISTINCT}), languages=("hip",),
                           detected=False),
}

NAMES = ("cpu", *PROFILES)
