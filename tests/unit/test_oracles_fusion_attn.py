"""The oracles of the sequence-parallel attention tasks (ring_attention, ulysses_attention) and
of the fused all-reduce + residual + RMSNorm (allreduce_rmsnorm): hand-checked expected
values, float32 computations accepted, and the outputs of each task's mutants rejected (a
missing scale, an accumulator not rescaled, a late rank's stale inputs, another head's keys,
unmasked tail keys, the residual left out of the norm, eps outside the square root)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pytest_commbench import checks
from pytest_commbench.checks.attention import EPS, TINY, attend
from pytest_commbench.checks.base import Trial
from pytest_commbench.tasks import load_task

REPO = Path(__file__).resolve().parents[2]


def _task(name: str):
    return load_task(REPO / "suites" / "fusion" / name / "task.toml", REPO / "suites")


def _case(op, count, world, params, seed=1):
    return op.make_case(np.random.default_rng(seed), "c0", count, "float32", world, params, 2, 0)


def _verify(op, trial, case, got, rtol, atol):
    events = [{"t_enter": 0.0, "t_exit": 1.0} for _ in range(case.world)]
    return op.verify(trial, got, events, case, rtol, atol)


def online_softmax(q, k, v, tile, rescale=True, scale=True, pad=False):
    """What an attention kernel computes in float32: scores of `tile` keys at a time, a
    running maximum and sum per row, the accumulator rescaled when the maximum grows
    (`rescale=False`: the no_rescale mutant), scores scaled by 1/sqrt(D) (`scale=False`: the
    no_scale mutant); `pad`: k and v are lists of per-rank blocks, each padded with zero rows
    to a whole number of tiles and the padding NOT masked (the no_tail_mask mutant)."""
    f = np.float32
    d = q.shape[-1]
    blocks = list(zip(k, v)) if pad else [(k, v)]
    if pad:
        padded = []
        for kb, vb in blocks:
            extra = -kb.shape[0] % tile
            padded.append((np.concatenate([kb, np.zeros((extra, d), f)]),
                           np.concatenate([vb, np.zeros((extra, d), f)])))
        blocks = padded
    m = np.full(q.shape[0], -np.inf, f)
    total = np.zeros(q.shape[0], f)
    acc = np.zeros(q.shape, f)
    factor = f(1.0 / math.sqrt(d)) if scale else f(1.0)
    for kb, vb in blocks:
        for k0 in range(0, kb.shape[0], tile):
            s = (q @ kb[k0:k0 + tile].T) * factor
            m_new = np.maximum(m, s.max(axis=1))
            alpha = np.exp(m - m_new)
            p = np.exp(s - m_new[:, None])
            total = total * alpha + p.sum(axis=1, dtype=f)
            if rescale:
                acc = acc * alpha[:, None]
            acc = acc + p @ vb[k0:k0 + tile]
            m = m_new
    return acc / total[:, None]


# -- the float64 attention itself ---------------------------------------------------------------
def test_attend_hand_checked():
    d = 4  # scale 1/2
    q = np.array([[2.0 * math.log(3.0), 0.0, 0.0, 0.0]])
    k = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 5.0, 0.0, 0.0]])  # scores ln 3 and 0
    v = np.array([[4.0, 0.0, 1.0, 2.0], [0.0, 8.0, 1.0, -2.0]])
    out = attend(q, k, v)
    # softmax weights 3/4 and 1/4
    assert out[0].tolist() == pytest.approx([3.0, 2.0, 1.0, 1.0])
    # a batch axis (heads) and several row blocks give the same rows as one at a time
    rng = np.random.default_rng(0)
    qb, kb, vb = (rng.standard_normal((2, 300, d)) for _ in range(3))
    whole = attend(qb, kb, vb)
    assert whole.shape == (2, 300, d)
    s = qb[1, 299] @ kb[1].T / math.sqrt(d)
    w = np.exp(s - s.max())
    assert whole[1, 299] == pytest.approx((w / w.sum()) @ vb[1])


# -- ring_attention ----------------------------------------------------------------------------
def test_ring_attention_hand_checked():
    op = checks.get("ring_attention")
    # D = 4, one row per rank: rank 0's query sees its own key (score ln 3) and rank 1's
    # (score 0); rank 1's query is zero (equal weights)
    q0 = np.array([[2.0 * math.log(3.0), 0.0, 0.0, 0.0]], dtype=np.float32)
    q1 = np.zeros((1, 4), dtype=np.float32)
    k0 = np.array([[1.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    k1 = np.array([[0.0, 1.0, 0.0, 0.0]], dtype=np.float32)
    v0 = np.array([[4.0, 0.0, 1.0, 2.0]], dtype=np.float32)
    v1 = np.array([[0.0, 8.0, 1.0, -2.0]], dtype=np.float32)
    trial = Trial([{"q": q0, "k": k0, "v": v0}, {"q": q1, "k": k1, "v": v1}],
                  [{"o": ((1, 4), "float32")}] * 2)
    want = op.expected(trial, 1, "float32", 2, {"head_dim": 4})
    assert want[0]["o"][0].tolist() == pytest.approx([3.0, 2.0, 1.0, 1.0], abs=1e-6)
    assert want[1]["o"][0].tolist() == pytest.approx([2.0, 4.0, 1.0, 0.0])
    assert op.args({"head_dim": 4}) == ["q", "k", "v", "head_dim", "o"]


@pytest.mark.parametrize("world, count", [(2, 1), (4, 61)])
def test_ring_attention_accepts_float32_and_rejects_the_mutants(world, count):
    task = _task("ring_attention")
    op = checks.get(task.check.op)
    rtol, atol = task.check.rtol, task.check.atol
    d = task.check.params["head_dim"]
    case = _case(op, count, world, task.check.params)
    trial, other = case.trials
    assert trial.inputs[0]["q"].shape == (count, d)
    k = np.concatenate([named["k"] for named in trial.inputs])
    v = np.concatenate([named["v"] for named in trial.inputs])

    def outputs(**kw):
        return [{"o": online_softmax(named["q"], k, v, 32, **kw)} for named in trial.inputs]

    assert _verify(op, trial, case, outputs(), rtol, atol) == []
    # no_scale: the softmax is far too sharp
    assert _verify(op, trial, case, outputs(scale=False), rtol, atol)
    # no_rescale: only wrong where a row's maximum grew after its first tile, which at the
    # task's larger sizes is every row (a single key per rank may not see it)
    if world * count > 32:
        assert _verify(op, trial, case, outputs(rescale=False), rtol, atol)
    # no_start_wait / stale_epoch: a late rank's keys and values are an earlier call's
    late = world - 1
    k_old = k.copy()
    v_old = v.copy()
    k_old[late * count:] = other.inputs[late]["k"]
    v_old[late * count:] = other.inputs[late]["v"]
    stale = [{"o": online_softmax(named["q"], k_old, v_old, 32)} for named in trial.inputs]
    errors = _verify(op, trial, case, stale, rtol, atol)
    assert len(errors) >= world - 1  # every rank's output (the late one's own included)


def test_ring_attention_no_rescale_rejected_at_the_task_sizes():
    task = _task("ring_attention")
    op = checks.get(task.check.op)
    case = _case(op, 256, 2, task.check.params)
    trial = case.trials[0]
    k = np.concatenate([named["k"] for named in trial.inputs])
    v = np.concatenate([named["v"] for named in trial.inputs])
    got = [{"o": online_softmax(named["q"], k, v, 32, rescale=False)} for named in trial.inputs]
    errors = _verify(op, trial, case, got, task.check.rtol, task.check.atol)
    assert len(errors) == 2


def test_the_attention_tolerance_rejects_tf32_products():
    task = _task("ring_attention")
    op = checks.get(task.check.op)
    case = _case(op, 61, 2, task.check.params)
    trial = case.trials[0]

    def tf32(x):
        bits = x.astype(np.float32).view(np.uint32)
        return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)

    k = tf32(np.concatenate([named["k"] for named in trial.inputs]))
    v = np.concatenate([named["v"] for named in trial.inputs])
    got = [{"o": online_softmax(tf32(named["q"]), k, v, 32)} for named in trial.inputs]
    assert _verify(op, trial, case, got, task.check.rtol, task.check.atol)


# -- ulysses_attention -------------------------------------------------------------------------
def _heads_first(trial, name):
    """(H, S, D): head-major, rank 0's rows first."""
    return np.concatenate([named[name] for named in trial.inputs]).transpose(1, 0, 2)


def test_ulysses_attention_is_ring_attention_per_head():
    op = checks.get("ulysses_attention")
    ring = checks.get("ring_attention")
    params = {"heads": 4, "head_dim": 8}
    case = _case(op, 5, 2, params)
    trial = case.trials[0]
    assert trial.inputs[1]["q"].shape == (5, 4, 8)
    want = op.expected(trial, 5, "float32", 2, params)
    for j in range(4):
        per_head = Trial([{n: named[n][:, j, :] for n in ("q", "k", "v")}
                          for named in trial.inputs], [])
        ring_want = ring.expected(per_head, 5, "float32", 2, {"head_dim": 8})
        for r in range(2):
            assert want[r]["o"][:, j, :] == pytest.approx(ring_want[r]["o"])
    with pytest.raises(ValueError, match="not divisible"):
        op.make_trial(np.random.default_rng(0), 5, "float32", 3, params)


@pytest.mark.parametrize("world, count", [(2, 1), (4, 37)])
def test_ulysses_attention_accepts_float32_and_rejects_the_mutants(world, count):
    task = _task("ulysses_attention")
    op = checks.get(task.check.op)
    rtol, atol = task.check.rtol, task.check.atol
    h = task.check.params["heads"]
    tile = 64
    case = _case(op, count, world, task.check.params)
    trial, other = case.trials
    kh, vh = _heads_first(trial, "k"), _heads_first(trial, "v")

    def outputs(head_of=lambda j: j, k=kh, v=vh, pad=False):
        got = []
        for named in trial.inputs:
            o = np.empty_like(named["q"])
            for j in range(h):
                src = head_of(j)
                kk = np.split(k[src], world) if pad else k[src]
                vv = np.split(v[src], world) if pad else v[src]
                o[:, j, :] = online_softmax(named["q"][:, j, :], kk, vv, tile, pad=pad)
            got.append({"o": o})
        return got

    assert _verify(op, trial, case, outputs(), rtol, atol) == []
    # local_head: rank r (r > 0) attends its heads with the keys/values of head j - r H/n
    per_rank = h // world
    errors = _verify(op, trial, case, outputs(head_of=lambda j: j % per_rank), rtol, atol)
    assert len(errors) == world  # every rank's rows hold rank 1's (wrong) heads
    # no_tail_mask: each rank's keys padded to whole tiles with zero rows, unmasked
    assert _verify(op, trial, case, outputs(pad=True), rtol, atol)
    # no_start_wait: a late rank's keys and values are an earlier call's
    late = world - 1
    k_old, v_old = kh.copy(), vh.copy()
    k_old[:, late * count:] = other.inputs[late]["k"].transpose(1, 0, 2)
    v_old[:, late * count:] = other.inputs[late]["v"].transpose(1, 0, 2)
    assert _verify(op, trial, case, outputs(k=k_old, v=v_old), rtol, atol)


# -- allreduce_rmsnorm -------------------------------------------------------------------------
def test_allreduce_rmsnorm_hand_checked():
    op = checks.get("allreduce_rmsnorm")
    x0 = np.array([[1.0, 2.0, 0.0, -1.0]], dtype=np.float32)
    x1 = np.array([[1.0, -1.0, 1.0, 2.0]], dtype=np.float32)
    res = np.array([[0.0, 1.0, -2.0, 1.0]], dtype=np.float32)
    gamma = np.array([1.0, 2.0, 0.5, -1.0], dtype=np.float32)
    trial = Trial([{"x": x0, "residual": res, "gamma": gamma},
                   {"x": x1, "residual": res, "gamma": gamma}],
                  [{"y": ((1, 4), "float32"), "residual_out": ((1, 4), "float32")}] * 2)
    want = op.expected(trial, 1, "float32", 2, {"hidden": 4})
    # sum + residual = [2, 2, -1, 2]: mean square (4 + 4 + 1 + 4) / 4 = 3.25
    rstd = 1.0 / math.sqrt(3.25 + EPS)
    for w in want:
        assert w["residual_out"].tolist() == [[2.0, 2.0, -1.0, 2.0]]
        assert w["y"][0].tolist() == pytest.approx([2 * rstd, 4 * rstd, -0.5 * rstd, -2 * rstd])
    assert op.args({"hidden": 4}) == ["x", "residual", "gamma", "hidden", "y", "residual_out"]


def test_allreduce_rmsnorm_inputs():
    op = checks.get("allreduce_rmsnorm")
    rng = np.random.default_rng(3)
    for count in (1, 2, 3, 64):
        trial = op.make_trial(rng, count, "float32", 4, {"hidden": 16})
        first = trial.inputs[0]
        assert first["x"].shape == (count, 16) and first["gamma"].shape == (16,)
        for named in trial.inputs[1:]:  # residual and gamma are the same on every rank
            assert np.array_equal(named["residual"], first["residual"])
            assert np.array_equal(named["gamma"], first["gamma"])
            assert not np.array_equal(named["x"], first["x"])
        small = np.abs(first["residual"]).max(axis=1) < 4 * TINY
        if count >= 2:
            assert small.any()  # at least one row where eps matters
    with pytest.raises(ValueError, match="hidden"):
        op.make_trial(rng, 1, "float32", 2, {})


def _float32_rmsnorm(trial, residual_first=False, with_residual=True, eps_inside=True):
    """A kernel's float32 computation: the ranks' x summed in rank order (or the residual
    first), the sum of squares accumulated one element at a time (the worst order), then
    rsqrt; the mutants' variants."""
    f = np.float32
    xs = [named["x"] for named in trial.inputs]
    res = trial.inputs[0]["residual"]
    gamma = trial.inputs[0]["gamma"]
    acc = res.copy() if residual_first else xs[0].copy()
    for x in (xs if residual_first else xs[1:]):
        acc += x
    s = acc if residual_first else acc + res
    normed = s if with_residual else (acc if not residual_first else acc - res)
    sq = np.cumsum(normed * normed, axis=1, dtype=f)[:, -1]  # one element after another
    ms = sq / f(s.shape[1])
    if eps_inside:
        rstd = f(1.0) / np.sqrt(ms + f(EPS))
    else:
        rstd = f(1.0) / (np.sqrt(ms) + f(EPS))
    return [{"y": normed * rstd[:, None] * gamma, "residual_out": s} for _ in trial.inputs]


@pytest.mark.parametrize("world, count", [(2, 1), (8, 3), (4, 16)])
def test_allreduce_rmsnorm_accepts_float32_and_rejects_the_mutants(world, count):
    task = _task("allreduce_rmsnorm")
    op = checks.get(task.check.op)
    rtol, atol = task.check.rtol, task.check.atol
    # several draws: the single row of count = 1 is small in about half of them
    case = op.make_case(np.random.default_rng(7), "c0", count, "float32", world,
                        task.check.params, 4, 0)
    caught = {"eps": 0, "residual": 0, "stale": 0}
    for t, trial in enumerate(case.trials):
        for order in (False, True):
            got = _float32_rmsnorm(trial, residual_first=order)
            assert _verify(op, trial, case, got, rtol, atol) == []
        caught["residual"] += bool(
            _verify(op, trial, case, _float32_rmsnorm(trial, with_residual=False), rtol, atol))
        caught["eps"] += bool(
            _verify(op, trial, case, _float32_rmsnorm(trial, eps_inside=False), rtol, atol))
        # no_start_wait / stale_epoch: a late rank's x is an earlier call's
        other = case.trials[t - 1]
        late = world - 1
        stale = Trial([dict(named) for named in trial.inputs], trial.outputs)
        stale.inputs[late]["x"] = other.inputs[late]["x"]
        got = _float32_rmsnorm(stale)
        caught["stale"] += bool(_verify(op, trial, case, got, rtol, atol))
    assert caught["residual"] == caught["stale"] == len(case.trials)
    # eps enters only on the small rows: a trial with one caught, and every trial once
    # there are several rows (one at least is small)
    assert caught["eps"] >= (1 if count == 1 else len(case.trials))


def test_allreduce_rmsnorm_slack_is_small():
    """The float32 bound stays far below what the mutants change: about 4e-4 of |y| for
    H = 4096 (the worst-case accumulation of 4096 squares), against 4% and more on the small
    rows for eps outside the square root."""
    task = _task("allreduce_rmsnorm")
    op = checks.get(task.check.op)
    case = _case(op, 8, 8, task.check.params)
    trial = case.trials[0]
    want = op.expected(trial, 8, "float32", 8, task.check.params)[0]
    slack = op.slack(trial, case)[0]
    rel = slack["y"] / np.maximum(np.abs(want["y"]), 1e-30)
    assert np.median(rel) < 1e-3
    assert np.all(slack["residual_out"] < 1e-4)
