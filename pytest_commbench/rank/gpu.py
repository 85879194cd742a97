"""GPU side of a rank: device buffers (cupy), the world a solution asks for (a stream, an NCCL
(RCCL) communicator, an IPC-shared workspace), and the C ABI of compiled solutions. The vendor
(`protocol.DeviceVendor`) decides which runtime cupy must be built for, which library NCCL's API
comes from and whether ranks sharing a GPU are MPS clients; the rest is the same code, cupy's
runtime module being CUDA's or HIP's under the same names."""

from __future__ import annotations

import ctypes
import os
import socket
import time
from typing import Any

import numpy as np

from .protocol import DEVICE_VENDORS, ENV_RANK_CPUS, NATIVE_LANGUAGES, DeviceVendor, poison_value

MAX_RANKS, MAX_BUFFERS, MAX_PARAMS = 16, 8, 8  # as in include/commbench.h
# the host helpers carry set-up data (ids, handles, a few counts), never a task's payload
HOST_BYTES = 4096
HOST_REFUSED = 2  # their return value where they are not for this call


class DeviceBackend:
    """Buffers are cupy arrays over plain device allocations (cudaMalloc or hipMalloc, not the
    memory pool), so a buffer's IPC handle maps exactly that buffer in the peers."""

    device = True
    staged = True  # inputs and outputs are copied between the data segment and the device

    def __init__(self, vendor: DeviceVendor = DEVICE_VENDORS["cuda"]) -> None:
        import cupy

        built_for = "hip" if getattr(cupy.cuda.runtime, "is_hip", False) else "cuda"
        if built_for != vendor.runtime:
            raise RuntimeError(
                f"the {vendor.name} backend needs cupy built for {vendor.runtime.upper()}; the "
                f"cupy here is built for {built_for.upper()}"
                + (" (install cupy's ROCm build, a cupy-rocm-* package)"
                   if vendor.runtime == "hip" else ""))
        self.vendor, self.name, self.cp = vendor, vendor.name, cupy

    def empty(self, shape, dtype):
        cp = self.cp
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        mem = cp.cuda.memory.Memory(max(nbytes, 1))
        return cp.ndarray(tuple(shape), dtype, cp.cuda.MemoryPointer(mem, 0))

    def from_host(self, array: np.ndarray):
        buf = self.empty(array.shape, array.dtype)
        buf.set(np.ascontiguousarray(array))
        return buf

    def upload(self, dst, src: np.ndarray) -> None:
        dst.set(np.ascontiguousarray(src, dtype=dst.dtype))

    def to_host(self, buf) -> np.ndarray:
        return buf.get()

    def copy(self, buf):
        out = self.empty(buf.shape, buf.dtype)
        out[...] = buf
        return out

    def poison(self, buf) -> None:
        buf.fill(poison_value(buf.dtype))

    def uploaded(self) -> None:
        """Wait for the uploads (made on the null stream) only, not for the solution's work
        on its own streams: a batch's next call may begin while its last one still runs."""
        self.cp.cuda.Stream.null.synchronize()

    def synchronize(self) -> None:
        """Wait for the whole device, so work the solution put on any stream is counted."""
        self.cp.cuda.runtime.deviceSynchronize()

    def clock(self) -> float:
        return time.perf_counter()


# the stress phase's device hold: one thread that spins on the global timer for `ns`
# nanoseconds, loaded from PTX by the driver (no compiler in the rank)
HOLD_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry commbench_hold(.param .u64 ns)
{
  .reg .pred %p;
  .reg .b64 %rd<5>;
  ld.param.u64 %rd1, [ns];
  mov.u64 %rd2, %globaltimer;
WAIT:
  mov.u64 %rd3, %globaltimer;
  sub.u64 %rd4, %rd3, %rd2;
  setp.lt.u64 %p, %rd4, %rd1;
  @%p bra WAIT;
  ret;
}
\0"""


def device_hold(stream):
    """A function that makes `stream` wait `seconds` (a one-thread kernel launched on it), or
    None where the driver cannot load it (not an NVIDIA GPU: holds are then made on the
    host). Loaded and tried once here, before the solution is."""
    try:
        import cupy as cp

        module = cp.cuda.function.Module()
        module.load(HOLD_PTX)
        kernel = module.get_function("commbench_hold")

        def hold(seconds: float) -> None:
            kernel((1, 1, 1), (1, 1, 1), (np.uint64(max(0, int(seconds * 1e9))),),
                   stream=stream)

        hold(0.0)
        stream.synchronize()
    except Exception:  # noqa: BLE001 - no device hold here: the host holds instead
        return None
    hold.module = module  # kept alive with the function
    return hold


_PINNED: list[int] = []  # this rank's CPUs, the timing thread's first


def pin_cpus(local: int) -> None:
    """Run this rank on the CPUs the controller chose near its GPU (COMMBENCH_RANK_CPUS: one
    comma list per local rank, separated by ';'); threads started later inherit them."""
    plans = [p for p in os.environ.get(ENV_RANK_CPUS, "").split(";")]
    if local < len(plans) and plans[local]:
        try:
            cpus = [int(c) for c in plans[local].split(",")]
            os.sched_setaffinity(0, set(cpus))
            _PINNED[:] = cpus
        except (OSError, ValueError):
            pass  # a CPU set the container does not allow: run unpinned


def keep_timing_thread_apart() -> None:
    """Give the thread that times (this one) the rank's first CPU to itself and move every
    other thread of the process (NCCL's, NVSHMEM's, MPI's, the solution's) to the rest: a
    helper thread that wakes on the timing thread's CPU would delay a launch or the return
    from a synchronize, by an amount that depends on where the scheduler put the threads,
    i.e. differs from process to process. Called before each case's timing, so threads a
    solution started while being set up are moved as well."""
    import threading

    if len(_PINNED) < 2:
        return
    me = threading.get_native_id()
    try:
        os.sched_setaffinity(0, {_PINNED[0]})
    except OSError:
        return
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != me:
            try:
                os.sched_setaffinity(int(tid), set(_PINNED[1:]))
            except OSError:
                pass  # the thread has exited


def share_gpu(job, rank: int, size: int, local: int, vendor: DeviceVendor) -> None:
    """Shared placement, before any CUDA context or NCCL exists in this process:
    - NCCL refuses two ranks of one communicator on one GPU, unless each rank is a host of
      its own (they then meet over the network transport, sockets on loopback);
    - each rank on a GPU is an MPS client with an equal share of its SMs (the shares add up
      to at most 100%: NVSHMEM's full multi-process mode needs that), so a kernel that waits
      for a peer's kernel never waits for SMs that kernel holds."""
    per_gpu = int(job.ranks_per_gpu or 1)
    if per_gpu <= 1:
        return

    os.environ["NCCL_HOSTID"] = f"{socket.gethostname()}-rank{rank}"
    first = local // per_gpu * per_gpu
    here = max(1, min(per_gpu, size - first))  # ranks on this rank's GPU
    if here > 1 and vendor.mps:
        os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(100 // here)


def local_rank(world) -> int:
    for var in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"):
        if var in os.environ:
            return int(os.environ[var])
    from mpi4py import MPI

    return world.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def nccl_library(folder: str | None, soname: str = "libnccl.so.2") -> ctypes.CDLL:
    """The NCCL (RCCL: `soname`) the solution links (same soname, so one instance in the
    process); the controller names its folder in the job file."""
    path = os.path.join(folder, soname) if folder else soname
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


class GpuWorld:
    """What every call on this rank shares: device, stream, NCCL communicator, workspace."""

    def __init__(self, job, world, harness, rank: int, size: int, backend: DeviceBackend) -> None:
        cp = backend.cp
        self.cp, self.harness, self.rank, self.size = cp, harness, rank, size
        self.spans_nodes = bool(job.spans_nodes)
        self.local_rank = local_rank(world)
        ndev = cp.cuda.runtime.getDeviceCount()
        # shared placement: local ranks r*N .. r*N+N-1 on the r-th GPU the job was given
        per_gpu = max(1, int(job.ranks_per_gpu or 1))
        self.device = (self.local_rank // per_gpu) % ndev
        cp.cuda.Device(self.device).use()
        self.stream = cp.cuda.Stream(non_blocking=True)
        fixtures = set(job.fixtures)
        self.nccl_ptr = None
        self.nccl = None
        if "nccl" in fixtures:
            if job.language in NATIVE_LANGUAGES:
                self.nccl_ptr = self._nccl_comm_c(job.nccl_lib, backend.vendor.collectives)
            else:
                from cupy.cuda import nccl

                uid = nccl.get_unique_id() if rank == 0 else None
                uid = harness.bcast(uid, root=0)
                self.nccl = nccl.NcclCommunicator(size, uid, rank)
        self.torch = None
        if "torch" in fixtures:
            self.torch = TorchWorld(self, harness)
        self.workspace = None
        self.peer_workspace: list[int] = []
        self.opened: list[int] = []
        nbytes = int(job.workspace_bytes or 0)
        if nbytes:
            self.workspace = backend.empty((nbytes,), np.uint8)
            self.workspace.fill(0)
            cp.cuda.runtime.deviceSynchronize()
            self.peer_workspace = self.exchange([self.workspace.data.ptr])[0]

    def _nccl_comm_c(self, folder: str | None, soname: str) -> int:
        lib = nccl_library(folder, soname)
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                         NcclUniqueId, ctypes.c_int]
        uid = NcclUniqueId()
        if self.rank == 0:
            rc = lib.ncclGetUniqueId(ctypes.byref(uid))
            if rc != 0:
                raise RuntimeError(f"ncclGetUniqueId failed ({rc})")
        # the id is binary: copy all 128 bytes (c_char arrays stop at the first NUL)
        raw = self.harness.bcast(ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid))
                                 if self.rank == 0 else None, root=0)
        ctypes.memmove(ctypes.addressof(uid), raw, 128)
        comm = ctypes.c_void_p()
        rc = lib.ncclCommInitRank(ctypes.byref(comm), self.size, uid, self.rank)
        if rc != 0:
            raise RuntimeError(f"ncclCommInitRank failed ({rc})")
        return int(comm.value)

    def exchange(self, ptrs: list[int]) -> list[list[int]]:
        """Map every rank's allocations through IPC (CUDA's or HIP's): result[i][r] is rank
        r's i-th pointer as seen here (our own pointers as they are)."""
        rt = self.cp.cuda.runtime
        handles = [rt.ipcGetMemHandle(p) for p in ptrs]
        every = self.harness.allgather(handles)
        mapped = []
        for i, own in enumerate(ptrs):
            row = []
            for r in range(self.size):
                if r == self.rank:
                    row.append(own)
                else:
                    ptr = rt.ipcOpenMemHandle(every[r][i], 1)  # lazy peer access
                    self.opened.append(ptr)
                    row.append(ptr)
            mapped.append(row)
        return mapped

    def close(self, ptrs: list[int]) -> None:
        rt = self.cp.cuda.runtime
        for p in ptrs:
            rt.ipcCloseMemHandle(p)
            self.opened.remove(p)


class TorchWorld:
    """torch.distributed over NCCL for the torch tasks: the default process group of all ranks
    (one communicator, created and connected here, before the solution is loaded), the
    harness's stream as a torch stream, and the harness's buffers as torch tensors (the same
    device memory, no copy)."""

    def __init__(self, world: GpuWorld, harness) -> None:
        import datetime

        import torch
        import torch.distributed as dist

        self.torch = torch
        device = torch.device("cuda", world.device)
        torch.cuda.set_device(device)
        # the rendezvous: rank 0's TCP store on a free port, its address sent over MPI (the
        # store must not wait for its clients here: they learn the port only from the bcast)
        # (ranks on other nodes reach it at rank 0's host name, one node's ranks on loopback)
        host = socket.gethostname() if world.spans_nodes else "127.0.0.1"
        store = None
        if world.rank == 0:
            store = dist.TCPStore(host, 0, world.size, is_master=True,
                                  timeout=datetime.timedelta(seconds=120),
                                  wait_for_workers=False)
        host, port = harness.bcast((host, store.port) if store is not None else None, root=0)
        if store is None:
            store = dist.TCPStore(host, port, world.size, is_master=False,
                                  timeout=datetime.timedelta(seconds=120))
        dist.init_process_group("nccl", store=store, rank=world.rank, world_size=world.size,
                                device_id=device)
        self.store = store  # rank 0 serves it for as long as the group lives
        self.group = dist.group.WORLD
        self.stream = torch.cuda.ExternalStream(world.stream.ptr, device=device)
        # connect now (NCCL's communicator is made at the first collective otherwise, inside
        # the solution's first call, where its time and any failure would be the solution's)
        probe = torch.ones(1, device=device)
        dist.all_reduce(probe, group=self.group)
        torch.cuda.synchronize(device)
        if int(probe.item()) != world.size:
            raise RuntimeError("torch.distributed's first all-reduce gave a wrong sum")

    def tensor(self, buf):
        """A cupy buffer as a torch tensor over the same memory."""
        return self.torch.as_tensor(buf, device=self.torch.device("cuda", buf.device.id))


class CommbenchCtx(ctypes.Structure):
    _fields_ = [
        ("rank", ctypes.c_int), ("world_size", ctypes.c_int), ("local_rank", ctypes.c_int),
        ("device", ctypes.c_int), ("stream", ctypes.c_void_p), ("nccl_comm", ctypes.c_void_p),
        ("num_buffers", ctypes.c_int),
        ("buffers", ctypes.c_void_p * MAX_BUFFERS),
        ("buffer_bytes", ctypes.c_size_t * MAX_BUFFERS),
        ("peer_buffers", (ctypes.c_void_p * MAX_BUFFERS) * MAX_RANKS),
        ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t),
        ("peer_workspace", ctypes.c_void_p * MAX_RANKS),
        ("num_params", ctypes.c_int), ("params", ctypes.c_int64 * MAX_PARAMS),
        ("host", ctypes.c_void_p),
        ("allgather", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                       ctypes.c_size_t, ctypes.c_void_p)),
        ("broadcast", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                       ctypes.c_size_t, ctypes.c_int)),
        ("barrier", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)),
    ]


class NativeSolution:
    """A compiled solution behind the C ABI of include/commbench.h."""

    def __init__(self, path: str, world: GpuWorld, ipc: bool, every_call: bool = False) -> None:
        self.world, self.ipc = world, ipc
        # the host helpers are for set-up: they work in a call whose buffers are new (the
        # first of a case, where every rank maps its peers) and, for tasks whose contract is
        # host data ("host-exchange"), in every call; never for more than HOST_BYTES a rank
        self.every_call = every_call
        self.host_ok = True
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        self.run = self.lib.commbench_run
        self.run.argtypes = [ctypes.POINTER(CommbenchCtx)]
        self.run.restype = ctypes.c_int
        self.mapped: list[int] = []  # every peer pointer this rank opened (closed by forget)
        self.ctxs: dict[tuple, CommbenchCtx] = {}  # per buffer set of the current layout
        self._callbacks()
        self.ctx = self._new_ctx()

    def _callbacks(self) -> None:
        h = self.world.harness
        fields = dict(CommbenchCtx._fields_)

        def allgather(_host, send, nbytes, recv):
            if not self.host_ok or nbytes > HOST_BYTES:
                return HOST_REFUSED
            try:
                data = ctypes.string_at(send, nbytes)
                parts = h.allgather(data)
                ctypes.memmove(recv, b"".join(parts), nbytes * len(parts))
                return 0
            except Exception:  # noqa: BLE001 - an error code, never an exception into C
                return 1

        def broadcast(_host, buf, nbytes, root):
            if not self.host_ok or nbytes > HOST_BYTES:
                return HOST_REFUSED
            try:
                data = h.bcast(ctypes.string_at(buf, nbytes) if h.Get_rank() == root else None,
                               root=root)
                ctypes.memmove(buf, data, nbytes)
                return 0
            except Exception:  # noqa: BLE001
                return 1

        def barrier(_host):
            if not self.host_ok:
                return HOST_REFUSED
            try:
                h.Barrier()
                return 0
            except Exception:  # noqa: BLE001
                return 1

        # keep references: ctypes callbacks die with their Python objects
        self._cbs = (fields["allgather"](allgather), fields["broadcast"](broadcast),
                     fields["barrier"](barrier))

    def forget(self) -> None:
        """A new layout (every rank at the same call): the contexts of the old buffers and
        their peers' mappings go."""
        if self.mapped:
            self.world.close(self.mapped)
            self.mapped = []
        self.ctxs.clear()

    def _new_ctx(self) -> CommbenchCtx:
        w, c = self.world, CommbenchCtx()
        c.rank, c.world_size, c.local_rank, c.device = w.rank, w.size, w.local_rank, w.device
        c.stream = w.stream.ptr
        c.nccl_comm = w.nccl_ptr
        c.allgather, c.broadcast, c.barrier = self._cbs
        if w.workspace is not None:
            c.workspace = w.workspace.data.ptr
            c.workspace_bytes = w.workspace.nbytes
            for r, p in enumerate(w.peer_workspace):
                c.peer_workspace[r] = p
        return c

    def prepare(self, buffers: list[Any], params: list[int], fresh: bool = True) -> None:
        """Fill the context for these buffers: one context per buffer set, kept while the
        layout lasts (a batch of calls has a set, and a context, per call). `fresh`: the
        harness allocated them in this call, which every rank does at the same call (a new
        layout or a new case, after `forget`): then, and only then, the peers' buffers are
        mapped through CUDA IPC, a collective (a collective on every call would deadlock
        with a late rank, prepared only at its gate while the others wait in their
        preparation)."""
        w = self.world
        if len(buffers) > MAX_BUFFERS or len(params) > MAX_PARAMS:
            raise ValueError("too many buffers or parameters for the C ABI")
        ptrs = tuple(b.data.ptr for b in buffers)
        c = self.ctxs.get(ptrs)
        if c is None:
            c = self._new_ctx()
            c.num_buffers = len(buffers)
            for i, b in enumerate(buffers):
                c.buffers[i] = ptrs[i]
                c.buffer_bytes[i] = b.nbytes
            if self.ipc and fresh:
                mapped = w.exchange(list(ptrs))
                self.mapped += [p for row in mapped for r, p in enumerate(row) if r != w.rank]
                for i, row in enumerate(mapped):
                    for r, p in enumerate(row):
                        c.peer_buffers[r][i] = p
            self.ctxs[ptrs] = c
        c.num_params = len(params)
        for i, p in enumerate(params):
            c.params[i] = int(p)
        self.ctx = c
        self.host_ok = fresh or self.every_call

    def current(self) -> tuple[CommbenchCtx, bool]:
        """The context `prepare` filled last (a batch keeps one per call, see `use`)."""
        return self.ctx, self.host_ok

    def use(self, state: tuple[CommbenchCtx, bool]) -> None:
        self.ctx, self.host_ok = state

    def __call__(self) -> None:
        rc = self.run(ctypes.byref(self.ctx))
        if rc != 0:
            raise RuntimeError(f"commbench_run returned {rc}")
