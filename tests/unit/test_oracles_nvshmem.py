"""The oracles of the NVSHMEM tasks on hand-checked cases, and the outputs of each task's
known-wrong solutions (simulated in numpy) rejected: tickets whose counter is never set back,
counts on every rank's own counter, or is zeroed while in use; a broadcast with a stale slot,
rooted at rank 0, or without its tail; a tile relay fed stale or overwritten tiles; and the
reused ring_exchange and allreduce oracles on the put-with-signal and all-reduce mutants."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_commbench import checks
from pytest_commbench.checks.base import LATE_S, Case, Trial

WORLDS = (2, 4, 8)


def _case(op, count, dtype, world, trials=2, case_id="c0"):
    rng = np.random.default_rng(11)
    return op.make_case(rng, case_id, count, dtype, world, {}, trials, 0)


def _check(op, trial, case, got):
    return op.verify(trial, got, [], case, 0.0, 0.0)


# -- tickets ------------------------------------------------------------------------------

def _tickets_case(wants: list[list[int]]) -> tuple[Trial, Case]:
    world, count = len(wants), len(wants[0])
    trial = Trial([{"want": np.array(w, dtype=np.int32)} for w in wants],
                  [{"first": ((count,), "int64")} for _ in range(world)])
    case = Case("c0", count, "int64", world, {}, ["want", "first"], [trial])
    return trial, case


def _firsts(*rows):
    return [{"first": np.array(r, dtype=np.int64)} for r in rows]


def test_tickets_expected_is_rank_by_rank_prefix_sums():
    op = checks.get("tickets")
    trial, case = _tickets_case([[3, 1, 2], [4, 1, 5]])
    want = op.expected(trial, 3, "int64", 2, {})
    assert want[0]["first"].tolist() == [0, 3, 4]
    assert want[1]["first"].tolist() == [6, 10, 11]
    assert _check(op, trial, case, want) == []


def test_tickets_any_tiling_passes():
    op = checks.get("tickets")
    trial, case = _tickets_case([[3, 1, 2], [4, 1, 5]])
    # rank 1 first, its items 2, 1, 0 taking [0, 5), [5, 6), [6, 10); then rank 0's items
    # 1, 2, 0 taking [10, 11), [11, 13), [13, 16): W = 16
    got = _firsts([13, 10, 11], [6, 5, 0])
    assert _check(op, trial, case, got) == []


def test_tickets_reject_a_counter_never_set_back():
    op = checks.get("tickets")
    trial, case = _tickets_case([[3, 1, 2], [4, 1, 5]])
    good = op.expected(trial, 3, "int64", 2, {})
    stale = [{"first": g["first"] + 37} for g in good]  # started where an earlier call ended
    errors = _check(op, trial, case, stale)
    assert errors and "lowest ticket handed out is 37, expected 0" in errors[0]


def test_tickets_reject_a_counter_per_rank():
    op = checks.get("tickets")
    trial, case = _tickets_case([[3, 1, 2], [4, 1, 5]])
    own = _firsts([0, 3, 4], [0, 4, 5])  # each rank counted from 0 on its own counter
    errors = _check(op, trial, case, own)
    assert errors and "overlaps" in errors[0]


def test_tickets_reject_a_counter_zeroed_while_in_use():
    op = checks.get("tickets")
    trial, case = _tickets_case([[3, 1, 2], [4, 1, 5]])
    # rank 1 took [0, 10) first; held-back PE 0 then zeroed the counter and took from 0 again
    late = _firsts([0, 3, 4], [0, 4, 5])
    assert _check(op, trial, case, late)
    gap = _firsts([0, 3, 4], [7, 11, 12])  # tickets [6, 7) went to no item
    errors = _check(op, trial, case, gap)
    assert errors and "went to no item" in errors[0]


def test_tickets_reject_poison_and_missing_outputs():
    op = checks.get("tickets")
    trial, case = _tickets_case([[3, 1, 2], [4, 1, 5]])
    got = op.expected(trial, 3, "int64", 2, {})
    got[1]["first"] = got[1]["first"].copy()
    got[1]["first"][2] = np.iinfo(np.int64).min
    errors = _check(op, trial, case, got)
    assert errors and "never written" in errors[0] and errors[0].startswith("rank 1")
    assert _check(op, trial, case, [got[0], {}]) == ["rank 1: output 'first' missing"]


@pytest.mark.parametrize("world", WORLDS)
def test_tickets_random_trials_tile_and_shuffles_stay_right(world):
    op = checks.get("tickets")
    case = _case(op, 1023, "int64", world)
    trial = case.trials[0]
    want = np.concatenate([t["want"] for t in trial.inputs])
    assert want.min() >= 1 and want.max() <= 32
    # tickets in a random item order: still a tiling
    rng = np.random.default_rng(5)
    order = rng.permutation(want.size)
    first = np.empty(want.size, dtype=np.int64)
    first[order] = np.cumsum(want[order]) - want[order]
    got = [{"first": first[r * 1023:(r + 1) * 1023]} for r in range(world)]
    assert _check(op, trial, case, got) == []
    got[-1]["first"] = got[-1]["first"].copy()
    got[-1]["first"][7] += 1
    assert _check(op, trial, case, got)


# -- bcast_rooted ---------------------------------------------------------------------------

@pytest.mark.parametrize("world", WORLDS)
def test_bcast_rooted_trials_hold_the_root_after_two_calls_with_it(world):
    op = checks.get("bcast_rooted")
    assert op.args({}) == ["sendbuf", "recvbuf", "root"]
    case = _case(op, 5, "float32", world)
    on_time = case.trials[:world]
    assert sorted(t.extra[0]["root"] for t in on_time) == list(range(world))
    assert not any(any(t.delays) for t in on_time)
    late = [k for k, t in enumerate(case.trials) if any(t.delays)]
    held_roots = []
    for k in late:
        t = case.trials[k]
        held = int(np.argmax(t.delays))
        assert t.delays[held] == LATE_S and sum(d > 0 for d in t.delays) == 1
        root = t.extra[0]["root"]
        if held == root:
            held_roots.append(root)
            # the two calls before have the same root (a slot of the same parity was filled)
            assert case.trials[k - 1].extra[0]["root"] == root
            assert case.trials[k - 2].extra[0]["root"] == root
            assert not any(case.trials[k - 1].delays) and not any(case.trials[k - 2].delays)
        else:
            assert held == (root + 1) % world
    assert sorted(held_roots) == list(range(world))  # the first case holds every root
    assert len(late) == world + 1
    later = _case(op, 5, "float32", world, case_id="c3")
    held = [int(np.argmax(t.delays)) for t in later.trials if any(t.delays)]
    assert held == [3 % world]
    assert later.trials[-1].extra[0]["root"] == 3 % world


def test_bcast_rooted_rejects_stale_slots_root_zero_and_a_lost_tail():
    op = checks.get("bcast_rooted")
    world = 4
    case = _case(op, 1023, "float32", world)
    k = next(k for k, t in enumerate(case.trials)
             if t.extra[0]["root"] == 2 and not any(t.delays))
    trial = case.trials[k]
    want = op.expected(trial, case.count, case.dtype, world, {})
    assert all(np.array_equal(w["recvbuf"], trial.inputs[2]["sendbuf"]) for w in want)
    assert _check(op, trial, case, want) == []
    # a receiver that copied its slot before the held root wrote it: the call before's data
    before = case.trials[k - 1]
    stale = [dict(w) for w in want]
    stale[3] = {"recvbuf": before.inputs[before.extra[0]["root"]]["sendbuf"].copy()}
    assert _check(op, trial, case, stale)
    # the tree rooted at rank 0 whatever the root: rank 0's data everywhere
    zero = [{"recvbuf": trial.inputs[0]["sendbuf"].copy()} for _ in range(world)]
    assert _check(op, trial, case, zero)
    # the last partial chunk never sent: poison (NaN) past the last full chunk
    tail = [{"recvbuf": w["recvbuf"].copy()} for w in want]
    for t in tail:
        t["recvbuf"][:] = np.nan
    errors = _check(op, trial, case, tail)
    assert len(errors) == world and "never written" in errors[0]


# -- tile_relay -----------------------------------------------------------------------------

def test_tile_relay_expected_by_hand():
    op = checks.get("tile_relay")
    x0 = np.array([0.5, -1.0, 2.25], dtype=np.float32)
    x1 = np.array([1.0, 0.015625, -7.984375], dtype=np.float32)
    trial = Trial([{"x": x0}, {"x": x1}], [{"out": ((3,), "float32")} for _ in range(2)])
    case = Case("c0", 3, "float32", 2, {}, ["x", "out"], [trial])
    want = op.expected(trial, 3, "float32", 2, {})
    # rank 0 consumes rank 1's y = 2 x1 + 1; rank 1 consumes rank 0's
    assert want[0]["out"].tolist() == [3 * 3.0 - 0.5, 3 * 1.03125 + 1.0, 3 * -14.96875 - 2.25]
    assert want[1]["out"].tolist() == [3 * 2.0 - 1.0, 3 * -1.0 - 0.015625, 3 * 5.5 + 7.984375]
    assert _check(op, trial, case, want) == []


@pytest.mark.parametrize("world", WORLDS)
def test_tile_relay_float32_arithmetic_is_exact_and_wrong_tiles_are_caught(world):
    op = checks.get("tile_relay")
    tile = 16
    case = _case(op, 5 * tile + 3, "float32", world)
    trial, other = case.trials[0], case.trials[1]
    xs = [t["x"] for t in trial.inputs]
    assert all((np.abs(x) <= 8).all() and (x * 64 == np.round(x * 64)).all() for x in xs)
    # what a kernel computes in float32, fused multiply-adds or not
    y = [np.float32(2) * x + np.float32(1) for x in xs]
    got = [{"out": np.float32(3) * y[(r - 1) % world] - xs[r]} for r in range(world)]
    assert _check(op, trial, case, got) == []
    # a consumer that read a tile before its producer wrote it: the call before's tile
    ys_old = [np.float32(2) * t["x"] + np.float32(1) for t in other.inputs]
    stale = [{"out": g["out"].copy()} for g in got]
    stale[1]["out"][:tile] = np.float32(3) * ys_old[0][:tile] - xs[1][:tile]
    assert _check(op, trial, case, stale)
    # a producer that did not wait for a slot's release: tile t replaced by tile t + 4 (a
    # ring of 4 here)
    over = [{"out": g["out"].copy()} for g in got]
    over[0]["out"][:tile] = np.float32(3) * y[world - 1][4 * tile:5 * tile] - xs[0][:tile]
    assert _check(op, trial, case, over)
    # the last, partial tile never produced
    short = [{"out": g["out"].copy()} for g in got]
    short[-1]["out"][5 * tile:] = np.nan
    errors = _check(op, trial, case, short)
    assert errors and "never written" in errors[0]


# -- the reused oracles on the mutants of put-with-signal and all-reduce --------------------

@pytest.mark.parametrize("world", WORLDS)
def test_ring_exchange_rejects_a_stale_slot_and_a_dropped_chunk(world):
    op = checks.get("ring_exchange")
    case = _case(op, 1023, "float32", world)
    trial, before = case.trials[1], case.trials[0]
    good = op.expected(trial, 1023, "float32", world, {})
    assert _check(op, trial, case, good) == []
    stale = [dict(g) for g in good]
    stale[1 % world] = {"recvbuf": before.inputs[0]["sendbuf"].copy()}  # the slot's old data
    assert _check(op, trial, case, stale)
    dropped = [{"recvbuf": np.full(1023, np.nan, dtype=np.float32)} for _ in range(world)]
    assert len(_check(op, trial, case, dropped)) == world


@pytest.mark.parametrize("world", WORLDS)
def test_allreduce_rejects_a_stale_piece_and_a_dropped_tail(world):
    op = checks.get("allreduce")
    case = _case(op, 1023, "float32", world)
    trial, before = case.trials[1], case.trials[0]
    xs = [t["sendbuf"] for t in trial.inputs]
    total = np.zeros(1023, dtype=np.float32)
    for x in xs:
        total += x
    got = [{"recvbuf": total.copy()} for _ in range(world)]
    assert op.verify(trial, got, [], case, 1e-6, 1e-6) == []
    # the held rank's piece of every segment from the call before
    stale_sum = total - xs[world - 1] + before.inputs[world - 1]["sendbuf"]
    stale = [{"recvbuf": stale_sum.copy()} for _ in range(world)]
    assert len(op.verify(trial, stale, [], case, 1e-6, 1e-6)) == world
    tail = [{"recvbuf": total.copy()} for _ in range(world)]
    tail[0]["recvbuf"][-3:] = np.nan
    assert op.verify(trial, tail, [], case, 1e-6, 1e-6)
