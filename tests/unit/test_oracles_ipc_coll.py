"""The oracles of the CUDA IPC memory-channel and collective tasks (memory_channel_put/get,
ipc_allgather_fullmesh, ipc_reduce_scatter, ipc_alltoall, custom_allreduce_bf16): the bf16
all-reduce's answer on a hand-checked case and its half-ulp bound, and every mutant's output,
simulated in numpy, rejected by the task's oracle."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from pytest_commbench import checks
from pytest_commbench.checks.base import Case
from pytest_commbench.checks.ipc_coll import bf16_inputs, exact_sum
from pytest_commbench.mutants import mutants
from pytest_commbench.tasks import load_task

REPO = Path(__file__).resolve().parents[2]
TASKS = {
    "p2p/memory_channel_put": "ring_exchange",
    "p2p/memory_channel_get": "ring_exchange",
    "collective/ipc_allgather_fullmesh": "allgather",
    "collective/ipc_reduce_scatter": "reduce_scatter",
    "collective/ipc_alltoall": "alltoall",
    "collective/custom_allreduce_bf16": "allreduce_bf16",
}
BF16 = np.dtype(ml_dtypes.bfloat16)
POISON16 = np.uint16(0xFFFF)  # what a uint16 output holds before every call (a bf16 NaN)


def _task(rel: str):
    return load_task(REPO / "suites" / rel / "task.toml", REPO / "suites")


def _case(op, count: int, world: int, dtype: str, seed: int = 5) -> Case:
    return op.make_case(np.random.default_rng(seed), "c0", count, dtype, world, {}, 2, 0)


def _good(op, case: Case, trial=None):
    trial = trial or case.trials[0]
    want = op.expected(trial, case.count, case.dtype, case.world, case.params)
    return [{k: np.array(v, dtype=trial.outputs[r][k][1]) for k, v in w.items()}
            for r, w in enumerate(want)]


def _rejected(op, case: Case, got, trial=None) -> list[str]:
    trial = trial or case.trials[0]
    events = [{"t_enter": 0.0, "t_exit": 1e-4} for _ in range(case.world)]
    return op.verify(trial, got, events, case, 0.0, 0.0)


@pytest.mark.parametrize("rel", sorted(TASKS))
def test_each_task_loads_with_its_oracle_and_three_mutants(rel):
    task = _task(rel)
    assert task.check.op == TASKS[rel]
    assert task.ranks == (2, 4, 8) and task.upstream.startswith("example")
    assert {"cuMulticast*", "dlopen", "dlsym", "nccl*", "cudaMemcpy*"} <= set(task.forbid)
    assert task.sizes[0] == 1 and any(c % 4 for c in task.sizes[1:])
    assert len(mutants(REPO / "references" / rel, task.suffix)) >= 3


# -- bf16 all-reduce ------------------------------------------------------------------------
def _bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).astype(BF16).view(np.uint16)


def _float32_sum(inputs: list[np.ndarray]) -> np.ndarray:
    """What an honest kernel computes: bf16 widened to float32, summed in rank order."""
    s = inputs[0].view(BF16).astype(np.float32)
    for x in inputs[1:]:
        s = s + x.view(BF16).astype(np.float32)
    return s


def _bf16_case(world: int, count: int = 1023, seed: int = 11):
    op = checks.get("allreduce_bf16")
    case = _case(op, count, world, "bfloat16", seed)
    return op, case, [named["sendbuf"] for named in case.trials[0].inputs]


def test_the_bf16_sum_of_a_hand_checked_case_is_rounded_once_to_nearest_even():
    op = checks.get("allreduce_bf16")
    case = _case(op, 4, 2, "bfloat16")
    trial = case.trials[0]
    # 1 + 2^-6 (exact in bf16), 1 + 2^-8 (a tie: to the even 1.0), 1 + 3 * 2^-9 (0.75 ulp
    # above 1.0: up to 1 + 2^-7), -2 + 0.5
    trial.inputs[0]["sendbuf"] = np.array([0x3F80, 0x3F80, 0x3F80, 0xC000], dtype=np.uint16)
    trial.inputs[1]["sendbuf"] = np.array([0x3C80, 0x3B80, 0x3BC0, 0x3F00], dtype=np.uint16)
    want = op.expected(trial, 4, "bfloat16", 2, {})
    assert [hex(v) for v in want[0]["recvbuf"]] == ["0x3f82", "0x3f80", "0x3f81", "0xbfc0"]
    good = [{"recvbuf": want[0]["recvbuf"].copy()} for _ in range(2)]
    assert _rejected(op, case, good, trial) == []
    # the tie: either neighbour is half an ulp away
    tie_up = [{"recvbuf": np.array([0x3F82, 0x3F81, 0x3F81, 0xBFC0], dtype=np.uint16)}] * 2
    assert _rejected(op, case, tie_up, trial) == []
    # cut toward zero: 1.0 for 1 + 3 * 2^-9 is 0.75 ulp off
    cut = [{"recvbuf": np.array([0x3F82, 0x3F80, 0x3F80, 0xBFC0], dtype=np.uint16)}] * 2
    errors = _rejected(op, case, cut, trial)
    assert len(errors) == 2 and "first at index 2" in errors[0] and "bits 0x3f80" in errors[0]


def test_the_inputs_make_every_float32_sum_exact_and_rounding_visible():
    x = bf16_inputs(np.random.default_rng(3), 1 << 16)
    mag = np.abs(x.view(BF16).astype(np.float64))
    assert mag.min() == 2.0 ** -6 and mag.max() < 16.0
    assert np.unique(x >> np.uint16(7) & np.uint16(0xFF)).size == 10  # ten binades
    assert (x >> np.uint16(15)).mean() == pytest.approx(0.5, abs=0.01)  # both signs
    inputs = [bf16_inputs(np.random.default_rng(s), 1 << 14) for s in range(8)]
    exact, _ = exact_sum(inputs)
    assert np.array_equal(_float32_sum(inputs).astype(np.float64), exact)  # no float32 rounding
    rounded = exact.astype(np.float32).astype(BF16).astype(np.float64)
    assert (rounded != exact).mean() > 0.8  # the bf16 sum is rounded on most elements


@pytest.mark.parametrize("world", [2, 4, 8])
def test_a_float32_sum_rounded_once_passes_in_any_order(world):
    op, case, inputs = _bf16_case(world)
    assert _rejected(op, case, _good(op, case)) == []
    forward = _bits(_float32_sum(inputs))
    backward = _bits(_float32_sum(inputs[::-1]))
    assert _rejected(op, case, [{"recvbuf": forward}] * world) == []
    assert _rejected(op, case, [{"recvbuf": backward}] * world) == []


@pytest.mark.parametrize("world", [2, 4, 8])
def test_mutant_truncate_to_bf16_is_rejected(world):
    op, case, inputs = _bf16_case(world)
    cut = (_float32_sum(inputs).view(np.uint32) >> 16).astype(np.uint16)
    errors = _rejected(op, case, [{"recvbuf": cut}] * world)
    assert len(errors) == world
    count = int(re.search(r"(\d+) of 1023 elements wrong", errors[0]).group(1))
    assert count > 200  # on a large share of the elements, not by luck


@pytest.mark.parametrize("world", [2, 4, 8])
def test_a_sum_carried_in_bf16_is_rejected_from_three_ranks_on(world):
    """Rounding after every addition: caught wherever there is more than one addition; with
    two ranks there is one, and it is the once-rounded answer (so no mutant of the task may
    rest on it: every mutant must fail at every world size)."""
    op, case, inputs = _bf16_case(world)
    acc = inputs[0].view(BF16)
    for x in inputs[1:]:
        acc = (acc.astype(np.float32) + x.view(BF16).astype(np.float32)).astype(BF16)
    narrow = [{"recvbuf": acc.view(np.uint16)}] * world
    if world == 2:
        assert np.array_equal(acc.view(np.uint16), _good(op, case)[0]["recvbuf"])
        assert _rejected(op, case, narrow) == []
    else:
        assert len(_rejected(op, case, narrow)) == world


@pytest.mark.parametrize("world", [2, 4, 8])
def test_mutant_oneshot_no_start_barrier_is_rejected(world):
    """A late rank's sendbuf read before its call began: the previous call's input."""
    op, case, _ = _bf16_case(world)
    late = world - 1
    before, now = case.trials
    stale = [named["sendbuf"] for named in now.inputs]
    stale[late] = before.inputs[late]["sendbuf"]
    got = [{"recvbuf": _bits(_float32_sum(stale))} for _ in range(world)]
    got[late] = _good(op, case, now)[late]  # the late rank itself read everything in time
    errors = _rejected(op, case, got, now)
    assert len(errors) == world - 1


@pytest.mark.parametrize("world", [2, 4, 8])
def test_mutants_slice_floor_and_a_dropped_tail_leave_poison(world):
    op, case, _ = _bf16_case(world, count=1048573)
    good = _good(op, case)[0]["recvbuf"]
    vecs = case.count // 8
    floor = good.copy()
    floor[vecs // world * world * 8:vecs * 8] = POISON16  # the vectors no slice owns
    tail = good.copy()
    tail[vecs * 8:] = POISON16
    for bits in (floor, tail):
        errors = _rejected(op, case, [{"recvbuf": bits}] * world)
        assert len(errors) == world and "poison" in errors[0]


def test_the_bf16_sizes_cover_both_kernels_and_slices_that_do_not_divide():
    task = _task("collective/custom_allreduce_bf16")
    ref = (REPO / "references" / task.relpath / "solution.cu").read_text()
    oneshot_max = int(re.search(r"ONESHOT_MAX = (\d+);", ref).group(1))
    small = [c for c in task.sizes if c <= oneshot_max]
    large = [c for c in task.sizes if c > oneshot_max]
    assert small and large and any(c % 8 for c in small) and all(c % 8 for c in large)
    for world in task.ranks:  # slice_floor must lose vectors at every world size
        assert all((c // 8) % world for c in large), world
    assert max(task.sizes) * 2 <= 64 << 20


def test_the_bf16_oracle_refuses_other_dtypes_and_counts_bytes_as_all_reduce():
    op = checks.get("allreduce_bf16")
    with pytest.raises(ValueError, match="bfloat16"):
        op.make_trial(np.random.default_rng(0), 4, "float32", 2, {})
    assert op.bytes(1000, "bfloat16", 4, {}) == (2000, 1.5)
    assert op.exact is False


# -- the other tasks' mutants against the data-movement and reduce-scatter oracles ----------
def _float_case(op_name: str, count: int, world: int):
    op = checks.get(op_name)
    return op, _case(op, count, world, "float32")


@pytest.mark.parametrize("world", [2, 4, 8])
def test_ring_mutants_are_rejected(world):
    """memory_channel_put/get: a late receiver's recvbuf poisoned after the early push
    (no_ready_wait, stale_semaphore of put), a late owner's previous message read (get's
    no_ready_wait, stale_semaphore), the count % 4 tail never moved (no_tail)."""
    op, case = _float_case("ring_exchange", 1023, world)
    before, now = case.trials
    good = _good(op, case, now)
    assert _rejected(op, case, good, now) == []
    late = 1 % world
    poisoned = [{k: v.copy() for k, v in r.items()} for r in good]
    poisoned[late]["recvbuf"][:] = np.nan
    stale = [{k: v.copy() for k, v in r.items()} for r in good]
    stale[(late + 1) % world]["recvbuf"] = before.inputs[late]["sendbuf"].copy()
    tail = [{k: v.copy() for k, v in r.items()} for r in good]
    for r in tail:
        r["recvbuf"][1020:] = np.nan
    for got in (poisoned, stale, tail):
        assert _rejected(op, case, got, now)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_allgather_mutants_are_rejected(world):
    """no_start_barrier / stale_epoch: a late rank's recvbuf poisoned but its own slot;
    no_head: the floats before a slot's first 16-byte boundary unwritten; receiver_slot:
    every rank's block at the receiver's slot."""
    count = 1023
    op, case = _float_case("allgather", count, world)
    good = _good(op, case)
    assert _rejected(op, case, good) == []
    late = world - 1
    poisoned = [{k: v.copy() for k, v in r.items()} for r in good]
    keep = poisoned[late]["recvbuf"][late * count:(late + 1) * count].copy()
    poisoned[late]["recvbuf"][:] = np.nan
    poisoned[late]["recvbuf"][late * count:(late + 1) * count] = keep
    head = [{k: v.copy() for k, v in r.items()} for r in good]
    for src in range(world):
        skip = (4 - src * count % 4) % 4
        for r in head:
            r["recvbuf"][src * count:src * count + skip] = np.nan
    slot = [{"recvbuf": np.full(count * world, np.nan, dtype=np.float32)} for _ in range(world)]
    for dst in range(world):
        slot[dst]["recvbuf"][dst * count:(dst + 1) * count] = \
            case.trials[0].inputs[world - 1]["sendbuf"]  # the last writer wins
    for got in (poisoned, head, slot):
        assert _rejected(op, case, got)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_reduce_scatter_mutants_are_rejected(world):
    """no_start_barrier: a late peer's previous input summed; block_offset_in_vectors: the
    block taken from rank * (count // 4 * 4); no_tail: the floats after the block's last
    16-byte boundary unwritten."""
    count = 1023
    op, case = _float_case("reduce_scatter", count, world)
    before, now = case.trials
    assert _rejected(op, case, _good(op, case, now), now) == []
    late = world - 1

    def summed(inputs, offset):
        total = np.zeros(count * world, dtype=np.float64)
        for x in inputs:
            total += x
        return [{"recvbuf": total[offset(r):offset(r) + count].astype(np.float32)}
                for r in range(world)]

    inputs = [named["sendbuf"] for named in now.inputs]
    stale = list(inputs)
    stale[late] = before.inputs[late]["sendbuf"]
    assert _rejected(op, case, summed(stale, lambda r: r * count), now)
    assert _rejected(op, case, summed(inputs, lambda r: r * (count // 4 * 4)), now)
    tail = summed(inputs, lambda r: r * count)
    for r, out in enumerate(tail):
        head = (4 - r * count % 4) % 4
        out["recvbuf"][head + (count - head) // 4 * 4:] = np.nan
    assert _rejected(op, case, tail, now)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_alltoall_mutants_are_rejected(world):
    """receiver_block_index: block `rank` stored at block j of rank j; no_ready_wait /
    stale_epoch: a late rank's recvbuf poisoned but its own block; no_head: the floats before
    a destination block's first 16-byte boundary unwritten."""
    count = 1023
    op, case = _float_case("alltoall", count, world)
    good = _good(op, case)
    assert _rejected(op, case, good) == []
    sends = [named["sendbuf"] for named in case.trials[0].inputs]
    swapped = [{"recvbuf": np.full(count * world, np.nan, dtype=np.float32)} for _ in range(world)]
    for j in range(world):  # slot j holds some peer i's block i (the last writer's)
        i = (j + 1) % world
        swapped[j]["recvbuf"][j * count:(j + 1) * count] = sends[i][i * count:(i + 1) * count]
    late = world - 1
    poisoned = [{k: v.copy() for k, v in r.items()} for r in good]
    keep = poisoned[late]["recvbuf"][late * count:(late + 1) * count].copy()
    poisoned[late]["recvbuf"][:] = np.nan
    poisoned[late]["recvbuf"][late * count:(late + 1) * count] = keep
    head = [{k: v.copy() for k, v in r.items()} for r in good]
    for r in head:
        for i in range(world):
            skip = (4 - i * count % 4) % 4
            r["recvbuf"][i * count:i * count + skip] = np.nan
    for got in (swapped, poisoned, head):
        assert _rejected(op, case, got)
