"""The per-rank driver: `python -m pytest_commbench.rank JOB.json` under mpiexec."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from .backends import make_backend

WARMUP_S = 0.02  # untimed calls before a case's timed repetitions, at least this long ...
MAX_WARMUP_CALLS = 200  # ... but no more calls than this
START_AHEAD_S = 200e-6  # how far ahead of now rank 0 sets a repetition's common start


class Status:
    """A small JSON file per rank that says how far the rank got (read after a crash)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"phase": "start", "pid": os.getpid()}

    def update(self, **fields: Any) -> None:
        self.data.update(fields)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)


class Context(SimpleNamespace):
    """What the solution is handed as its first argument.

    comm        an mpi4py communicator of all ranks, for the solution alone
    rank        this rank's index; world_size: number of ranks
    hostname    the host this rank is on (the harness may present virtual hosts)
    params      the task's scalar parameters (also passed by name where the entry asks)
    scratch     a directory the solution may write to
    """


def load_solution(path: str, entry: str):
    spec = importlib.util.spec_from_file_location("commbench_solution", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["commbench_solution"] = module
    spec.loader.exec_module(module)
    fn = getattr(module, entry, None)
    if not callable(fn):
        raise AttributeError(f"the solution defines no function {entry!r}")
    return fn


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    out = Path(job["out"])
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    status = Status(out / f"status_r{rank}.json")
    status.update(phase="start", rank=rank, world=size, harness=True)
    try:
        run(job, world, rank, size, status)
    except BaseException as exc:  # the solution's failure, reported for the controller to judge
        status.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        sys.stderr.write(f"[commbench rank {rank}] {status.data['phase']}: "
                         f"{traceback.format_exc()}")
        sys.stderr.flush()
        world.Abort(3)
        return 3
    return 0


def run(job: dict, world, rank: int, size: int, status: Status) -> None:
    backend = make_backend(job.get("backend", "cpu"))
    harness = world.Dup()  # the harness's own messages never mix with the solution's
    solution_comm = world.Dup()
    hostname = socket.gethostname()
    job["one_host"] = len(set(harness.allgather(hostname))) == 1
    scratch = Path(job["scratch"]) / f"r{rank}"
    scratch.mkdir(parents=True, exist_ok=True)
    extra: dict[str, Any] = {}
    gpu = None
    if backend.name == "cuda":
        from .gpu import GpuWorld, local_rank, pin_cpus

        pin_cpus(local_rank(world))

        status.update(phase="set up the GPU world")
        gpu = GpuWorld(job, world, harness, rank, size)
        extra = {"device": gpu.device, "local_rank": gpu.local_rank, "stream": gpu.stream,
                 "nccl": gpu.nccl}

    # from here on a failure may be the solution's (loading it runs its code)
    status.update(phase="load solution", harness=False)
    if job.get("language") == "cuda":
        from .gpu import NativeSolution

        fn = NativeSolution(job["solution"], gpu, "ipc" in job.get("fixtures", []))
    else:
        fn = load_solution(job["solution"], job["entry"])
    for case in job["cases"]:
        ctx = Context(comm=solution_comm, rank=rank, world_size=size, hostname=hostname,
                      params=case["params"], scratch=scratch, **extra)
        CaseRunner(job, case, fn, ctx, backend, harness, rank, status).run()
    harness.Barrier()
    status.update(phase="done", done=True)


class CaseRunner:
    """One size/dtype: correctness trials, then warm-up and timed repetitions."""

    def __init__(self, job, case, fn, ctx, backend, harness, rank, status) -> None:
        self.job, self.case, self.fn, self.ctx = job, case, fn, ctx
        self.backend, self.harness, self.rank, self.status = backend, harness, rank, status
        self.io = Path(job["io"]) / case["id"]
        self.out = Path(job["out"]) / case["id"]

    def buffers(self, trial: int) -> tuple[dict, dict]:
        spec = self.case["trials"][trial]
        folder = self.io / f"t{trial}" / f"r{self.rank}"
        b = self.backend
        inputs = {p.stem: b.from_host(np.load(p)) for p in sorted(folder.glob("*.npy"))}
        outputs = {name: b.empty(shape, dtype)
                   for name, (shape, dtype) in spec["outputs"][self.rank].items()}
        return inputs, outputs

    def bind(self, bufs: dict) -> None:
        """Resolve the call's arguments (outside any timed region); a compiled solution gets
        its C context filled here, peers' buffers mapped through CUDA IPC included."""
        params = self.case["params"]
        extra = {k: getattr(self.ctx, k) for k in self.case["args"] if hasattr(self.ctx, k)}
        self.args = [bufs[a] if a in bufs else extra[a] if a in extra else params[a]
                     for a in self.case["args"]]
        if hasattr(self.fn, "prepare"):
            self.fn.prepare([a for a in self.args if hasattr(a, "nbytes")],
                            [a for a in self.args if not hasattr(a, "nbytes")])

    def call(self) -> None:
        if hasattr(self.fn, "prepare"):
            self.fn()
        else:
            self.fn(self.ctx, *self.args)

    def save(self, folder: Path, outputs: dict) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for name, buf in outputs.items():
            np.save(folder / f"{name}.npy", self.backend.to_host(buf))

    def set_extra(self, trial: int) -> None:
        for key, value in self.case["trials"][trial]["extra"][self.rank].items():
            setattr(self.ctx, key, value)

    def run(self) -> None:
        events = self.trials()
        times = self.timing() if self.job["reps"] > 0 else []
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"events_r{self.rank}.json").write_text(
            json.dumps({"trials": events, "times": times}))

    def trials(self) -> list[dict]:
        """Correctness calls on fresh inputs, poisoned outputs, an optional delay before entry."""
        b, events = self.backend, []
        for t, spec in enumerate(self.case["trials"]):
            self.status.update(phase=f"case {self.case['id']} trial {t}")
            inputs, outputs = self.buffers(t)
            for buf in outputs.values():
                b.poison(buf)
            self.set_extra(t)
            self.bind({**inputs, **outputs})
            b.synchronize()
            self.harness.Barrier()
            time.sleep(spec["delays"][self.rank])
            t_enter = time.monotonic()
            self.call()
            b.synchronize()
            events.append({"t_enter": t_enter, "t_exit": time.monotonic()})
            # peers may write into this rank's outputs (CUDA IPC): read them only after every
            # rank's call has finished
            self.harness.Barrier()
            self.save(self.out / f"t{t}" / f"r{self.rank}", outputs)
        return events

    def timing(self) -> list[float]:
        """Warm-up, then repetitions that start together: at least job["reps"], more while the
        time budget lasts (rank 0 decides for all). Inputs named in `vary` shift every
        repetition; the chosen repetitions' outputs and the last one's are saved for checking.
        A repetition's time on a rank runs from the common start until this rank's device is
        idle; the controller takes the slowest rank's."""
        from mpi4py import MPI

        job, case, b, rank = self.job, self.case, self.backend, self.rank
        self.status.update(phase=f"case {case['id']} timing")
        if b.name == "cuda":
            from .gpu import keep_timing_thread_apart

            keep_timing_thread_apart()
        inputs, outputs = self.buffers(0)
        base = {name: b.copy(inputs[name]) for name in case["vary"]}
        self.set_extra(0)
        self.bind({**inputs, **outputs})
        self.warm_up()
        check_reps = set(job["check_reps"])
        max_reps = len(case["shifts"]) or job["max_reps"]
        times: list[float] = []
        spent, rep, more = 0.0, 0, True
        while more:
            for name in case["vary"]:
                b.shift(inputs[name], base[name], case["shifts"][rep][rank])
            for buf in outputs.values():
                b.poison(buf)
            b.synchronize()
            t0 = self.start_together()
            self.call()
            b.synchronize()
            times.append(b.clock() - t0)
            spent += times[-1]
            rep += 1
            more = rep < job["reps"] or (spent < job["budget_s"] and rep < max_reps)
            # rank 0 decides; the reduction is also a barrier, so no rank poisons or reads
            # outputs that a peer may still be writing
            more = bool(self.harness.allreduce(more if rank == 0 else True, op=MPI.LAND))
            if rep - 1 in check_reps or not more:
                self.save(self.out / f"rep{rep - 1}" / f"r{rank}", outputs)
        return times

    def warm_up(self) -> None:
        """job["warmup"] calls, then as many more as fill WARMUP_S (clocks, caches, lazy
        set-up of libraries): every rank makes the same number of calls."""
        from mpi4py import MPI

        b = self.backend
        b.synchronize()
        self.harness.Barrier()
        t0 = b.clock()
        for _ in range(self.job["warmup"]):
            self.call()
        b.synchronize()
        per_call = (b.clock() - t0) / max(self.job["warmup"], 1)
        per_call = self.harness.allreduce(per_call, op=MPI.MAX)
        extra = min(MAX_WARMUP_CALLS, int(WARMUP_S / per_call)) if per_call > 0 else 0
        for _ in range(extra if self.job["warmup"] > 0 else 0):
            self.call()
        b.synchronize()

    def start_together(self) -> float:
        """Align the ranks' start: after a barrier, on one host, every rank waits for a start
        time rank 0 sets a little ahead (the monotonic clock is the same for every process of
        a host), which is tighter than the skew of leaving a barrier; across hosts, the
        barrier alone."""
        clock = self.backend.clock
        # every rank is ready (its inputs shifted, outputs poisoned, device idle) before a
        # start is set: a rank still busy would otherwise start late and be charged for it
        self.harness.Barrier()
        if not self.job.get("one_host"):
            return clock()
        start = self.harness.bcast(clock() + START_AHEAD_S if self.rank == 0 else None, root=0)
        while clock() < start:
            os.sched_yield()  # free when the core has nothing else to run; kind when it has
        return start
