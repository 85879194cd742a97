"""GPU batching (`--commbench-gpu-batch`) without a GPU: the staged protocol (inputs uploaded to
each rank's own buffers, outputs fetched after the call) driven by the real observer and rank
loop, the ranks being threads with a staged host backend (tests/unit/test_late_rank.py). A batch's
every call gets a buffer set of its own with its inputs uploaded just before it; every call is
checked; a call cannot reach a later call's inputs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from test_late_rank import ranks_in_threads

from pytest_commbench import checks
from pytest_commbench.observer import Observer, Settings, WrongAnswer


def _honest(ctx, x, out):
    out[...] = 2.0 * x + 1.0


def _peeker(leaks: list[int]):
    """An honest solution that looks ahead: in every call it copies the input buffer of every
    other set it knows; when a set's call comes, an input equal to a copy taken in an earlier
    call means the inputs were there before their call (a leak; `leaks` counts them)."""

    def make():
        known: dict[int, np.ndarray] = {}
        copies: dict[int, np.ndarray] = {}

        def solution(ctx, x, out):
            key = id(x)
            if key in copies and np.array_equal(copies[key], x):
                leaks.append(key)
            known[key] = x
            out[...] = 2.0 * x + 1.0
            for other, xs in known.items():
                if other != key:
                    copies[other] = xs.copy()

        return solution

    return make


def _judge(tmp_path: Path, solution, staged: bool = True, world: int = 2,
           count: int = 64) -> tuple[list[str], dict[str, int], int]:
    """Timed repetitions of one scale_shift case with batching on; returns the wrong answer's
    messages (none: a pass), the batch size per case and the number of timed repetitions."""
    rng = np.random.default_rng(5)
    op = checks.get("scale_shift")
    case = op.make_case(rng, "c0", count, "float32", world, {}, 2, 0)
    settings = Settings(reps=5, max_reps=5, timing_budget=0.0, warmup=2, wall_s=5.0,
                        rtol=0.0, atol=0.0)
    job_dir = tmp_path / f"job-{staged}-{world}-{id(solution)}"
    job_dir.mkdir()
    # batches of 8 calls, as an item's warm-up job would have chosen them (a machine under
    # load might time these calls above the batching threshold)
    obs = Observer(job_dir, world, op, settings, np.random.default_rng(6), staged=staged,
                   timed=True, batch=True, batches={"c0": 8})
    per_rank = getattr(solution, "per_rank", False)  # a solution per rank (its process)
    times: list = []
    with ranks_in_threads(obs, job_dir, case, staged,
                          lambda _rank: solution() if per_rank else solution):
        try:
            times = obs.run_case(case)
        except WrongAnswer as exc:
            return exc.errors, dict(obs.batches), len(times)
    return [], dict(obs.batches), len(times)


def test_a_staged_batch_runs_every_call_on_its_own_set_and_checks_it(tmp_path):
    errors, batches, reps = _judge(tmp_path, _honest)
    assert errors == []
    assert batches["c0"] == 8
    assert reps == 5


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "host"])
def test_no_call_of_a_batch_can_reach_a_later_calls_inputs(tmp_path, staged):
    """The later calls' inputs are not in the rank yet (host: still in the feed; staged: not
    yet uploaded to their set): a call that copies every other set's inputs never holds a
    later call's inputs before that call."""
    leaks: list[int] = []
    make = _peeker(leaks)
    make.per_rank = True  # a solution per rank, as each rank is a process of its own
    errors, batches, reps = _judge(tmp_path, make, staged=staged)
    assert errors == [] and batches["c0"] == 8 and reps == 5
    assert leaks == []


NATIVE = r"""
#include <stdint.h>
#include "commbench.h"
static const void* seen[64];
static int64_t param[64];
static int n = 0;
int commbench_run(const commbench_ctx* ctx) {
  if (n < 64) { seen[n] = ctx->peer_buffers[1 - ctx->rank][0]; param[n] = ctx->params[0]; ++n; }
  return 0;
}
int calls(void) { return n; }
const void* peer_seen(int i) { return seen[i]; }
int64_t param_seen(int i) { return param[i]; }
"""


class FakeWorld:
    """What NativeSolution needs of the rank's GPU world, with CUDA IPC replaced by numbers:
    rank r's pointer p is mapped in the other rank as p + 1000 * (opening)."""

    def __init__(self) -> None:
        self.rank, self.size, self.local_rank, self.device = 0, 2, 0, 0
        self.stream = SimpleNamespace(ptr=0)
        self.nccl_ptr, self.workspace, self.peer_workspace = None, None, []
        self.harness = SimpleNamespace()
        self.opened: list[int] = []
        self.exchanges = 0

    def exchange(self, ptrs: list[int]) -> list[list[int]]:
        self.exchanges += 1
        rows = []
        for p in ptrs:
            peer = p + 1000 * self.exchanges
            self.opened.append(peer)
            rows.append([p, peer])
        return rows

    def close(self, ptrs: list[int]) -> None:
        for p in ptrs:
            self.opened.remove(p)


def test_a_compiled_solution_keeps_a_context_and_peer_mappings_per_buffer_set(tmp_path):
    """Each call of a batch runs with its own set's buffers, its peers' mappings and its
    parameters; a new layout closes every mapping of the old one."""
    import shutil
    import subprocess

    from pytest_commbench.rank.gpu import NativeSolution

    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc")
    include = Path(__file__).resolve().parents[2] / "pytest_commbench" / "include"
    (tmp_path / "s.c").write_text(NATIVE)
    lib = tmp_path / "libs.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-I", str(include), "-o", str(lib),
                    str(tmp_path / "s.c")], check=True)
    world = FakeWorld()
    fn = NativeSolution(str(lib), world, ipc=True)
    sets = [SimpleNamespace(data=SimpleNamespace(ptr=base), nbytes=64) for base in (10, 20, 30)]
    fn.forget()
    states = []
    for j, buf in enumerate(sets):  # the batch's preparation, before the gate
        fn.prepare([buf], [100 + j], fresh=True)
        states.append(fn.current())
    assert world.exchanges == 3 and len(world.opened) == 3
    for state in states:  # the calls, back to back
        fn.use(state)
        fn()
    import ctypes

    probe = ctypes.CDLL(str(lib))
    probe.peer_seen.restype = ctypes.c_void_p
    probe.param_seen.restype = ctypes.c_int64
    assert probe.calls() == 3
    assert [probe.peer_seen(i) for i in range(3)] == [1010, 2020, 3030]
    assert [probe.param_seen(i) for i in range(3)] == [100, 101, 102]
    # the same sets again (no new layout): no exchange, the same contexts
    fn.prepare([sets[1]], [7], fresh=False)
    assert world.exchanges == 3 and fn.current()[0] is states[1][0]
    fn.forget()  # a new layout
    assert world.opened == [] and fn.ctxs == {}
