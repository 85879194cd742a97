"""Point-to-point exchanges: pure data movement, compared bit for bit.

pingpong       rank 0 sends its `sendbuf` to rank 1, which replies with its own `sendbuf`:
               afterwards recvbuf[0] == sendbuf[1] and recvbuf[1] == sendbuf[0]. Ranks >= 2
               (if any) take no part and their `recvbuf` is not checked. Needs 2 ranks or more.
ring_exchange  every rank r sends its `sendbuf` to (r + 1) % n and receives the one of
               (r - 1) % n into its `recvbuf`: recvbuf[r] == sendbuf[(r - 1) % n].

count = elements per buffer (every rank has a `sendbuf` and a `recvbuf` of `count` elements);
bytes = count * itemsize, the size of one message (as osu_latency / osu_bw count it); bus
factor 1.
"""

from __future__ import annotations

import numpy as np

from .base import Op, Trial, full_random


class _Exchange(Op):
    """Every rank gets a fresh `sendbuf` input and a poisoned `recvbuf` output of `count`
    elements; `source(rank, world)` says whose `sendbuf` must land in rank's `recvbuf`
    (None: the rank's output is not checked)."""

    exact = True
    min_world = 1

    def source(self, rank: int, world: int) -> int | None:
        raise NotImplementedError

    def args(self, params):
        return ["sendbuf", "recvbuf"]

    def make_trial(self, rng, count, dtype, world, params):
        if world < self.min_world:
            raise ValueError(f"{self.name} needs at least {self.min_world} ranks, got {world}")
        inputs = [{"sendbuf": full_random(rng, (count,), dtype)} for _ in range(world)]
        outputs = [{"recvbuf": ((count,), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        want = []
        for rank in range(world):
            src = self.source(rank, world)
            want.append({} if src is None else {"recvbuf": np.array(trial.inputs[src]["sendbuf"])})
        return want

    def bytes(self, count, dtype, world, params):
        return count * np.dtype(dtype).itemsize, 1.0


class PingPong(_Exchange):
    name = "pingpong"
    min_world = 2

    def source(self, rank, world):
        return {0: 1, 1: 0}.get(rank)


class RingExchange(_Exchange):
    name = "ring_exchange"

    def source(self, rank, world):
        return (rank - 1) % world


OPS = {"pingpong": PingPong(), "ring_exchange": RingExchange()}
