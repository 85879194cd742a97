"""The oracles of the NCCL and IPC group of tasks (halo exchange, all-reduce within split
groups, the produce/consume ring, and the all-to-all, reduce-scatter and ring exchange those
tasks reuse): hand-checked expected outputs, and `verify` rejecting each way the tasks'
mutants are wrong, their outputs simulated in numpy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from oracle_kit import as_got as _as_got
from oracle_kit import case_of as _case
from oracle_kit import task_of as _task
from oracle_kit import verify as _verify
from oracle_kit import want as _want

from pytest_commbench import checks
from pytest_commbench.checks.base import Trial
from pytest_commbench.checks.nccl_suite import split_groups

REPO = Path(__file__).resolve().parents[2]
TASKS = {
    "collective/nccl_grouped_alltoall": "alltoall",
    "collective/nccl_registered_reduce_scatter": "reduce_scatter",
    "p2p/nccl_halo_exchange": "halo_exchange",
    "utility/nccl_comm_split": "split_allreduce",
    "utility/ipc_event_sync": "ring_produce_consume",
    "utility/ipc_handle_exchange": "ring_exchange",
}


@pytest.mark.parametrize("rel", sorted(TASKS))
def test_each_task_names_its_oracle_and_its_mutants_exist(rel):
    task = _task(rel)
    assert task.check.op == TASKS[rel]
    assert "cuMulticast*" in task.forbid and "dlopen" in task.forbid and "dlsym" in task.forbid
    assert len(list((REPO / "references" / rel / "mutants").glob("*.toml"))) >= 3
    assert task.sizes[0] == 1 and any(s % 4 for s in task.sizes[1:])


# -- halo_exchange ----------------------------------------------------------------------

def test_halo_exchange_by_hand_at_three_ranks():
    op = checks.get("halo_exchange")
    params = {"rows": 4, "halo": 1}
    # rank r's field: row i holds (10 r + i, 10 r + i + 0.5)
    fields = [np.array([[10 * r + i, 10 * r + i + 0.5] for i in range(4)], np.float32)
              for r in range(3)]
    trial = Trial([{"field": f} for f in fields], [])
    want = op.expected(trial, 2, "float32", 3, params)
    # ghost_left: the left neighbour's last row; ghost_right: the right neighbour's first row
    assert want[0]["ghost_left"].tolist() == [[23, 23.5]]
    assert want[0]["ghost_right"].tolist() == [[10, 10.5]]
    assert want[1]["ghost_left"].tolist() == [[3, 3.5]]
    assert want[2]["ghost_right"].tolist() == [[0, 0.5]]
    assert op.bytes(2, "float32", 3, params) == (2 * 1 * 2 * 4, 1.0)
    with pytest.raises(ValueError):
        op.make_trial(np.random.default_rng(0), 2, "float32", 3, {"rows": 2, "halo": 3})


@pytest.mark.parametrize("world", [2, 4, 8])
def test_halo_exchange_rejects_the_mutants(world):
    rel = "p2p/nccl_halo_exchange"
    task, op, case = _case(rel, 1023, world)
    trial = case.trials[0]
    rows, halo = case.params["rows"], case.params["halo"]
    want = _want(op, trial, case)
    good = _as_got(want, trial)
    assert _verify(task, op, trial, good, case) == []
    fields = [t["field"] for t in trial.inputs]
    # swapped halves: the left ghost gets the left's first rows, the right ghost its last
    swapped = [{"ghost_left": fields[(r - 1) % world][:halo].copy(),
                "ghost_right": fields[(r + 1) % world][rows - halo:].copy()}
               for r in range(world)]
    assert _verify(task, op, trial, swapped, case)
    # no wrap-around: rank 0's left ghost and rank n-1's right ghost never written
    open_ends = [{k: v.copy() for k, v in g.items()} for g in good]
    open_ends[0]["ghost_left"][:] = np.nan
    open_ends[-1]["ghost_right"][:] = np.nan
    errors = _verify(task, op, trial, open_ends, case)
    assert any("rank 0: output 'ghost_left'" in e for e in errors)
    assert any(f"rank {world - 1}: output 'ghost_right'" in e for e in errors)
    # one row's worth of elements per message (halo elements, not halo rows)
    short = [{k: v.copy() for k, v in g.items()} for g in good]
    for g in short:
        for v in g.values():
            v.reshape(-1)[halo:] = np.nan
    assert _verify(task, op, trial, short, case)
    # the two messages of one pair taken in the wrong order (matters where left == right)
    if world == 2:
        crossed = [{"ghost_left": good[r]["ghost_right"].copy(),
                    "ghost_right": good[r]["ghost_left"].copy()} for r in range(world)]
        assert _verify(task, op, trial, crossed, case)


# -- split_allreduce --------------------------------------------------------------------

def test_split_groups_interleaved_and_blocked():
    assert split_groups(4, {"groups": 2, "blocked": 0}) == [0, 1, 0, 1]
    assert split_groups(8, {"groups": 2, "blocked": 1}) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert split_groups(6, {"groups": 4, "blocked": 0}) == [0, 1, 2, 3, 0, 1]
    with pytest.raises(ValueError):
        split_groups(6, {"groups": 4, "blocked": 1})
    with pytest.raises(ValueError):
        split_groups(2, {"groups": 3, "blocked": 0})


def test_split_allreduce_by_hand_at_four_ranks():
    op = checks.get("split_allreduce")
    params = {"groups": 2, "blocked": 0}
    xs = [np.array([1, 2, 3], np.float32) * 10 ** r for r in range(4)]
    trial = Trial([{"sendbuf": x} for x in xs], [])
    want = op.expected(trial, 3, "float32", 4, params)
    assert want[0]["recvbuf"].tolist() == want[2]["recvbuf"].tolist() == [101, 202, 303]
    assert want[1]["recvbuf"].tolist() == want[3]["recvbuf"].tolist() == [1010, 2020, 3030]
    assert op.bytes(3, "float32", 4, params) == (12, 1.0)  # groups of 2: 2(g-1)/g = 1
    assert op.bytes(3, "float32", 8, params) == (12, 1.5)


@pytest.mark.parametrize("world", [4, 8])
def test_split_allreduce_rejects_the_mutants(world):
    rel = "utility/nccl_comm_split"
    task, op, case = _case(rel, 1023, world)
    trial = case.trials[0]
    good = _as_got(_want(op, trial, case), trial)
    assert _verify(task, op, trial, good, case) == []
    xs = [t["sendbuf"].astype(np.float64) for t in trial.inputs]
    # the communicator of all ranks: the sum over every group
    total = sum(xs).astype(np.float32)
    assert _verify(task, op, trial, [{"recvbuf": total.copy()} for _ in range(world)], case)
    # the grouping read the other way round (consecutive blocks instead of interleaved)
    other = split_groups(world, {"groups": case.params["groups"],
                                 "blocked": 1 - case.params["blocked"]})
    wrong = [{"recvbuf": sum(xs[q] for q in range(world) if other[q] == other[r]).astype(np.float32)}
             for r in range(world)]
    assert _verify(task, op, trial, wrong, case)
    # reduced to each group's first rank only: the other members keep NaN
    color = split_groups(world, case.params)
    roots = {color.index(g) for g in set(color)}
    rooted = [{"recvbuf": good[r]["recvbuf"] if r in roots else np.full(1023, np.nan, np.float32)}
              for r in range(world)]
    errors = _verify(task, op, trial, rooted, case)
    assert errors and all(int(e.split()[1].rstrip(":")) not in roots for e in errors)


def test_split_allreduce_tolerates_float32_rounding_in_any_order():
    rel = "utility/nccl_comm_split"
    task, op, case = _case(rel, 4096, 8)
    trial = case.trials[0]
    color = split_groups(8, case.params)
    got = []
    for r in range(8):
        members = [q for q in range(8) if color[q] == color[r]]
        acc = np.zeros(4096, np.float32)
        for q in reversed(members):  # float32, another order than the oracle's
            acc += trial.inputs[q]["sendbuf"]
        got.append({"recvbuf": acc})
    assert _verify(task, op, trial, got, case) == []


# -- ring_produce_consume -----------------------------------------------------------------

def test_ring_produce_consume_by_hand():
    op = checks.get("ring_produce_consume")
    xs = [np.array([0.5, -1.0], np.float32), np.array([1.5, 2.0], np.float32),
          np.array([-0.75, 0.25], np.float32)]
    trial = Trial([{"x": x} for x in xs], [])
    want = op.expected(trial, 2, "float32", 3, {})
    assert want[0]["stage"].tolist() == [1.0, -2.0]
    assert want[0]["out"].tolist() == [2 * -0.75 + 0.5, 2 * 0.25 - 1.0]  # from rank 2
    assert want[1]["out"].tolist() == [2 * 0.5 + 1.5, 2 * -1.0 + 2.0]    # from rank 0
    assert op.bytes(2, "float32", 3, {}) == (8, 1.0)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_ring_produce_consume_rejects_the_mutants(world):
    rel = "utility/ipc_event_sync"
    task, op, case = _case(rel, 1023, world)
    trial, before = case.trials[1], case.trials[0]
    xs = [t["x"] for t in trial.inputs]
    # the right answer in float32 arithmetic passes
    good = [{"stage": 2 * xs[r], "out": 2 * xs[(r - 1) % world] + xs[r]} for r in range(world)]
    assert _verify(task, op, trial, good, case) == []
    # the rank's own stage instead of the left neighbour's
    own = [{"stage": 2 * xs[r], "out": 2 * xs[r] + xs[r]} for r in range(world)]
    assert _verify(task, op, trial, own, case)
    # a late producer's stage read before it was written: last call's values, or NaN
    late = 1 % world
    old = [{k: v.copy() for k, v in g.items()} for g in good]
    old[(late + 1) % world]["out"] = 2 * before.inputs[late]["x"] + xs[(late + 1) % world]
    assert any(e.startswith(f"rank {(late + 1) % world}:") for e in _verify(task, op, trial, old, case))
    poisoned = [{k: v.copy() for k, v in g.items()} for g in good]
    poisoned[(late + 1) % world]["out"][:] = np.nan
    assert _verify(task, op, trial, poisoned, case)


# -- the reused oracles, against these tasks' mutants -------------------------------------

@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("count", [1, 1023])
def test_alltoall_rejects_the_grouped_alltoall_mutants(world, count):
    rel = "collective/nccl_grouped_alltoall"
    task, op, case = _case(rel, count, world)
    trial = case.trials[0]
    good = _as_got(_want(op, trial, case), trial)
    assert _verify(task, op, trial, good, case) == []
    blocks = [t["sendbuf"].reshape(world, count) for t in trial.inputs]
    # every peer gets the sender's own block
    own = [{"recvbuf": np.concatenate([blocks[src][src] for src in range(world)])}
           for _dst in range(world)]
    assert _verify(task, op, trial, own, case)
    # no message to itself: block `rank` stays NaN
    no_self = [{"recvbuf": g["recvbuf"].copy()} for g in good]
    for r in range(world):
        no_self[r]["recvbuf"][r * count:(r + 1) * count] = np.nan
    assert len(_verify(task, op, trial, no_self, case)) == world
    # float16 with the float32 count: the second half of every block's bytes never arrive
    half = [{"recvbuf": g["recvbuf"].copy()} for g in good]
    for g in half:
        g["recvbuf"].reshape(world, count)[:, count // 2:] = np.nan
    assert len(_verify(task, op, trial, half, case)) == world


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("count", [1, 1023])
def test_reduce_scatter_rejects_the_registered_reduce_scatter_mutants(world, count):
    rel = "collective/nccl_registered_reduce_scatter"
    task, op, case = _case(rel, count, world)
    trial = case.trials[0]
    want = _want(op, trial, case)
    good = _as_got(want, trial)
    assert _verify(task, op, trial, good, case) == []
    # count / world elements reduced, the rest NaN
    part = [{"recvbuf": g["recvbuf"].copy()} for g in good]
    for g in part:
        g["recvbuf"][count // world:] = np.nan
    assert len(_verify(task, op, trial, part, case)) == world
    # the average
    avg = [{"recvbuf": (want[r]["recvbuf"] / world).astype(np.float32)} for r in range(world)]
    assert len(_verify(task, op, trial, avg, case)) == world
    # float16 with the float32 count: half of recvbuf never written
    half = [{"recvbuf": g["recvbuf"].copy()} for g in good]
    for g in half:
        g["recvbuf"][count // 2:] = np.nan
    assert len(_verify(task, op, trial, half, case)) == world


@pytest.mark.parametrize("world", [2, 4, 8])
def test_ring_exchange_rejects_the_handle_exchange_mutants(world):
    rel = "utility/ipc_handle_exchange"
    task, op, case = _case(rel, 1023, world)
    trial = case.trials[0]
    good = _as_got(_want(op, trial, case), trial)
    assert _verify(task, op, trial, good, case) == []
    # its own message in its own recvbuf
    own = [{"recvbuf": trial.inputs[r]["sendbuf"].copy()} for r in range(world)]
    assert len(_verify(task, op, trial, own, case)) == world
    # whole 16-byte vectors only: the last count % 4 elements never written
    no_tail = [{"recvbuf": g["recvbuf"].copy()} for g in good]
    for g in no_tail:
        g["recvbuf"][1023 // 4 * 4:] = np.nan
    assert len(_verify(task, op, trial, no_tail, case)) == world
    # a late rank's recvbuf: written before its call began (no ready wait, or a stale one),
    # then poisoned at its start
    late = [{"recvbuf": g["recvbuf"].copy()} for g in good]
    late[world - 1]["recvbuf"][:] = np.nan
    assert _verify(task, op, trial, late, case) == [
        f"rank {world - 1}: output 'recvbuf': 1023 of 1023 elements wrong; first at index 0: "
        f"got nan, expected {good[world - 1]['recvbuf'][0].item()!r} "
        "(poison: the element was never written)"]
