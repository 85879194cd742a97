"""The oracles of the protocol tasks (LL words, port channel, device/host FIFOs, ring signal
loop): hand-checked expected outputs, and every mutant's kind of wrong output, simulated in
numpy, rejected by `verify`."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_commbench import checks
from pytest_commbench.checks.base import Case, Trial
from pytest_commbench.checks.protocols import ring_states


def _case(op, trial: Trial, count: int, dtype: str, params=None) -> Case:
    world = len(trial.inputs)
    return Case("c0", count, dtype, world, dict(params or {}), op.args(params or {}), [trial],
                op=op)


def _verify(op, trial, case, got):
    events = [{"t_enter": 0.0, "t_exit": 1e-4} for _ in range(case.world)]
    return op.verify(trial, got, events, case, 0.0, 0.0)


def _as_bytes_copied(right: np.ndarray, nbytes: int, poison) -> np.ndarray:
    """`right` after a copy of only its first `nbytes` bytes into a buffer full of `poison`."""
    got = np.full(right.shape, poison, dtype=right.dtype)
    got.view(np.uint8)[:nbytes] = right.view(np.uint8)[:nbytes]
    return got


# -- permute_scale_shift (utility/fifo_device_to_host) -------------------------------------

def test_permute_scale_shift_places_each_value_at_its_index():
    op = checks.get("permute_scale_shift")
    x = np.array([0.5, -1.0, 2.0, 0.015625], dtype=np.float32)
    idx = np.array([2, 0, 3, 1], dtype=np.int32)
    trial = Trial([{"x": x, "idx": idx}], [{"out": ((4,), "float32")}])
    want = op.expected(trial, 4, "float32", 1, {})[0]["out"]
    assert want.tolist() == [-1.0, 1.03125, 2.0, 5.0]
    case = _case(op, trial, 4, "float32")
    assert _verify(op, trial, case, [{"out": want.astype(np.float32)}]) == []


@pytest.fixture
def fifo_case():
    op = checks.get("permute_scale_shift")
    rng = np.random.default_rng(3)
    count = 1000
    case = op.make_case(rng, "c0", count, "float32", 2, {}, 1, 0)
    trial = case.trials[0]
    right = [{"out": w["out"].astype(np.float32)}
             for w in op.expected(trial, count, "float32", 2, {})]
    return op, case, trial, right


def test_permute_scale_shift_inputs_are_fresh_permutations(fifo_case):
    op, case, trial, _ = fifo_case
    for named in trial.inputs:
        assert named["idx"].dtype == np.int32
        assert sorted(named["idx"].tolist()) == list(range(case.count))
        assert (2 * named["x"].astype(np.float64) + 1 ==
                (2 * named["x"] + 1).astype(np.float64)).all()  # exact in float32
    assert not np.array_equal(trial.inputs[0]["idx"], trial.inputs[1]["idx"])
    assert _verify(op, trial, case, fifo_case[3]) == []


def test_values_in_arrival_order_are_rejected(fifo_case):
    op, case, trial, right = fifo_case
    # mutant order_as_index: out[k] = 2 x[k] + 1, the record's index ignored
    got = [{"out": (2 * t["x"] + 1).astype(np.float32)} for t in trial.inputs]
    errors = _verify(op, trial, case, got)
    assert len(errors) == 2 and all("elements wrong" in e for e in errors)


def test_records_lost_at_the_tail_are_rejected(fifo_case):
    op, case, trial, right = fifo_case
    # mutant records_floor32: the last count % 32 records never arrive; their places keep
    # what the staging buffer held (zeros on a first call)
    got = [{"out": r["out"].copy()} for r in right]
    for r, t in zip(got, trial.inputs):
        r["out"][t["idx"][case.count // 32 * 32:]] = 0.0
    assert len(_verify(op, trial, case, got)) == 2


def test_an_upload_of_count_bytes_is_rejected(fifo_case):
    op, case, trial, right = fifo_case
    # mutant upload_count_bytes: count bytes instead of count * 4 land in out
    got = [{"out": _as_bytes_copied(r["out"], case.count, np.nan)} for r in right]
    errors = _verify(op, trial, case, got)
    assert len(errors) == 2 and "poison" in errors[0]


# -- ring_recurrence (utility/signal_loop) -------------------------------------------------

def test_ring_recurrence_by_hand():
    op = checks.get("ring_recurrence")
    x = [np.array([1, -1], dtype=np.int32), np.array([2, 5], dtype=np.int32)]
    trial = Trial([{"x": a} for a in x], [{"out": ((2,), "int32")} for _ in x])
    # one step: s0 = 2*1 + 2 = 4, s1 = 2*2 + 1 = 5; the second element wraps:
    # s0 = 2*(2^32 - 1) + 5 = 3 (mod 2^32), s1 = 2*5 + (2^32 - 1) = 9
    one = op.expected(trial, 2, "int32", 2, {"iters": 1})
    assert [w["out"].tolist() for w in one] == [[4, 3], [5, 9]]
    # two steps: s0 = 2*4 + 5 = 13, s1 = 2*5 + 4 = 14; 2*3 + 9 = 15, 2*9 + 3 = 21
    two = op.expected(trial, 2, "int32", 2, {"iters": 2})
    assert [w["out"].tolist() for w in two] == [[13, 15], [14, 21]]
    case = _case(op, trial, 2, "int32", {"iters": 2})
    assert _verify(op, trial, case, [{"out": w["out"]} for w in two]) == []
    # three ranks: rank r adds rank r - 1's state; and a wrap to a negative int32
    x3 = [np.array([v], dtype=np.int32) for v in (1, 10, 2**30)]
    assert [s.tolist() for s in ring_states(x3, 1)] == [[2**30 + 2], [21], [-(2**31) + 10]]


@pytest.mark.parametrize("world", [2, 4, 8])
def test_ring_recurrence_keeps_every_bit_over_many_steps(world):
    # the step is a bijection: 64 steps never collapse inputs (an odd factor on the own
    # state, 3 s + m, zeroes the low bits for an even number of ranks)
    rng = np.random.default_rng(2)
    xs = [rng.integers(-(2**31), 2**31, size=512, dtype=np.int64).astype(np.int32)
          for _ in range(world)]
    out = ring_states(xs, 64)
    assert len(set(out[0].tolist())) == 512
    assert np.bitwise_or.reduce(out[0].view(np.uint32) & np.uint32(0xFFFF)) == 0xFFFF
    flipped = [x.copy() for x in xs]
    flipped[world - 1][7] ^= np.int32(1)
    assert not np.array_equal(ring_states(flipped, 64)[0][7], out[0][7])


def _simulate(xs, iters, message, right=None):
    """The recurrence with the message of step k (1-based) on rank r chosen by
    `message(states, right_states, k, r)`, where `states[j]` are the states after j steps of
    this run and `right_states[j]` those of a right run (`right`; default: this run's): a
    way to write a mutant's wrong reads. Returns (final states as int32, every step's
    states)."""
    n = len(xs)
    s = np.stack([x.view(np.uint32) for x in xs]).astype(np.uint32)
    history = [s.copy()]
    right = history if right is None else right
    for k in range(1, iters + 1):
        new = s.copy()
        for r in range(n):
            new[r] = s[r] * np.uint32(2) + message(history, right, k, r)
        s = new
        history.append(s.copy())
    return [row.view(np.int32).copy() for row in s], history


@pytest.mark.parametrize("world", [4, 8])
def test_ring_recurrence_mutants_are_rejected(world):
    op = checks.get("ring_recurrence")
    params = {"iters": 8}
    rng = np.random.default_rng(11)
    case = op.make_case(rng, "c0", 33, "int32", world, params, 1, 0)
    trial = case.trials[0]
    xs = [t["x"] for t in trial.inputs]
    right, history = _simulate(xs, 8, lambda h, rh, k, r: h[k - 1][(r - 1) % world])
    want = op.expected(trial, 33, "int32", world, params)
    assert all(np.array_equal(a, w["out"]) for a, w in zip(right, want))
    assert _verify(op, trial, case, [{"out": a} for a in right]) == []
    held = 1  # a wrong message there spreads to every rank after it
    zeros = np.zeros(33, np.uint32)
    wrong = {
        # counter_reset / polls_right_counter: the held rank's right neighbour reads its
        # mailbox before the held rank wrote it (an earlier call's message; here zeros)
        "stale": lambda h, rh, k, r: (zeros if r == (held + 1) % world and k == 1
                                      else h[k - 1][(r - 1) % world]),
        # no_credit: the held rank reads, at step 1, the message its left neighbour stored
        # for step 3 (its state after 2 steps, reached without the held rank)
        "overwritten": lambda h, rh, k, r: (rh[2][(r - 1) % world] if r == held and k == 1
                                            else h[k - 1][(r - 1) % world]),
        # the wrong neighbour's message (right instead of left)
        "direction": lambda h, rh, k, r: h[k - 1][(r + 1) % world],
    }
    for name, message in wrong.items():
        got, _ = _simulate(xs, 8, message, right=history)
        assert _verify(op, trial, case, [{"out": a} for a in got]), name


def test_ring_recurrence_refuses_other_dtypes_and_no_steps():
    op = checks.get("ring_recurrence")
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="int32"):
        op.make_trial(rng, 4, "float32", 2, {"iters": 2})
    with pytest.raises(ValueError, match="iters"):
        op.make_trial(rng, 4, "int32", 2, {"iters": 0})


# -- ring_exchange as the LL and port-channel tasks break it -------------------------------

@pytest.fixture
def ring_case():
    op = checks.get("ring_exchange")
    rng = np.random.default_rng(5)
    count = 1023
    case = op.make_case(rng, "c0", count, "float32", 4, {}, 2, 0)
    return op, case


def test_ring_exchange_rejects_the_ll_and_proxy_mutants(ring_case):
    op, case = ring_case
    old, trial = case.trials  # an earlier call's inputs, and this call's
    right = [{"recvbuf": trial.inputs[(r - 1) % 4]["sendbuf"].copy()} for r in range(4)]
    assert _verify(op, trial, case, right) == []
    # valid_bit_flag / parity_flag: one receiver unpacks an earlier call's words
    stale = [dict(r) for r in right]
    stale[2] = {"recvbuf": old.inputs[1]["sendbuf"].copy()}
    assert len(_verify(op, trial, case, stale)) == 1
    # odd_tail_dropped: the last float of an odd count is never moved (NaN poison)
    tail = [{"recvbuf": r["recvbuf"].copy()} for r in right]
    for r in tail:
        r["recvbuf"][-1] = np.nan
    errors = _verify(op, trial, case, tail)
    assert len(errors) == 4 and "index 1022" in errors[0]
    # bytes_as_count: count bytes of the message are copied; chunks_floor / stale_flags:
    # nothing lands (or it is overwritten by the poison)
    short = [{"recvbuf": _as_bytes_copied(r["recvbuf"], case.count, np.nan)} for r in right]
    assert len(_verify(op, trial, case, short)) == 4
    nothing = [{"recvbuf": np.full(case.count, np.nan, np.float32)} for _ in right]
    assert len(_verify(op, trial, case, nothing)) == 4


def test_scale_shift_rejects_the_host_to_device_fifo_mutants():
    op = checks.get("scale_shift")
    rng = np.random.default_rng(9)
    count = 4099
    case = op.make_case(rng, "c0", count, "float32", 2, {}, 1, 0)
    trial = case.trials[0]
    right = [{"out": (2 * t["x"] + 1).astype(np.float32)} for t in trial.inputs]
    assert _verify(op, trial, case, right) == []
    # tail_dropped: the last n % 4 elements stay NaN
    tail = [{"out": r["out"].copy()} for r in right]
    for r in tail:
        r["out"][count // 4 * 4:] = np.nan
    assert len(_verify(op, trial, case, tail)) == 2
    # chunk_count_floor / static_item_count: the partial last chunk (here the whole of it)
    # is never pushed
    assert len(_verify(op, trial, case, [{"out": np.full(count, np.nan, np.float32)}] * 2)) == 2
