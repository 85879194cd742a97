"""The torch.distributed tasks' own op: a bidirectional exchange with both ring neighbours.

neighbor_exchange(ctx, to_left, to_right, from_left, from_right)
    Ranks form a periodic ring: rank r's left neighbour is (r - 1) % n, its right neighbour
    (r + 1) % n. Every rank sends `to_left` to its left neighbour and `to_right` to its right
    neighbour; afterwards, on every rank r,

        from_left[r]  == to_right[(r - 1) % n]   (what the left neighbour sent rightwards)
        from_right[r] == to_left[(r + 1) % n]    (what the right neighbour sent leftwards)

    With two ranks both neighbours are the other rank: from_left is its `to_right` and
    from_right its `to_left` (two messages between the same pair, each into its own output).
    With one rank both neighbours are the rank itself (from_left = to_right, from_right =
    to_left).

count = elements of each of the four 1-D buffers (the same on every rank); pure data movement,
compared bit for bit. bytes = 2 * count * itemsize (what one rank sends in a call, as an
algorithm bandwidth counts it), bus factor 1.
"""

from __future__ import annotations

import numpy as np

from .base import Op, Trial, full_random


class NeighborExchange(Op):
    name = "neighbor_exchange"
    exact = True

    def args(self, params):
        return ["to_left", "to_right", "from_left", "from_right"]

    def make_trial(self, rng, count, dtype, world, params):
        inputs = [{"to_left": full_random(rng, (count,), dtype),
                   "to_right": full_random(rng, (count,), dtype)} for _ in range(world)]
        outputs = [{"from_left": ((count,), dtype), "from_right": ((count,), dtype)}
                   for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        return [{"from_left": np.array(trial.inputs[(r - 1) % world]["to_right"]),
                 "from_right": np.array(trial.inputs[(r + 1) % world]["to_left"])}
                for r in range(world)]

    def bytes(self, count, dtype, world, params):
        return 2 * count * np.dtype(dtype).itemsize, 1.0


OPS = {"neighbor_exchange": NeighborExchange()}
