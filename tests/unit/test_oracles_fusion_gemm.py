"""The oracles of the tile-fused GEMM tasks (gemm_allreduce, allgather_matmul_fp8, and the
reused allgather_matmul and gemm_reduce_scatter at these tasks' parameters): hand-checked
expected values, float32 computations accepted, and the outputs of each task's mutants
rejected (a late rank's stale contribution, a dropped tail tile, a wrong slot or scale)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pytest_commbench import checks
from pytest_commbench.checks.base import Case, Trial
from pytest_commbench.checks.lowp import decode, encode
from pytest_commbench.tasks import load_task

REPO = Path(__file__).resolve().parents[2]
TILE = 64  # the references' output tile and row block
NARROW = 130  # n in these tests: the task's k (what the tolerances depend on), fewer columns


def _params(task):
    return dict(task.check.params, n=NARROW)


def _task(name: str):
    return load_task(REPO / "suites" / "fusion" / name / "task.toml", REPO / "suites")


def _case(op, count, world, params, dtype="float32", seed=1):
    rng = np.random.default_rng(seed)
    return op.make_case(rng, "c0", count, dtype, world, params, 2, 0)


def _verify(op, trial, case, got, rtol, atol):
    events = [{"t_enter": 0.0, "t_exit": 1.0} for _ in range(case.world)]
    return op.verify(trial, got, events, case, rtol, atol)


def _copy(outputs):
    return [{k: np.array(v, dtype=np.float32) for k, v in r.items()} for r in outputs]


# -- gemm_allreduce ---------------------------------------------------------------------------
def test_gemm_allreduce_hand_checked():
    op = checks.get("gemm_allreduce")
    a0 = np.array([[1.0, 2.0, 1.0]], dtype=np.float32)    # rank 0: k = 3 columns of A
    b0 = np.array([[1.0], [0.5], [2.0]], dtype=np.float32)  # ... and 3 rows of B (n = 1)
    a1 = np.array([[-1.0, 0.5, 1.0]], dtype=np.float32)
    b1 = np.array([[2.0], [4.0], [-1.0]], dtype=np.float32)
    trial = Trial([{"a": a0, "b": b0}, {"a": a1, "b": b1}],
                  [{"c": ((1, 1), "float32")}] * 2)
    want = op.expected(trial, 1, "float32", 2, {"k": 3, "n": 1})
    # 1*1 + 2*0.5 + 1*2 + (-1)*2 + 0.5*4 + 1*(-1) = 3
    assert [w["c"].tolist() for w in want] == [[[3.0]], [[3.0]]]
    case = Case("c0", 1, "float32", 2, {"k": 3, "n": 1}, op.args({}), [trial], op=op)
    slack = op.slack(trial, case)[0]["c"]
    # 2 * (k + world) * 2^-24 * (1 + 1 + 2 + 2 + 2 + 1)
    assert slack[0, 0] == pytest.approx(2 * 5 * 2.0 ** -24 * 9)


def _float32_allreduce(trial):
    """Every rank's partial product in float32 (BLAS order), summed in float32 in rank order."""
    parts = [named["a"] @ named["b"] for named in trial.inputs]
    total = parts[0].copy()
    for p in parts[1:]:
        total += p
    return total


@pytest.mark.parametrize("world", [2, 8])
def test_gemm_allreduce_accepts_float32_and_rejects_the_mutants(world):
    task = _task("gemm_allreduce_tiles")
    op = checks.get(task.check.op)
    rtol, atol = task.check.rtol, task.check.atol
    m = 70  # one whole row of tiles and a partial one
    case = _case(op, m, world, _params(task))
    trial, other = case.trials
    c32 = _float32_allreduce(trial)
    assert _verify(op, trial, case, [{"c": c32} for _ in range(world)], rtol, atol) == []

    # no_tile_wait / any_flag: the late rank's partial of one tile is an earlier call's
    stale = [{"c": c32.copy()} for _ in range(world)]
    late = world - 1
    old = other.inputs[late]["a"] @ other.inputs[late]["b"]
    new = trial.inputs[late]["a"] @ trial.inputs[late]["b"]
    for r in range(world - 1):
        stale[r]["c"][:TILE, :TILE] += old[:TILE, :TILE] - new[:TILE, :TILE]
    errors = _verify(op, trial, case, stale, rtol, atol)
    assert len(errors) == world - 1 and "rank 0" in errors[0]

    # a late rank's partial of the tile still zeros (never staged in that half)
    zeros = [{"c": c32.copy()} for _ in range(world)]
    zeros[0]["c"][:TILE, :TILE] -= new[:TILE, :TILE]
    assert _verify(op, trial, case, zeros, rtol, atol)

    # tail_rows_dropped: the rows past the last whole tile stay NaN
    tail = [{"c": c32.copy()} for _ in range(world)]
    for r in tail:
        r["c"][TILE:] = np.nan
    assert len(_verify(op, trial, case, tail, rtol, atol)) == world


def test_gemm_allreduce_rejects_a_missing_rank_and_bfloat16_inputs():
    task = _task("gemm_allreduce_tiles")
    op = checks.get(task.check.op)
    world = 2
    case = _case(op, 64, world, _params(task), seed=3)
    trial = case.trials[0]
    missing = sum(named["a"] @ named["b"] for named in trial.inputs[:-1])
    got = [{"c": missing.astype(np.float32)} for _ in range(world)]
    assert _verify(op, trial, case, got, task.check.rtol, task.check.atol)
    # inputs rounded to bfloat16 before a float32 GEMM: beyond float32's bound here
    rounded = [{"a": decode(encode(n["a"], "bfloat16"), "bfloat16").astype(np.float32),
                "b": decode(encode(n["b"], "bfloat16"), "bfloat16").astype(np.float32)}
               for n in trial.inputs]
    bf16 = _float32_allreduce(Trial(rounded, trial.outputs))
    got = [{"c": bf16} for _ in range(world)]
    assert _verify(op, trial, case, got, task.check.rtol, task.check.atol)


# -- allgather_matmul (reused) at this task's parameters ----------------------------------------
def test_allgather_gemm_tiles_float32_passes_and_mutants_fail():
    task = _task("allgather_gemm_tiles")
    op = checks.get(task.check.op)
    assert op.name == "allgather_matmul"
    rtol, atol = task.check.rtol, task.check.atol
    world, m = 4, 70
    case = _case(op, m, world, _params(task))
    trial, other = case.trials
    a = np.concatenate([n["a_shard"] for n in trial.inputs])
    good = [{"c": a @ n["b"]} for n in trial.inputs]  # float32 GEMMs
    # and a sequential float32 sum over k (the least favourable usual order)
    b0 = trial.inputs[0]["b"]
    seq = np.zeros((a.shape[0], b0.shape[1]), dtype=np.float32)
    for t in range(a.shape[1]):
        seq += a[:, t:t + 1] * b0[t:t + 1, :]
    good[0]["c"] = seq
    assert _verify(op, trial, case, good, rtol, atol) == []

    late = 2
    rows = slice(late * m, late * m + TILE)
    # no_shard_wait / any_flag: a late rank's first row block is an earlier call's, or zeros
    for stale_rows in (other.inputs[late]["a_shard"][:TILE],
                       np.zeros_like(trial.inputs[late]["a_shard"][:TILE])):
        bad = _copy(good)
        bad[0]["c"][rows] = stale_rows @ trial.inputs[0]["b"]
        assert _verify(op, trial, case, bad, rtol, atol)
    # reader_slot: every peer's rows multiply as zeros
    bad = _copy(good)
    for s in range(1, world):
        bad[0]["c"][s * m:(s + 1) * m] = 0.0
    assert _verify(op, trial, case, bad, rtol, atol)
    # tail_rows_dropped: the rows of every shard past its last whole block stay NaN
    bad = _copy(good)
    for r in bad:
        for s in range(world):
            r["c"][s * m + TILE:(s + 1) * m] = np.nan
    assert len(_verify(op, trial, case, bad, rtol, atol)) == world


# -- gemm_reduce_scatter (reused) at this task's parameters -------------------------------------
def test_gemm_reduce_scatter_tiles_float32_passes_and_mutants_fail():
    task = _task("gemm_reduce_scatter_tiles")
    op = checks.get(task.check.op)
    assert op.name == "gemm_reduce_scatter"
    rtol, atol = task.check.rtol, task.check.atol
    world, m = 2, 70
    case = _case(op, m, world, _params(task))
    trial, other = case.trials

    def block(named, d):
        return named["a"][d * m:(d + 1) * m] @ named["b"]

    good = []
    for d in range(world):
        total = block(trial.inputs[0], d)
        for q in range(1, world):
            total = total + block(trial.inputs[q], d)
        good.append({"c": total})
    assert _verify(op, trial, case, good, rtol, atol) == []

    late = 1
    # no_owner_wait / any_flag: rank 0's first tile holds the late rank's earlier partial
    bad = _copy(good)
    bad[0]["c"][:TILE, :TILE] += (block(other.inputs[late], 0) - block(trial.inputs[late], 0))[
        :TILE, :TILE]
    assert _verify(op, trial, case, bad, rtol, atol)
    # own_rows_sent: every owner receives the products of the senders' own row blocks
    bad = []
    for d in range(world):
        total = block(trial.inputs[d], d)
        for q in range(world):
            if q != d:
                total = total + block(trial.inputs[q], q)
        bad.append({"c": total})
    assert len(_verify(op, trial, case, bad, rtol, atol)) == world
    # tail_rows_dropped
    bad = _copy(good)
    for r in bad:
        r["c"][TILE:] = np.nan
    assert len(_verify(op, trial, case, bad, rtol, atol)) == world


# -- allgather_matmul_fp8 --------------------------------------------------------------------
def test_allgather_matmul_fp8_hand_checked():
    op = checks.get("allgather_matmul_fp8")
    # e4m3: 0x38 = 1.0, 0x40 = 2.0, 0xB8 = -1.0, 0x01 = 2^-9 (the smallest subnormal)
    a0 = np.array([[0x38, 0x40]], dtype=np.uint8)
    a1 = np.array([[0xB8, 0x01]], dtype=np.uint8)
    b = np.array([[0x40], [0x38]], dtype=np.uint8)
    sa0, sa1 = np.array([0.5], np.float32), np.array([0.25], np.float32)
    sb = np.array([3.0], np.float32)
    trial = Trial([{"a_shard": a0, "a_scale": sa0, "b": b, "b_scale": sb},
                   {"a_shard": a1, "a_scale": sa1, "b": b, "b_scale": sb}],
                  [{"c": ((2, 1), "float32")}] * 2)
    want = op.expected(trial, 1, "uint8", 2, {"k": 2, "n": 1})
    # row 0: 0.5 * 3 * (1*2 + 2*1) = 6; row 1: 0.25 * 3 * (-1*2 + 2^-9 * 1)
    assert want[0]["c"][:, 0].tolist() == [6.0, 0.75 * (-2 + 2.0 ** -9)]
    assert np.array_equal(want[0]["c"], want[1]["c"])


def test_fp8_inputs_are_finite_e4m3_with_positive_scales():
    op = checks.get("allgather_matmul_fp8")
    case = _case(op, 129, 2, {"k": 512, "n": NARROW}, dtype="uint8")
    named = case.trials[0].inputs[0]
    assert named["a_shard"].dtype == np.uint8 and named["a_shard"].shape == (129, 512)
    vals = decode(named["a_shard"], "float8_e4m3")
    assert np.isfinite(vals).all()
    assert (np.abs(vals[vals != 0]) < 2.0 ** -6).any()  # subnormals occur
    assert named["a_scale"].dtype == np.float32 and (named["a_scale"] > 0).all()
    assert named["b_scale"].shape == (NARROW,)


def _fp8_float32(trial, own_scales=False, drop_col_scale=False):
    """What a float32 kernel writes: decoded e4m3, float32 sums, then * sa * sb (float32)."""
    a = np.concatenate([decode(n["a_shard"], "float8_e4m3") for n in trial.inputs]).astype(
        np.float32)
    sa = np.concatenate([n["a_scale"] for n in trial.inputs])
    out = []
    for named in trial.inputs:
        b = decode(named["b"], "float8_e4m3").astype(np.float32)
        acc = a @ b
        rows_sa = sa
        if own_scales:  # every shard's rows with this rank's own row scales
            rows_sa = np.tile(named["a_scale"], len(trial.inputs))
        c = acc * rows_sa[:, None]
        if not drop_col_scale:
            c = c * named["b_scale"][None, :]
        out.append({"c": c.astype(np.float32)})
    return out


def test_allgather_gemm_fp8_float32_passes_and_mutants_fail():
    task = _task("allgather_gemm_fp8")
    op = checks.get(task.check.op)
    rtol, atol = task.check.rtol, task.check.atol
    world, m = 4, 70
    case = _case(op, m, world, _params(task), dtype=task.check.dtypes[0])
    trial, other = case.trials
    good = _fp8_float32(trial)
    assert _verify(op, trial, case, good, rtol, atol) == []
    # scales applied before the sum (each term (a*sa)(b*sb) in float32) also pass
    a = np.concatenate([decode(n["a_shard"], "float8_e4m3") for n in trial.inputs])
    sa = np.concatenate([n["a_scale"] for n in trial.inputs])
    scaled_a = (a.astype(np.float32) * sa[:, None]).astype(np.float32)
    b0 = trial.inputs[0]
    scaled_b = (decode(b0["b"], "float8_e4m3").astype(np.float32)
                * b0["b_scale"][None, :]).astype(np.float32)
    before = _copy(good)
    before[0]["c"] = scaled_a @ scaled_b
    assert _verify(op, trial, case, before, rtol, atol) == []

    # own_row_scales: the peers' rows scaled with the reader's own a_scale
    assert len(_verify(op, trial, case, _fp8_float32(trial, own_scales=True), rtol,
                       atol)) == world
    # column_scale_dropped
    assert len(_verify(op, trial, case, _fp8_float32(trial, drop_col_scale=True), rtol,
                       atol)) == world
    # no_shard_wait / any_flag: a late rank's first row block (bytes and scales) is an earlier
    # call's
    late = 3
    stale = Trial([dict(n) for n in trial.inputs], trial.outputs)
    old_a = stale.inputs[late]["a_shard"].copy()
    old_a[:TILE] = other.inputs[late]["a_shard"][:TILE]
    old_s = stale.inputs[late]["a_scale"].copy()
    old_s[:TILE] = other.inputs[late]["a_scale"][:TILE]
    stale.inputs[late] = dict(stale.inputs[late], a_shard=old_a, a_scale=old_s)
    bad = _fp8_float32(stale)
    for r in range(world):
        if r != late:
            good_r = _copy(good)
            good_r[r] = bad[r]
            assert _verify(op, trial, case, good_r, rtol, atol)
