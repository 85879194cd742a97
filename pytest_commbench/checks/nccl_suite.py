"""Oracles of the NCCL-and-IPC group of tasks: a periodic halo exchange, an all-reduce inside
sub-communicators, and a produce/consume ring ordered across processes.

halo_exchange(ctx, field, ghost_left, ghost_right, rows, halo)
    count = the row length. Each rank owns a block of a 2-D grid decomposed along its rows
    (periodic): `field`, (rows, count), row-major, an input. Parameters: `rows` (>= 1) and
    `halo` (the halo width in rows, 1 <= halo <= rows).
    outputs  ghost_left (halo, count): the LAST `halo` rows of rank (r - 1) % n's field;
             ghost_right (halo, count): the FIRST `halo` rows of rank (r + 1) % n's field.
    Pure data movement, compared bit for bit. With two ranks both neighbours are the same
    rank (the two messages between a pair must not be mixed up); with one rank, itself.
    bytes = 2 * halo * count * itemsize (what one rank sends), bus factor 1.

split_allreduce(ctx, sendbuf, recvbuf, groups, blocked)
    count = elements per buffer. The ranks form `groups` (G) groups: rank r belongs to group
    r % G (`blocked` = 0: interleaved, ranks g, g + G, g + 2G, ...), or to group
    r // (n / G) (`blocked` = 1: consecutive blocks of n / G ranks; G must divide n).
    output   recvbuf (count,): the element-wise sum of the sendbufs of the ranks of this
             rank's group, against a float64 sum, with the rounding bound of a sum in the
             dtype in any order added to atol (as allreduce).
    bytes = count * itemsize; bus factor 2(g-1)/g for the largest group's size g.

ring_produce_consume(ctx, x, stage, out)
    count = elements per buffer (float). Every rank produces stage = 2 * x (exact in binary
    floating point) and consumes its left neighbour's: out = stage[(r - 1) % n] + x[r], one
    rounding in the dtype (checked against float64 with the manifest's rtol/atol; one
    float32 rounding is within rtol = 2^-23).
    outputs  stage (count,), out (count,).
    bytes = count * itemsize (the message a rank consumes), bus factor 1.
"""

from __future__ import annotations

import numpy as np

from .base import Op, Trial, full_random, sum_slack


def _halo_params(params) -> tuple[int, int]:
    rows = int(params.get("rows", 8))
    halo = int(params.get("halo", 1))
    if rows < 1 or not 1 <= halo <= rows:
        raise ValueError(f"halo_exchange needs 1 <= halo <= rows, got rows={rows} halo={halo}")
    return rows, halo


class HaloExchange(Op):
    name = "halo_exchange"
    exact = True

    def args(self, params):
        return ["field", "ghost_left", "ghost_right", "rows", "halo"]

    def make_trial(self, rng, count, dtype, world, params):
        rows, halo = _halo_params(params)
        inputs = [{"field": full_random(rng, (rows, count), dtype)} for _ in range(world)]
        outputs = [{"ghost_left": ((halo, count), dtype), "ghost_right": ((halo, count), dtype)}
                   for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        rows, halo = _halo_params(params)
        fields = [named["field"] for named in trial.inputs]
        return [{"ghost_left": fields[(r - 1) % world][rows - halo:].copy(),
                 "ghost_right": fields[(r + 1) % world][:halo].copy()}
                for r in range(world)]

    def bytes(self, count, dtype, world, params):
        _rows, halo = _halo_params(params)
        return 2 * halo * count * np.dtype(dtype).itemsize, 1.0


def split_groups(world: int, params) -> list[int]:
    """The group of every rank (split_allreduce's coloring)."""
    groups = int(params.get("groups", 2))
    blocked = int(params.get("blocked", 0))
    if not 1 <= groups <= world:
        raise ValueError(f"split_allreduce needs 1 <= groups <= world size, got groups={groups} "
                         f"at {world} ranks")
    if blocked:
        if world % groups:
            raise ValueError(f"blocked groups need groups={groups} to divide the world size "
                             f"{world}")
        size = world // groups
        return [r // size for r in range(world)]
    return [r % groups for r in range(world)]


class SplitAllReduce(Op):
    name = "split_allreduce"

    def args(self, params):
        return ["sendbuf", "recvbuf", "groups", "blocked"]

    def make_trial(self, rng, count, dtype, world, params):
        split_groups(world, params)  # a bad parameter fails here, before any rank runs
        inputs = [{"sendbuf": full_random(rng, (count,), dtype)} for _ in range(world)]
        outputs = [{"recvbuf": ((count,), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        color = split_groups(world, params)
        acc = np.float64 if np.dtype(dtype).kind == "f" else np.int64
        sums: dict[int, np.ndarray] = {}
        for r, named in enumerate(trial.inputs):
            total = sums.setdefault(color[r], np.zeros(count, dtype=acc))
            total += named["sendbuf"]
        return [{"recvbuf": sums[color[r]]} for r in range(world)]

    def slack(self, trial, case):
        color = split_groups(case.world, case.params)
        bounds = {g: sum_slack([trial.inputs[r]["sendbuf"] for r in range(case.world)
                                if color[r] == g], case.dtype) for g in set(color)}
        return [{"recvbuf": bounds[color[r]]} for r in range(case.world)]

    def bytes(self, count, dtype, world, params):
        color = split_groups(world, params)
        g = max(color.count(c) for c in set(color))
        return count * np.dtype(dtype).itemsize, 2.0 * (g - 1) / g


class RingProduceConsume(Op):
    name = "ring_produce_consume"

    def args(self, params):
        return ["x", "stage", "out"]

    def make_trial(self, rng, count, dtype, world, params):
        inputs = [{"x": full_random(rng, (count,), dtype)} for _ in range(world)]
        outputs = [{"stage": ((count,), dtype), "out": ((count,), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        xs = [named["x"].astype(np.float64) for named in trial.inputs]
        return [{"stage": 2.0 * xs[r], "out": 2.0 * xs[(r - 1) % world] + xs[r]}
                for r in range(world)]

    def bytes(self, count, dtype, world, params):
        return count * np.dtype(dtype).itemsize, 1.0


OPS = {
    "halo_exchange": HaloExchange(),
    "split_allreduce": SplitAllReduce(),
    "ring_produce_consume": RingProduceConsume(),
}
