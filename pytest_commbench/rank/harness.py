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

from .backends import BACKENDS


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
    status.update(phase="start", rank=rank, world=size)
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
    backend = BACKENDS[job.get("backend", "cpu")]()
    io, out = Path(job["io"]), Path(job["out"])
    harness = world.Dup()  # the harness's own messages never mix with the solution's
    solution_comm = world.Dup()
    scratch = Path(job["scratch"]) / f"r{rank}"
    scratch.mkdir(parents=True, exist_ok=True)

    status.update(phase="import solution")
    fn = load_solution(job["solution"], job["entry"])
    hostname = socket.gethostname()

    for case in job["cases"]:
        cid = case["id"]
        params = case["params"]
        ctx = Context(comm=solution_comm, rank=rank, world_size=size, hostname=hostname,
                      params=params, scratch=scratch)

        def build(trial: int) -> tuple[dict, dict]:
            spec = case["trials"][trial]
            folder = io / cid / f"t{trial}" / f"r{rank}"
            inputs = {p.stem: backend.from_host(np.load(p)) for p in sorted(folder.glob("*.npy"))}
            outputs = {name: backend.empty(shape, dtype)
                       for name, (shape, dtype) in spec["outputs"][rank].items()}
            return inputs, outputs

        def call(bufs: dict) -> None:
            args = [bufs[a] if a in bufs else params[a] for a in case["args"]]
            fn(ctx, *args)

        def save(folder: Path, outputs: dict) -> None:
            folder.mkdir(parents=True, exist_ok=True)
            for name, buf in outputs.items():
                np.save(folder / f"{name}.npy", backend.to_host(buf))

        events = []
        # 1. correctness trials: fresh inputs, poisoned outputs, optional delay before entry
        for t, spec in enumerate(case["trials"]):
            status.update(phase=f"case {cid} trial {t}")
            inputs, outputs = build(t)
            for buf in outputs.values():
                backend.poison(buf)
            for key, value in spec["extra"][rank].items():
                setattr(ctx, key, value)
            backend.synchronize()
            harness.Barrier()
            time.sleep(spec["delays"][rank])
            t_enter = time.monotonic()
            call({**inputs, **outputs})
            backend.synchronize()
            t_exit = time.monotonic()
            events.append({"t_enter": t_enter, "t_exit": t_exit})
            save(out / cid / f"t{t}" / f"r{rank}", outputs)
            harness.Barrier()

        # 2. timing: warm-up, then barrier-aligned repetitions; some repetitions' results saved
        times: list[float] = []
        if job["reps"] > 0:  # at least job["reps"] repetitions, more while the budget lasts
            status.update(phase=f"case {cid} timing")
            inputs, outputs = build(0)
            base = {name: backend.to_host(inputs[name]) for name in case["vary"]}
            for key, value in case["trials"][0]["extra"][rank].items():
                setattr(ctx, key, value)
            for _ in range(job["warmup"]):
                call({**inputs, **outputs})
            backend.synchronize()
            check_reps = set(job["check_reps"])
            budget, max_reps = job["budget_s"], len(case["shifts"]) or job["max_reps"]
            spent, rep = 0.0, 0
            while True:
                for name in case["vary"]:
                    shift = np.asarray(case["shifts"][rep][rank], dtype=base[name].dtype)
                    backend.copy_into(inputs[name], backend.from_host(base[name] + shift))
                for buf in outputs.values():
                    backend.poison(buf)
                backend.synchronize()
                harness.Barrier()
                t0 = backend.clock()
                call({**inputs, **outputs})
                backend.synchronize()
                times.append(backend.clock() - t0)
                spent += times[-1]
                rep += 1
                # rank 0 decides for all: at least `reps`, then until the time budget is spent
                more = rep < job["reps"] or (spent < budget and rep < max_reps)
                more = harness.bcast(more, root=0)
                if rep - 1 in check_reps or not more:
                    save(out / cid / f"rep{rep - 1}" / f"r{rank}", outputs)
                if not more:
                    break
        (out / cid).mkdir(parents=True, exist_ok=True)
        (out / cid / f"events_r{rank}.json").write_text(json.dumps({"trials": events, "times": times}))

    harness.Barrier()
    status.update(phase="done", done=True)
