"""NVLink topology of the GPUs the ranks run on, as `nvidia-smi topo -m` reports it.

nvlink_matrix: every rank q writes `links`, int64 of shape (world,): links[r] is the number of
NVLinks joining rank q's GPU and rank r's GPU (0 for r == q, and 0 for GPUs joined by PCIe
only or not at all). The ranks run on one host, rank r on CUDA device r of the job (the
harness uses device = local rank).

The expected matrix comes from the controller, on the same host: `nvidia-smi topo -m` gives
an entry "NV<k>" (k links) or something else (no NVLink: 0) for every pair of GPUs in
nvidia-smi's numbering (PCI bus order); `nvidia-smi --query-gpu` and the controller's
CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER map the job's CUDA devices onto it. The GPU platform
leases the job some `world` of the controller's visible GPUs (in ascending order) without
telling the oracle which: when more GPUs are visible than the job has ranks, the oracle
accepts only a topology that is the same for every set the lease could pick (true of
NVSwitch boards, where every pair is NV18) and otherwise raises.

count is unused (sizes = [0]); there are no inputs. Without nvidia-smi, or when its output
cannot be parsed or mapped onto the job's GPUs, the oracle raises with the reason (the item
becomes an infrastructure error, never a pass).
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import shutil
import subprocess

import numpy as np

from .base import Op, Trial

SMI_TIMEOUT_S = 60
GPU_NAME = re.compile(r"^GPU(\d+)$")
NV_ENTRY = re.compile(r"^NV(\d+)$")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class TopologyError(RuntimeError):
    """The expected NVLink matrix cannot be known on this machine."""


def run_smi(args: list[str]) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise TopologyError(
            "nvlink_matrix: nvidia-smi is not on the controller's PATH, so the expected NVLink "
            "matrix cannot be known (the check needs `nvidia-smi topo -m` on the GPU host)")
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True,
                              timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TopologyError(f"nvlink_matrix: `nvidia-smi {' '.join(args)}` failed: {exc}") from None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip()[-500:]
        raise TopologyError(f"nvlink_matrix: `nvidia-smi {' '.join(args)}` exited with "
                            f"{done.returncode}: {why}")
    return done.stdout


def parse_topo(text: str) -> np.ndarray:
    """The (n, n) NVLink-count matrix of `nvidia-smi topo -m`, in nvidia-smi's GPU numbering."""
    lines = [ANSI.sub("", line).rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    # the column header starts with GPU0 and goes on with GPU1 (or CPU Affinity ...); the row
    # of GPU0 goes on with its own entry, X
    at = next((k for k, line in enumerate(lines)
               if line.split()[:1] == ["GPU0"] and line.split()[1:2] != ["X"]), None)
    if at is None:
        raise TopologyError(f"nvlink_matrix: no GPU column header in `nvidia-smi topo -m`:\n{text}")
    columns = []
    for token in lines[at].split():
        m = GPU_NAME.match(token)
        if not m:
            break
        columns.append(int(m.group(1)))
    n = len(columns)
    if columns != list(range(n)):
        raise TopologyError(f"nvlink_matrix: GPU columns {columns} of `nvidia-smi topo -m` "
                            f"are not GPU0..GPU{n - 1}")
    matrix = np.full((n, n), -1, dtype=np.int64)
    for line in lines[at + 1:]:
        tokens = line.split()
        m = GPU_NAME.match(tokens[0]) if tokens else None
        if not m:
            continue  # NIC rows, legends, blank lines
        i = int(m.group(1))
        if i >= n or len(tokens) < n + 1:
            raise TopologyError(f"nvlink_matrix: cannot read the row {line!r} of "
                                f"`nvidia-smi topo -m`")
        for j, entry in enumerate(tokens[1:n + 1]):
            if i == j:
                if entry != "X":
                    raise TopologyError(f"nvlink_matrix: GPU{i} against itself is {entry!r}, "
                                        f"expected 'X'")
                matrix[i, j] = 0
            else:
                nv = NV_ENTRY.match(entry)
                matrix[i, j] = int(nv.group(1)) if nv else 0
    missing = [i for i in range(n) if (matrix[i] < 0).any()]
    if missing:
        raise TopologyError(f"nvlink_matrix: `nvidia-smi topo -m` has no row for GPU{missing[0]}")
    return matrix


def parse_gpus(text: str) -> list[dict[str, str]]:
    """`nvidia-smi --query-gpu=index,name,uuid,pci.bus_id --format=csv,noheader` rows."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            raise TopologyError(f"nvlink_matrix: cannot read the nvidia-smi GPU line {line!r}")
        gpus.append({"index": int(parts[0]), "name": parts[1], "uuid": parts[2],
                     "bus": parts[3].lower()})
    gpus.sort(key=lambda g: g["index"])
    if [g["index"] for g in gpus] != list(range(len(gpus))):
        raise TopologyError("nvlink_matrix: nvidia-smi's GPU indices are not 0..n-1")
    return gpus


def cuda_order(gpus: list[dict[str, str]], visible: str | None, order: str | None) -> list[int]:
    """nvidia-smi index of each CUDA device the controller sees, in CUDA's numbering."""
    by_bus = sorted(range(len(gpus)), key=lambda i: gpus[i]["bus"])
    if (order or "FASTEST_FIRST").strip().upper() != "PCI_BUS_ID":
        # CUDA's default (FASTEST_FIRST) ties between equal GPUs go to PCI order; unequal GPUs
        # would need CUDA itself to know
        if len({g["name"] for g in gpus}) > 1:
            raise TopologyError("nvlink_matrix: the GPUs are not all alike and CUDA_DEVICE_ORDER is "
                                "not PCI_BUS_ID: CUDA's device order cannot be derived from nvidia-smi")
    if visible is None:
        return by_bus
    chosen: list[int] = []
    for raw in visible.split(","):
        item = raw.strip()
        if not item:
            continue
        if item.lstrip("-").isdigit():
            k = int(item)
            if not 0 <= k < len(by_bus):
                break  # CUDA ignores the list from an invalid entry on
            chosen.append(by_bus[k])
        elif item.startswith("GPU-"):
            hits = [i for i, g in enumerate(gpus) if g["uuid"].startswith(item)]
            if len(hits) != 1:
                raise TopologyError(f"nvlink_matrix: CUDA_VISIBLE_DEVICES entry {item!r} names "
                                    f"{len(hits)} GPUs")
            chosen.append(hits[0])
        else:
            raise TopologyError(f"nvlink_matrix: cannot map the CUDA_VISIBLE_DEVICES entry {item!r} "
                                f"(MIG devices are not supported) onto nvidia-smi's GPUs")
    if len(set(chosen)) != len(chosen):
        raise TopologyError(f"nvlink_matrix: CUDA_VISIBLE_DEVICES={visible!r} names a GPU twice")
    return chosen


def job_matrix(topo: np.ndarray, devices: list[int], world: int) -> np.ndarray:
    """The (world, world) matrix of the job: rank r runs on the r-th of the `world` devices the
    lease picks, in ascending order, among `devices` (the controller's CUDA devices as
    nvidia-smi indices). Raises when the answer depends on which ones it picks."""
    if len(devices) < world:
        raise TopologyError(f"nvlink_matrix: {world} ranks but the controller sees only "
                            f"{len(devices)} GPUs")
    found: dict[bytes, np.ndarray] = {}
    for subset in itertools.combinations(range(len(devices)), world):
        phys = [devices[k] for k in subset]
        m = topo[np.ix_(phys, phys)]
        found.setdefault(m.tobytes(), m)
        if len(found) > 1:
            raise TopologyError(
                f"nvlink_matrix: the NVLink matrix differs between the sets of {world} of the "
                f"{len(devices)} visible GPUs the job may be leased; make exactly {world} GPUs "
                f"visible (CUDA_VISIBLE_DEVICES) so the oracle knows which the ranks use")
    return next(iter(found.values())).copy()


@functools.lru_cache(maxsize=8)
def _expected(world: int, visible: str | None, order: str | None) -> tuple[tuple[int, ...], ...]:
    topo = parse_topo(run_smi(["topo", "-m"]))
    gpus = parse_gpus(run_smi(["--query-gpu=index,name,uuid,pci.bus_id",
                               "--format=csv,noheader"]))
    if len(gpus) != topo.shape[0]:
        raise TopologyError(f"nvlink_matrix: nvidia-smi lists {len(gpus)} GPUs but its topology "
                            f"matrix has {topo.shape[0]}")
    m = job_matrix(topo, cuda_order(gpus, visible, order), world)
    return tuple(tuple(int(x) for x in row) for row in m)


def expected_matrix(world: int) -> np.ndarray:
    """The job's (world, world) NVLink matrix on this host (raises TopologyError)."""
    rows = _expected(world, os.environ.get("CUDA_VISIBLE_DEVICES"),
                     os.environ.get("CUDA_DEVICE_ORDER"))
    return np.asarray(rows, dtype=np.int64)


class NvlinkMatrix(Op):
    name = "nvlink_matrix"
    exact = True

    def args(self, params):
        return ["links"]

    def make_trial(self, rng, count, dtype, world, params):
        expected_matrix(world)  # fail before the job runs when the answer cannot be known
        return Trial([{} for _ in range(world)],
                     [{"links": ((world,), "int64")} for _ in range(world)])

    def expected(self, trial, count, dtype, world, params):
        m = expected_matrix(world)
        return [{"links": m[r].copy()} for r in range(world)]

    def bytes(self, count, dtype, world, params):
        return 0, 1.0


OPS = {"nvlink_matrix": NvlinkMatrix()}
