"""Oracles of the NVSHMEM group of tasks: tickets drawn from one shared counter, a broadcast
whose root is a call argument, and a relay of computed tiles around the ring.

tickets(ctx, want, first)
    count = items per rank. Input `want` (count,) int32: item i of this rank needs want[i]
    consecutive tickets (1 <= want[i] <= 32). Output `first` (count,) in the case's integer
    dtype (int64): the first ticket of the item's range [first[i], first[i] + want[i]).
    Checked as a whole, not element by element: the ranges of every item of every rank in
    this call must tile [0, W) exactly, W = the sum of every rank's `want` (no gap, no
    overlap, nothing outside; which item gets which range is free). A poisoned element (the
    integer minimum) was never written.
    bytes = count * 4 (one rank's `want`), bus factor 1; the tasks report time.

bcast_rooted(ctx, sendbuf, recvbuf, root)
    As `bcast` (every rank's recvbuf, the root's included, equals the root's sendbuf bit for
    bit; every rank's sendbuf holds different data), with the root handed to the solution as a
    scalar argument (a C solution's ctx->params[0]). The op makes its own late trials: first
    one trial on time per root (random order), then for every held rank h (the rank
    `held_ranks` names for the case: every rank in turn on the first case) two calls on time
    with root h and a third with root h whose start is held back LATE_S, so the receivers run
    while the root has not even begun, and the two calls before it leave signals of the same
    parity of calls behind (a stale signal is taken for a fresh one there). The first case
    also holds back, once, a rank that is not the root (the one after it).
    bytes = count * itemsize, bus factor 1 (nccl-tests).

tile_relay(ctx, x, out)
    count = elements per rank (float). Every rank r produces y = 2 * x_r + 1 and sends it to
    rank (r + 1) % n, which outputs out = 3 * y - x (its own x): out_r = 3 * (2 * x_{r-1} + 1)
    - x_r with r - 1 taken mod n. The inputs are small multiples of 1/64 (`random_data`), so
    every step is exact in float32 and the output is compared bit for bit with the float64
    value.
    bytes = count * itemsize (the data a rank streams to its neighbour), bus factor 1.
"""

from __future__ import annotations

import numpy as np

from ..poison import poison_value
from .base import LATE_S, Case, Op, Trial, case_index, held_ranks, random_data
from .bcast import Bcast

MAX_WANT = 32  # tickets one item asks for at most


class Tickets(Op):
    name = "tickets"
    exact = True

    def args(self, params):
        return ["want", "first"]

    def make_trial(self, rng, count, dtype, world, params):
        inputs = [{"want": rng.integers(1, MAX_WANT, size=count, dtype=np.int32, endpoint=True)}
                  for _ in range(world)]
        outputs = [{"first": ((count,), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        """One right answer (rank by rank, item by item); any tiling is as right."""
        want = np.concatenate([named["want"].astype(np.int64) for named in trial.inputs])
        first = np.cumsum(want) - want
        return [{"first": first[r * count:(r + 1) * count].astype(dtype)} for r in range(world)]

    def verify(self, trial, got, events, case, rtol, atol):
        count, world = case.count, case.world
        poison = poison_value(case.dtype)
        errors = []
        firsts = []
        for rank in range(world):
            g = got[rank].get("first") if rank < len(got) else None
            if g is None:
                errors.append(f"rank {rank}: output 'first' missing")
                continue
            g = np.asarray(g).reshape(-1)
            if g.size != count:
                errors.append(f"rank {rank}: output 'first' has {g.size} elements, expected "
                              f"{count}")
                continue
            never = np.flatnonzero(g == poison)
            if never.size:
                errors.append(f"rank {rank}: output 'first': {never.size} of {count} items got "
                              f"no ticket; first at index {int(never[0])} (poison: the element "
                              "was never written)")
                continue
            firsts.append(g.astype(np.int64))
        if errors:
            return errors
        first = np.concatenate(firsts)
        want = np.concatenate([named["want"].astype(np.int64) for named in trial.inputs])
        total = int(want.sum())
        order = np.argsort(first, kind="stable")
        starts = first[order]
        sizes = want[order]
        # where each range must start when the ranges, in ticket order, tile [0, total)
        due = np.cumsum(sizes) - sizes
        wrong = np.flatnonzero(starts != due)
        if not wrong.size:
            return []
        p = int(wrong[0])
        item = int(order[p])
        rank, index = divmod(item, count)
        lo, hi = int(starts[p]), int(starts[p] + sizes[p])
        where = f"rank {rank} item {index} got tickets [{lo}, {hi})"
        if p == 0:
            why = f"the lowest ticket handed out is {lo}, expected 0"
        elif starts[p] < due[p]:
            other = int(order[p - 1])
            o_rank, o_index = divmod(other, count)
            why = (f"which overlaps rank {o_rank} item {o_index}'s "
                   f"[{int(starts[p - 1])}, {int(starts[p - 1] + sizes[p - 1])})")
        else:
            why = f"tickets [{int(due[p])}, {lo}) went to no item"
        return [f"the ranges of the {first.size} items (all ranks) do not tile [0, {total}): "
                f"{wrong.size} start where they should not; in ticket order, {where}, {why}"]

    def bytes(self, count, dtype, world, params):
        return count * 4, 1.0


class BcastRooted(Bcast):
    name = "bcast_rooted"

    def args(self, params):
        return ["sendbuf", "recvbuf", "root"]

    def make_case(self, rng, case_id, count, dtype, world, params, trials, reps):
        roots = rng.permutation(world).tolist()
        while len(roots) < trials:
            roots.append(int(rng.integers(world)))
        made = [self._trial(rng, count, dtype, world, root) for root in roots]
        case = Case(case_id, count, dtype, world, dict(params), self.args(params), made, op=self)
        index = case_index(case)
        for held in held_ranks(index, world):
            made.append(self._trial(rng, count, dtype, world, held))
            made.append(self._trial(rng, count, dtype, world, held))
            late = self._trial(rng, count, dtype, world, held)
            late.delays[held] = LATE_S
            made.append(late)
        if index == 0 and world > 1:
            root = int(rng.integers(world))
            late = self._trial(rng, count, dtype, world, root)
            late.delays[(root + 1) % world] = LATE_S
            made.append(late)
        return case


class TileRelay(Op):
    name = "tile_relay"
    exact = True

    def args(self, params):
        return ["x", "out"]

    def make_trial(self, rng, count, dtype, world, params):
        inputs = [{"x": random_data(rng, (count,), dtype)} for _ in range(world)]
        outputs = [{"out": ((count,), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        xs = [named["x"].astype(np.float64) for named in trial.inputs]
        return [{"out": 3.0 * (2.0 * xs[(r - 1) % world] + 1.0) - xs[r]} for r in range(world)]

    def bytes(self, count, dtype, world, params):
        return count * np.dtype(dtype).itemsize, 1.0


OPS = {"tickets": Tickets(), "bcast_rooted": BcastRooted(), "tile_relay": TileRelay()}
