"""The ThunderKittens collective tasks (tk_allgather, tk_allreduce, tk_reduce_scatter,
tk_alltoall) against the existing oracles they reuse: their manifests (the row layout of
64 columns, tails, no multicast), a float32 tile-wise answer accepted, and every mutant's
output, simulated in numpy on the [rows, 64] layout of the tasks, rejected."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from pytest_commbench import checks
from pytest_commbench.checks.base import Case
from pytest_commbench.mutants import mutants
from pytest_commbench.tasks import load_task

REPO = Path(__file__).resolve().parents[2]
TASKS = {
    "collective/tk_allgather": "allgather",
    "collective/tk_allreduce": "allreduce",
    "collective/tk_reduce_scatter": "reduce_scatter",
    "collective/tk_alltoall": "alltoall",
}
COLS = 64  # the tasks' fixed row width
TILE_ROWS = 32  # the references' tile height (what the dropped-tail mutant rounds down to)


def _task(rel: str):
    return load_task(REPO / "suites" / rel / "task.toml", REPO / "suites")


def _case(op, rows: int, world: int, seed: int = 3) -> Case:
    return op.make_case(np.random.default_rng(seed), "c0", rows * COLS, "float32", world, {}, 2, 0)


def _good(op, case: Case, trial) -> list[dict[str, np.ndarray]]:
    want = op.expected(trial, case.count, case.dtype, case.world, case.params)
    return [{k: np.array(v, dtype=np.float32) for k, v in w.items()} for w in want]


def _errors(op, case: Case, trial, got) -> list[str]:
    events = [{"t_enter": 0.0, "t_exit": 1e-4} for _ in range(case.world)]
    task = next(_task(rel) for rel, name in TASKS.items() if name == op.name)
    return op.verify(trial, got, events, case, task.check.rtol, task.check.atol)


def _kept_rows(rows: int) -> int:
    """Rows a kernel that counts its tiles as rows // TILE_ROWS writes."""
    return rows // TILE_ROWS * TILE_ROWS


@pytest.mark.parametrize("rel", sorted(TASKS))
def test_each_task_loads_with_its_oracle_and_four_mutants(rel):
    task = _task(rel)
    assert task.check.op == TASKS[rel] and task.library == "thunderkittens"
    assert task.ranks == (2, 4, 8)
    assert {"thunderkittens", "cuda-ipc", "nvlink", "sm_90"} <= set(task.requires)
    assert task.fixtures == ("ipc",) and task.workspace >= 1 << 17
    assert {"cuMulticast*", "dlopen", "dlsym", "nccl*", "cudaMemcpy*"} <= set(task.forbid)
    # every size is whole rows of 64; 1 row first, and row counts that no tile height divides
    assert all(c % COLS == 0 for c in task.sizes) and task.sizes[0] == COLS
    assert any((c // COLS) % 16 for c in task.sizes[1:])
    assert list(task.sizes) == sorted(task.sizes)
    world_max = max(task.ranks)
    per_rank = task.sizes[-1] * (1 if TASKS[rel] == "allreduce" else world_max) * 4
    assert per_rank <= 64 << 20
    found = {name for name, _ in mutants(REPO / "references" / rel, task.suffix)}
    assert {"no_start_barrier", "stale_epoch", "dropped_tail"} <= found and len(found) >= 4
    # the template says what it gives: the per-rank layouts, built without multicast
    template = task.template.read_text()
    assert "kittens::pgl<" in template and ", false>" in template and "multimem" not in template
    assert "kittens.cuh" in template


# -- all-gather ------------------------------------------------------------------------------
@pytest.mark.parametrize("rows,world", [(1, 2), (100, 4), (1025, 8)])
def test_allgather_right_answer_and_every_mutant(rows, world):
    op = checks.get("allgather")
    case = _case(op, rows, world)
    now, before = case.trials[1], case.trials[0]
    good = _good(op, case, now)
    assert not _errors(op, case, now, good)
    count = rows * COLS
    # hand check: slab s of every recvbuf is rank s's input
    for r in range(world):
        slabs = good[r]["recvbuf"].reshape(world, rows, COLS)
        for s in range(world):
            assert np.array_equal(slabs[s].reshape(-1), now.inputs[s]["sendbuf"])
    # no start barrier / stale epoch: the held rank's slab is its previous input on the others
    held = 1
    stale = [{k: v.copy() for k, v in g.items()} for g in good]
    for r in range(world):
        if r != held:
            stale[r]["recvbuf"][held * count:(held + 1) * count] = before.inputs[held]["sendbuf"]
    assert _errors(op, case, now, stale)
    # wrong slab: every tile stored at depth = this rank, the other slabs stay NaN
    wrong = []
    for r in range(world):
        out = np.full(world * count, np.nan, dtype=np.float32)
        out[r * count:(r + 1) * count] = now.inputs[world - 1]["sendbuf"]  # the last writer
        wrong.append({"recvbuf": out})
    assert _errors(op, case, now, wrong)
    # dropped tail: the rows of a partial last tile stay NaN in every slab
    tail = [{k: v.copy() for k, v in g.items()} for g in good]
    keep = _kept_rows(rows)
    for r in range(world):
        slabs = tail[r]["recvbuf"].reshape(world, rows, COLS)
        slabs[:, keep:, :] = np.nan
    assert keep < rows and _errors(op, case, now, tail)


# -- all-reduce ------------------------------------------------------------------------------
def _tile_sum(inputs: list[np.ndarray], order: list[int]) -> np.ndarray:
    """A float32 sum in the given rank order (what a tile-wise kernel adds up)."""
    s = inputs[order[0]].astype(np.float32)
    for r in order[1:]:
        s = s + inputs[r]
    return s


@pytest.mark.parametrize("rows,world", [(1, 2), (100, 4), (1025, 8)])
def test_allreduce_float32_tiles_pass_and_every_mutant_fails(rows, world):
    op = checks.get("allreduce")
    case = _case(op, rows, world)
    now, before = case.trials[1], case.trials[0]
    x = [t["sendbuf"] for t in now.inputs]
    # own tile first, then the peers in ring order: a different float32 order on every rank
    good = [{"recvbuf": _tile_sum(x, [(r + k) % world for k in range(world)])}
            for r in range(world)]
    assert not _errors(op, case, now, good)
    # the sum in bf16 (a narrower tile type) is far outside the bound
    narrow = [{"recvbuf": g["recvbuf"].astype(ml_dtypes.bfloat16).astype(np.float32)}
              for g in good]
    assert _errors(op, case, now, narrow)
    # no start barrier / stale epoch: a late peer's previous input in the others' sums
    held = world - 1
    stale_inputs = [before.inputs[r]["sendbuf"] if r == held else x[r] for r in range(world)]
    stale = [{"recvbuf": _tile_sum(stale_inputs, list(range(world)))} if r != held
             else dict(good[r]) for r in range(world)]
    assert _errors(op, case, now, stale)
    # wrong peer: tiles from rank k instead of (rank + k) % n: own twice, rank 0 never
    wrong = [{"recvbuf": _tile_sum(x, [r] + list(range(1, world)))} for r in range(world)]
    assert not _errors(op, case, now, [wrong[0]] + good[1:])  # right on rank 0 alone
    assert _errors(op, case, now, wrong)
    # dropped tail: the last partial tile's rows stay NaN
    keep = _kept_rows(rows)
    tail = [{"recvbuf": g["recvbuf"].copy()} for g in good]
    for t in tail:
        t["recvbuf"].reshape(rows, COLS)[keep:, :] = np.nan
    assert keep < rows and _errors(op, case, now, tail)


# -- reduce-scatter --------------------------------------------------------------------------
@pytest.mark.parametrize("rows,world", [(1, 2), (100, 4), (1025, 8)])
def test_reduce_scatter_float32_tiles_pass_and_every_mutant_fails(rows, world):
    op = checks.get("reduce_scatter")
    case = _case(op, rows, world)
    now, before = case.trials[1], case.trials[0]
    count = rows * COLS

    def slab(inputs, src, d):
        return inputs[src]["sendbuf"][d * count:(d + 1) * count]

    def result(inputs, d, pick):
        order = [(d + k) % world for k in range(world)]
        s = slab(inputs, order[0], d).astype(np.float32)
        for src in order[1:]:
            s = s + slab(inputs, src, pick(src, d))
        return s

    good = [{"recvbuf": result(now.inputs, d, lambda src, d: d)} for d in range(world)]
    assert not _errors(op, case, now, good)
    # hand check of the layout: rank d's result is the sum of slab d of every rank
    d = world - 1
    total = sum(slab(now.inputs, src, d).astype(np.float64) for src in range(world))
    assert np.allclose(good[d]["recvbuf"], total, rtol=1e-5, atol=1e-5)
    # no start barrier / stale epoch: a late peer's previous slabs in the others' sums
    held = 0
    mixed = [before.inputs[r] if r == held else now.inputs[r] for r in range(world)]
    stale = [{"recvbuf": result(mixed, d, lambda src, d: d)} if d != held else dict(good[d])
             for d in range(world)]
    assert _errors(op, case, now, stale)
    # wrong slab: a peer's own slab (index src) instead of the one for this rank (index d)
    wrong = [{"recvbuf": result(now.inputs, d, lambda src, d: src)} for d in range(world)]
    assert _errors(op, case, now, wrong)
    # dropped tail
    keep = _kept_rows(rows)
    tail = [{"recvbuf": g["recvbuf"].copy()} for g in good]
    for t in tail:
        t["recvbuf"].reshape(rows, COLS)[keep:, :] = np.nan
    assert keep < rows and _errors(op, case, now, tail)


# -- all-to-all ------------------------------------------------------------------------------
@pytest.mark.parametrize("rows,world", [(1, 2), (100, 4), (1025, 8)])
def test_alltoall_right_answer_and_every_mutant(rows, world):
    op = checks.get("alltoall")
    case = _case(op, rows, world)
    now, before = case.trials[1], case.trials[0]
    count = rows * COLS

    def gathered(inputs, d, pick):
        return np.concatenate([inputs[s]["sendbuf"][pick(s, d) * count:(pick(s, d) + 1) * count]
                               for s in range(world)])

    good = [{"recvbuf": gathered(now.inputs, d, lambda s, d: d)} for d in range(world)]
    assert not _errors(op, case, now, good)
    assert np.array_equal(_good(op, case, now)[0]["recvbuf"], good[0]["recvbuf"])
    # no start barrier / stale epoch: a late peer's previous slab on the others
    held = world // 2
    mixed = [before.inputs[r] if r == held else now.inputs[r] for r in range(world)]
    stale = [{"recvbuf": gathered(mixed, d, lambda s, d: d)} if d != held else dict(good[d])
             for d in range(world)]
    assert _errors(op, case, now, stale)
    # wrong slab: slab `source` of every source instead of slab `rank`
    wrong = [{"recvbuf": gathered(now.inputs, d, lambda s, d: s)} for d in range(world)]
    assert _errors(op, case, now, wrong)
    # dropped tail: the last partial tile of every slab stays NaN
    keep = _kept_rows(rows)
    tail = [{"recvbuf": g["recvbuf"].copy()} for g in good]
    for t in tail:
        t["recvbuf"].reshape(world, rows, COLS)[:, keep:, :] = np.nan
    assert keep < rows and _errors(op, case, now, tail)
