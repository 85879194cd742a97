"""Every task's oracle at world sizes 2, 4 and 8 (and the manifest's own), on the CPU: the
expected outputs pass, a single wrong element on the last rank is caught, and so is a timed
repetition's fresh inputs mistaken for trial 0's. The GPU topology parser and the job's NVLink
matrix are checked on synthetic 8-GPU `nvidia-smi topo -m` output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pytest_commbench import checks
from pytest_commbench.checks.gpu_topology import TopologyError, job_matrix, parse_topo
from pytest_commbench.tasks import load_task

REPO = Path(__file__).resolve().parents[2]
HOST_DEPENDENT = {"nvlink_matrix", "device_attributes"}  # their answers are this machine's GPUs
TASKS = sorted(p.parent for p in (REPO / "suites").glob("*/*/task.toml"))


def _task(path: Path):
    return load_task(path / "task.toml", REPO / "suites")


def _outputs_as_expected(op, trial, case):
    want = op.expected(trial, case.count, case.dtype, case.world, case.params)
    got = []
    for rank, spec in enumerate(trial.outputs):
        # an output the oracle does not check (a rank that takes no part) stays zero
        got.append({name: _padded(want[rank].get(name, np.zeros(0)), shape, dtype)
                    for name, (shape, dtype) in spec.items()})
    return got


def _padded(value, shape, dtype):
    """The output buffer holding the answer (first, where the buffer has room for more)."""
    out = np.zeros(shape, dtype=dtype)
    value = np.asarray(value)
    if value.size == out.size:
        return value.astype(dtype).reshape(shape)
    if value.size:
        out[tuple(slice(0, n) for n in value.shape)] = value
    return out


def _events(world: int, delays: list[float]) -> list[dict[str, float]]:
    last = max(delays) if delays else 0.0
    # every rank leaves 10 s after the last one came: long enough for any op that checks a
    # call's duration (a timed wait), while the barrier test below makes a rank leave early
    return [{"t_enter": d, "t_exit": last + 10.0} for d in (delays or [0.0] * world)]


def _small(params: dict) -> dict:
    """A GEMM's parameters at most 512 deep (k) and 128 wide (n): the oracles are exact
    float64 GEMMs for every rank, and a 4096-deep or 4096-wide one at every world size took
    tens of seconds while telling the oracle's right from wrong no better (the right answer
    is exact, the wrong one 1% and a unit off: beyond the tolerance at any depth)."""
    if "k" in params and "n" in params:
        return {**params, "k": min(params["k"], 512), "n": min(params["n"], 128)}
    return params


@pytest.mark.parametrize("path", TASKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_oracle_works_at_every_world_size(path):
    task = _task(path)
    op = checks.get(task.check.op)
    if op.name in HOST_DEPENDENT:
        pytest.skip("the oracle reads this machine's GPUs")
    rng = np.random.default_rng(7)
    for world in sorted({2, 4, 8, *task.ranks}):
        for count in task.sizes[:2]:  # the smallest: the oracles are float64, some are GEMMs
            dtype = task.check.dtypes[0]
            case = op.make_case(rng, "c0", count, dtype, world, _small(task.check.params), 2, 4)
            trial = case.trials[0]
            good = _outputs_as_expected(op, trial, case)
            events = _events(world, trial.delays)
            where = f"{task.relpath} world {world} count {count}"
            assert op.verify(trial, good, events, case, task.check.rtol, task.check.atol) == [], where
            if not any(spec for spec in trial.outputs):
                # nothing to corrupt (a barrier): a rank that leaves early instead
                early = [dict(e) for e in events]
                late = int(np.argmax(trial.delays))
                early[(late + 1) % world]["t_exit"] = early[late]["t_enter"] - 1e-3
                assert op.verify(trial, good, early, case, task.check.rtol, task.check.atol), where
                continue
            bad = [{k: v.copy() for k, v in r.items()} for r in good]
            # the last rank's first output with a non-empty answer (a rank may receive nothing)
            want = op.expected(trial, case.count, case.dtype, case.world, case.params)
            rank, name = next((r, k) for r in reversed(range(world)) for k in trial.outputs[r]
                              if np.asarray(want[r].get(k, [])).size)
            flat = bad[rank][name].reshape(-1)
            # well beyond any tolerance: 1% and one unit off
            flat[0] = flat[0] + 3 if flat.dtype.kind in "iu" else flat[0] * 1.01 + 1
            assert op.verify(trial, bad, events, case, task.check.rtol, task.check.atol), where
            timed = op.timed_trial(rng, case)
            if any(not np.array_equal(a, trial.inputs[r][k])
                   for r, named in enumerate(timed.inputs) for k, a in named.items()):
                # a timed repetition's inputs are fresh: trial 0's answer does not answer it
                assert op.verify(timed, good, events, case, task.check.rtol,
                                 task.check.atol), where


def _topo_text(n: int, links: str = "NV18") -> str:
    header = "\t" + "\t".join(f"GPU{j}" for j in range(n)) + "\tCPU Affinity\tNUMA Affinity\n"
    rows = []
    for i in range(n):
        cells = ["X" if i == j else links for j in range(n)]
        rows.append(f"GPU{i}\t" + "\t".join(cells) + f"\t0-{n * 4 - 1}\t0\n")
    return header + "".join(rows) + "\nLegend:\n\n  X    = Self\n  NV#  = Connection ...\n"


def test_an_eight_gpu_nvswitch_box_gives_every_job_size_its_matrix():
    topo = parse_topo(_topo_text(8))
    assert topo.shape == (8, 8) and (np.diag(topo) == 0).all()
    assert (topo[~np.eye(8, dtype=bool)] == 18).all()
    for world in (2, 4, 8):
        m = job_matrix(topo, list(range(8)), world)
        assert m.shape == (world, world)
        assert (m == 18 * (1 - np.eye(world, dtype=np.int64))).all()


def test_a_job_matrix_that_depends_on_the_leased_gpus_is_refused():
    topo = parse_topo(_topo_text(4))
    topo[0, 1] = topo[1, 0] = 4  # one pair differs: which two GPUs a 2-rank job gets matters
    with pytest.raises(TopologyError, match="differs"):
        job_matrix(topo, list(range(4)), 2)
    assert job_matrix(topo, list(range(4)), 4)[0, 1] == 4  # all four: one answer
    with pytest.raises(TopologyError, match="sees only"):
        job_matrix(topo, [0, 1], 4)


@pytest.mark.parametrize("rtol, atol", [(0.0, 0.0), (1e-5, 1e-3)])
def test_compare_counts_every_wrong_element_across_chunks(monkeypatch, rtol, atol):
    from pytest_commbench.checks import base

    monkeypatch.setattr(base, "CHUNK", 7)  # many chunks, the wrong elements in several
    want = np.arange(50, dtype=np.float64) / 4
    got = want.astype(np.float32)
    assert base.compare(got, want, rtol, atol) is None
    got[[9, 10, 31]] += 1
    got[44] = np.nan  # never written
    msg = base.compare(got, want, rtol, atol)
    assert msg.startswith("4 of 50 elements wrong; first at index 9: got") and "3.25" in msg
    got[:] = np.nan
    assert "(poison: the element was never written)" in base.compare(got, want, rtol, atol)
    ints = np.arange(50, dtype=np.int64)
    assert base.compare(ints.reshape(5, 10), ints.reshape(5, 10), 0, 0) is None
    bad = ints.copy()
    bad[23] = -1
    assert base.compare(bad.reshape(5, 10), ints.reshape(5, 10), 0, 0).startswith(
        "1 of 50 elements wrong; first at index (2, 3)")


def test_untimed_phases_are_charged_beyond_the_reference_baseline():
    """A staged call's upload and fetch are not timed, but a job whose phases run
    systematically longer than the reference's (beyond the tolerance) is charged the excess:
    work hidden behind a false "done" is counted; one slow copy is not."""
    from pytest_commbench.observer import PHASE_TOLERANCE, Timing, charged, phase_baseline

    ref = [Timing(1e-3, 2e-3 + i * 1e-5, 3e-3 + i * 1e-5) for i in range(11)]
    base = phase_baseline(ref)
    assert base == pytest.approx((2e-3 + 5e-5, 3e-3 + 5e-5))
    assert charged(ref, base) == [1e-3] * 11  # the reference is never charged against itself
    # one fetch 5 ms long among ordinary ones: the median does not move
    spike = [Timing(1e-3, 2e-3, 3e-3)] * 4 + [Timing(1e-3, 2e-3, 8e-3)]
    assert charged(spike, base) == [1e-3] * 5
    # a false "done" after 0.1 ms, the other 1.9 ms of work in every fetch
    cheat = [Timing(1e-4, 2e-3, 3e-3 + 1.9e-3)] * 5
    frac, floor = PHASE_TOLERANCE
    want = 1e-4 + (3e-3 + 1.9e-3) - base[1] * (1 + frac) - floor
    assert charged(cheat, base) == pytest.approx([want] * 5)
    assert want > 1e-3  # slower than the honest call: no speedup left
    # no baseline (untimed jobs, the warm-up): the call alone
    assert charged(cheat, None) == [1e-4] * 5 and phase_baseline([]) is None


def test_the_last_trial_of_a_case_has_one_late_rank_unless_the_op_set_delays():
    from pytest_commbench.checks.base import LATE_S, make_late

    rng = np.random.default_rng(3)
    op = checks.get("allreduce")
    case = op.make_case(rng, "c0", 16, "float32", 4, {}, 2, 0)
    make_late(case, rng)
    assert not any(case.trials[0].delays)
    assert sorted(case.trials[-1].delays) == [0.0, 0.0, 0.0, LATE_S]
    barrier = checks.get("barrier")
    case = barrier.make_case(rng, "c0", 0, "uint8", 4, {}, 2, 0)
    before = [list(t.delays) for t in case.trials]
    make_late(case, rng)
    assert [list(t.delays) for t in case.trials] == before  # its own late ranks stay
    one = op.make_case(rng, "c0", 16, "float32", 4, {}, 1, 0)
    make_late(one, rng)  # a single trial stays on time (the others check the plain case)
    assert not any(one.trials[0].delays)
