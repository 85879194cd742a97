"""The oracles of the rank-local CUDA utility tasks (checks/cuda_util.py): small hand-checked
cases, and each mutant's way of being wrong, simulated in numpy, rejected."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_commbench import checks
from pytest_commbench.checks import cuda_util
from pytest_commbench.checks.base import Case, Trial, poison_value


def _case(op, count, dtype, world, trials=2, seed=5):
    return op.make_case(np.random.default_rng(seed), "c1", count, dtype, world, {}, trials, 0)


def _verify(op, trial, got, case, events=None):
    if events is None:
        events = [{"t_enter": 0.0, "t_exit": 1.0} for _ in range(case.world)]
    return op.verify(trial, got, events, case, 0.0, 0.0)


# -- copy ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["uint8", "int32", "float32"])
def test_copy_wants_the_input_and_never_draws_the_poison(dtype):
    op = checks.get("copy")
    case = _case(op, 5000, dtype, 2)
    trial = case.trials[0]
    want = op.expected(trial, case.count, dtype, 2, {})
    for rank in range(2):
        x = trial.inputs[rank]["x"]
        assert x.dtype == np.dtype(dtype) and x.shape == (5000,)
        assert np.array_equal(want[rank]["out"], x, equal_nan=False)
        assert not (x == poison_value(dtype)).any()
        if dtype == "uint8":
            assert x.max() == 254 and x.min() == 0  # the whole range but the poison
    assert not np.array_equal(trial.inputs[0]["x"], trial.inputs[1]["x"])
    assert _verify(op, trial, want, case) == []
    assert op.bytes(5000, dtype, 2, {}) == (5000 * np.dtype(dtype).itemsize, 1.0)


def _bounced(x, chunk, slots, bug):
    """What the bounce-copy mutants leave in `out` (0xFF where they write nothing)."""
    n = x.size
    out = np.full(n, 0xFF, dtype=np.uint8)
    staging = np.zeros((slots, chunk), dtype=np.uint8)
    chunks = n // chunk if bug == "tail_dropped" else -(-n // chunk)
    for i in range(chunks):
        s, off = i % slots, i * chunk
        piece = x[off:off + chunk]
        staging[s, :piece.size] = piece
        if bug == "wrong_slot":
            piece = staging[(s + 1) % slots, :piece.size]
        at = s * chunk if bug == "out_at_slot_offset" else off
        out[at:at + piece.size] = piece
    return out


@pytest.mark.parametrize("bug", ["tail_dropped", "wrong_slot", "out_at_slot_offset"])
def test_the_bounce_copy_mutants_are_rejected(bug):
    op = checks.get("copy")
    chunk, slots = 64, 4  # the mutants' pattern, scaled down: 1 + 4 * 64 + 3 bytes of staging
    case = _case(op, 9 * chunk + 7, "uint8", 2)
    trial = case.trials[0]
    right = [{"out": _bounced(t["x"], chunk, slots, None)} for t in trial.inputs]
    assert _verify(op, trial, right, case) == []
    wrong = [{"out": _bounced(t["x"], chunk, slots, bug)} for t in trial.inputs]
    errors = _verify(op, trial, wrong, case)
    assert len(errors) == 2 and all("output 'out'" in e for e in errors)


# -- offset_copy --------------------------------------------------------------------------

def test_offset_copy_of_a_hand_checked_range():
    op = checks.get("offset_copy")
    x = np.arange(10, 20, dtype=np.uint8)
    trial = Trial([{"x": x}], [{"out": ((10,), "uint8")}],
                  [{"src_offset": 3, "dst_offset": 1, "length": 4}], [0.0])
    case = Case("c0", 10, "uint8", 1, {}, op.args({}), [trial], op=op)
    want = op.expected(trial, 10, "uint8", 1, {})[0]["out"]
    assert want.tolist() == [255, 13, 14, 15, 16, 255, 255, 255, 255, 255]
    assert _verify(op, trial, [{"out": want}], case) == []
    clobbered = want.copy()
    clobbered[5] = 17  # one byte past the range
    assert _verify(op, trial, [{"out": clobbered}], case)
    assert op.args({}) == ["x", "out", "src_offset", "dst_offset", "length"]


@pytest.mark.parametrize("count", [1, 2, 16, 77, 125, 126, 65553])
def test_offset_copy_ranges_stay_inside_the_buffers(count):
    op = checks.get("offset_copy")
    rng = np.random.default_rng(count)
    for _ in range(50):
        trial = op.make_trial(rng, count, "uint8", 3, {})
        for named, e in zip(trial.inputs, trial.extra):
            assert named["x"].max(initial=0) < 0xFF
            src, dst, length = e["src_offset"], e["dst_offset"], e["length"]
            assert 0 <= src <= min(63, count - 1) and 0 <= dst <= min(63, count - 1)
            assert length >= 1 and src + length <= count and dst + length <= count
            assert count - max(src, dst) - length <= 15


@pytest.mark.parametrize("count", [126, 200, 65553])
def test_the_first_trial_of_a_case_is_misaligned_every_way(count):
    op = checks.get("offset_copy")
    for seed in range(20):
        case = _case(op, count, "uint8", 4, seed=seed)
        for e in case.trials[0].extra:
            src, dst, length = e["src_offset"], e["dst_offset"], e["length"]
            end = dst + length
            assert src % 16 and dst % 16 and src % 16 != dst % 16
            assert end % 16 and end < count and src + length < count and length >= 32


def _vector_copy(x, src, dst, length, count, bug=None):
    """The reference's head / 16-byte body / tail split, with a mutant's bug."""
    out = np.full(count, 0xFF, dtype=np.uint8)
    head = min((16 - dst % 16) % 16, length)
    words = (length - head) // 16
    tail = length - head - 16 * words
    k = (src + head) % 16 if bug != "shift_from_offset" else src % 16
    base = src + head - (src + head) % 16  # the aligned source word of the body's first byte
    for w in range(words):
        pair = x[base + 16 * w: base + 16 * w + 32]
        out[dst + head + 16 * w: dst + head + 16 * w + 16] = pair[k:k + 16]
    if bug != "head_dropped":
        out[dst:dst + head] = x[src:src + head]
    if bug != "tail_dropped":
        last = tail + 1 if bug == "tail_one_past" else tail
        at = head + 16 * words
        out[dst + at: dst + at + last] = x[src + at: src + at + last]
    return out


@pytest.mark.parametrize("bug", ["head_dropped", "tail_dropped", "tail_one_past",
                                 "shift_from_offset"])
def test_the_vectorized_copy_mutants_are_rejected_on_the_first_trial(bug):
    op = checks.get("offset_copy")
    count = 200
    case = _case(op, count, "uint8", 2)
    trial = case.trials[0]

    def outputs(which):
        got = []
        for named, e in zip(trial.inputs, trial.extra):
            x = np.concatenate([named["x"], np.zeros(48, np.uint8)])  # the words past the end
            got.append({"out": _vector_copy(x, e["src_offset"], e["dst_offset"], e["length"],
                                            count, which)})
        return got

    assert _verify(op, trial, outputs(None), case) == []
    errors = _verify(op, trial, outputs(bug), case)
    assert len(errors) == 2, errors


# -- timed_wait ---------------------------------------------------------------------------

def test_timed_wait_requests_are_in_range_with_a_long_one_in_every_call():
    op = checks.get("timed_wait")
    rng = np.random.default_rng(2)
    for count in (1, 7, 1000):
        for _ in range(20):
            trial = op.make_trial(rng, count, "int64", 2, {})
            for named in trial.inputs:
                ns = named["ns"]
                assert ns.dtype == np.int64 and ns.shape == (count,)
                assert ns.min() >= 1_000 and ns.max() <= 2_000_000
                assert ns.max() >= cuda_util.LONG_NS
    trial = op.make_trial(rng, 40000, "int64", 1, {})
    ns = trial.inputs[0]["ns"]
    assert (ns < 10_000).mean() > 0.2 and (ns > 200_000).mean() > 0.2  # log-uniform


def _wait_case(count=64, world=2):
    op = checks.get("timed_wait")
    case = _case(op, count, "int64", world)
    return op, case, case.trials[0]


def _long_events(trial):
    return [{"t_enter": 1.0, "t_exit": 1.0 + 1e-9 * float(t["ns"].max()) + 1e-4}
            for t in trial.inputs]


def test_timed_wait_accepts_waits_from_the_request_to_20_ms_later():
    op, case, trial = _wait_case()
    events = _long_events(trial)
    for extra in (0, 37, 1_000_000, cuda_util.WAIT_SLACK_NS):
        got = [{"elapsed": t["ns"] + extra} for t in trial.inputs]
        assert _verify(op, trial, got, case, events) == [], extra
    latest = op.expected(trial, case.count, case.dtype, case.world, {})
    assert _verify(op, trial, latest, case, events) == []
    one_more = [{"elapsed": w["elapsed"] + 1} for w in latest]
    assert "more than 20 ms longer" in _verify(op, trial, one_more, case, events)[0]


def test_timed_wait_rejects_each_mutant():
    op, case, trial = _wait_case()
    events = _long_events(trial)
    # single_nap: a nap lasts at most about 1 ms
    nap = [{"elapsed": np.minimum(t["ns"], 1_000_000 + 5_000)} for t in trial.inputs]
    assert all("shorter than requested" in e for e in _verify(op, trial, nap, case, events))
    # elapsed_in_us
    us = [{"elapsed": (t["ns"] + 3_000) // 1000} for t in trial.inputs]
    assert len(_verify(op, trial, us, case, events)) == 2
    # requests_as_int32: entry b waits for 32-bit word b (odd entries: the high halves, 0)
    halves = [{"elapsed": t["ns"].view(np.int32)[:t["ns"].size].astype(np.int64) + 500}
              for t in trial.inputs]
    assert len(_verify(op, trial, halves, case, events)) == 2
    # never written
    poison = [{"elapsed": np.full(case.count, poison_value(np.int64))} for _ in trial.inputs]
    assert all("never written" in e for e in _verify(op, trial, poison, case, events))
    # no_wait: the requests as the answer, in a call far shorter than its longest request
    honest_numbers = [{"elapsed": t["ns"].copy()} for t in trial.inputs]
    quick = [{"t_enter": 1.0, "t_exit": 1.0 + 60e-6} for _ in trial.inputs]
    errors = _verify(op, trial, honest_numbers, case, quick)
    assert len(errors) == 2 and all("cannot have waited" in e for e in errors)


# -- device_attributes --------------------------------------------------------------------

H200 = {
    "compute capability major": 9, "compute capability minor": 0, "warp size (threads)": 32,
    "max threads per block": 1024, "max block dimension x": 1024,
    "max grid dimension x": 2**31 - 1,
    "max shared memory per block without opt-in (bytes)": 49152,
    "max shared memory per block with opt-in (bytes)": 232448,
    "max shared memory per multiprocessor (bytes)": 233472,
    "max 32-bit registers per block": 65536, "max resident threads per multiprocessor": 2048,
    "max resident blocks per multiprocessor": 32, "L2 cache size (bytes)": 62914560,
    "global memory bus width (bits)": 6144, "total global memory (bytes)": 150754820096,
    "ECC enabled": 1, "unified addressing": 1, "concurrent managed access": 1,
    "pageable memory access": 0, "cooperative launch": 1, "cluster launch": 1,
    "host native atomics": 0,
}
ROW = [H200[name] for name, _ in cuda_util.ATTRIBUTES]


@pytest.fixture
def fake_gpus(monkeypatch):
    gpus = [list(ROW), list(ROW)]
    monkeypatch.setattr(cuda_util, "query_gpus", lambda: [list(r) for r in gpus])
    cuda_util._expected_row.cache_clear()
    yield gpus
    cuda_util._expected_row.cache_clear()


def _index(name):
    return [n for n, _ in cuda_util.ATTRIBUTES].index(name)


def test_the_attribute_list_names_every_entry_once_and_leaves_out_the_sm_count():
    names = [n for n, _ in cuda_util.ATTRIBUTES]
    codes = [c for _, c in cuda_util.ATTRIBUTES]
    assert len(names) == len(set(names)) == 22 == len(H200)
    assert 16 not in codes  # the multiprocessor count: an MPS client sees its share
    assert codes.count(None) == 1 and codes[_index("total global memory (bytes)")] is None
    assert codes[:2] == [75, 76] and codes[_index("L2 cache size (bytes)")] == 38


def test_device_attributes_expects_the_drivers_row_on_every_rank(fake_gpus):
    op = checks.get("device_attributes")
    case = _case(op, 0, "int64", 4)
    trial = case.trials[0]
    assert trial.inputs == [{}, {}, {}, {}]
    assert trial.outputs[0] == {"attrs": ((22,), "int64")}
    want = op.expected(trial, 0, "int64", 4, {})
    assert [w["attrs"].tolist() for w in want] == [ROW] * 4
    assert _verify(op, trial, want, case) == []


@pytest.mark.parametrize("bug", ["cc_swapped", "l2_in_kib", "smem_optin_default",
                                 "first_call_only"])
def test_device_attributes_rejects_each_mutant(fake_gpus, bug):
    op = checks.get("device_attributes")
    case = _case(op, 0, "int64", 2)
    trial = case.trials[1]
    row = np.asarray(ROW, dtype=np.int64)
    bad = row.copy()
    if bug == "cc_swapped":
        bad[[0, 1]] = bad[[1, 0]]
    elif bug == "l2_in_kib":
        bad[_index("L2 cache size (bytes)")] //= 1024
    elif bug == "smem_optin_default":
        bad[_index("max shared memory per block with opt-in (bytes)")] = 49152
    else:  # nothing written after the first call: the poison
        bad[:] = poison_value(np.int64)
    got = [{"attrs": row.copy()}, {"attrs": bad}]
    errors = _verify(op, trial, got, case)
    assert len(errors) == 1 and errors[0].startswith("rank 1: output 'attrs'")


def test_gpus_that_differ_leave_the_answer_unknown(fake_gpus):
    fake_gpus[1][_index("L2 cache size (bytes)")] = 50331648  # an H100's 48 MiB
    with pytest.raises(cuda_util.AttributeQueryError, match="L2 cache size"):
        checks.get("device_attributes").make_trial(np.random.default_rng(0), 0, "int64", 2, {})
    with pytest.raises(cuda_util.AttributeQueryError, match="no GPU"):
        cuda_util.common_row([])


def test_the_driver_query_answers_or_says_why_not():
    """On a machine without a GPU the child process reports the reason; with one, a row of
    every attribute per GPU."""
    try:
        gpus = cuda_util.query_gpus()
    except cuda_util.AttributeQueryError as exc:
        assert "device_attributes" in str(exc)
    else:
        assert gpus and all(len(row) == len(cuda_util.ATTRIBUTES) for row in gpus)
