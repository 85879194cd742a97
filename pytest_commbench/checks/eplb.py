"""Expert-parallel load balancing: moving expert weights to a new placement (a rebalance step
of vLLM's EPLB, where some experts are replicated and the placement changes as the load does).

eplb_rebalance(ctx, old_weights, old_map, new_map, slots, new_weights)
                                              count = H, floats per expert; params slots (S)
    P = world * S physical slots: slot s of rank r is physical slot r * S + s. E = world *
    (S - 1) logical experts: one slot per rank is redundant (it holds a second replica of
    some expert).
    inputs   old_weights (S, H) float32 on rank r: row s holds the weights of logical expert
             old_map[r * S + s] (every bit of the significand used; every replica of an
             expert holds the same weights, bit for bit);
             old_map (P,) int32, new_map (P,) int32: the same on every rank, each holds every
             logical expert at least once.
    output   new_weights (S, H) float32 on rank r: row s = the weights of expert
             new_map[r * S + s], found wherever old_map put a replica of it.
    exact.

A case's trials: no expert moves; a rebalance step (a few slots swap experts across ranks,
a replica is re-pointed, most slots keep theirs); a fresh placement (nearly every slot needs
another rank's weights; the last trial, the late one, is of this kind, so a rank that reads
a held peer's weights before the peer's call began is caught). Timed repetitions and the
extra late trials are fresh placements too.
"""

from __future__ import annotations

import numpy as np

from .base import Op, Trial, full_random

KINDS = ("stay", "moves", "fresh")  # the last trial is a fresh placement


def _slots(params, world) -> tuple[int, int]:
    slots = int(params.get("slots", 4))
    if slots < 2:
        raise ValueError(f"slots={slots}: a rank needs at least one slot beside its redundant one")
    return slots, world * (slots - 1)


def placement(rng: np.random.Generator, physical: int, experts: int) -> np.ndarray:
    """Every logical expert in one random slot; the other slots hold replicas of experts drawn
    by a skewed popularity (a few hot experts get most of them)."""
    out = np.empty(physical, np.int32)
    perm = rng.permutation(physical)
    out[perm[:experts]] = np.arange(experts, dtype=np.int32)
    popularity = rng.dirichlet(np.full(experts, 0.3))
    out[perm[experts:]] = rng.choice(experts, size=physical - experts, p=popularity)
    return out


def step(rng: np.random.Generator, old: np.ndarray, experts: int, slots: int) -> np.ndarray:
    """A rebalance step: a few pairs of slots on different ranks swap experts and one
    redundant replica is re-pointed at another expert; every expert keeps a replica."""
    new = old.copy()
    for _ in range(max(1, new.size // 8)):
        a = int(rng.integers(new.size))
        others = np.flatnonzero(np.arange(new.size) // slots != a // slots)
        b = int(rng.choice(others))
        new[a], new[b] = new[b], new[a]
    counts = np.bincount(new, minlength=experts)
    spare = np.flatnonzero(counts[new] > 1)
    if spare.size:
        new[rng.choice(spare)] = rng.integers(experts)
    return new


def fresh(rng: np.random.Generator, old: np.ndarray, experts: int, slots: int) -> np.ndarray:
    """A new placement in which every rank needs at least one expert it holds no replica of
    (so every rank reads from a peer)."""
    for _ in range(1000):
        new = placement(rng, old.size, experts)
        if all(np.setdiff1d(new[r:r + slots], old[r:r + slots]).size
               for r in range(0, old.size, slots)):
            return new
    raise ValueError(f"no placement of {experts} experts on {old.size} slots moves every rank")


class Rebalance(Op):
    name = "eplb_rebalance"
    exact = True

    def args(self, params):
        return ["old_weights", "old_map", "new_map", "slots", "new_weights"]

    def make_trial(self, rng, count, dtype, world, params, kind="fresh"):
        slots, experts = _slots(params, world)
        physical = world * slots
        old = placement(rng, physical, experts)
        new = {"fresh": lambda: fresh(rng, old, experts, slots),
               "moves": lambda: step(rng, old, experts, slots),
               "stay": old.copy}[kind]()
        weights = full_random(rng, (experts, count), dtype)
        inputs = [{"old_weights": weights[old[r * slots:(r + 1) * slots]],
                   "old_map": old.copy(), "new_map": new.copy()} for r in range(world)]
        outputs = [{"new_weights": ((slots, count), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def make_case(self, rng, case_id, count, dtype, world, params, trials, reps):
        case = super().make_case(rng, case_id, count, dtype, world, params, 0, reps)
        kinds = KINDS[-trials:] if trials <= len(KINDS) else KINDS + ("fresh",) * (trials - 3)
        case.trials = [self.make_trial(rng, count, dtype, world, params, k) for k in kinds]
        for t in case.trials:
            t.extra = [{} for _ in range(world)]
            t.delays = [0.0] * world
        return case

    def expected(self, trial, count, dtype, world, params):
        slots, _ = _slots(params, world)
        old = trial.inputs[0]["old_map"]
        new = trial.inputs[0]["new_map"]
        # each expert's weights from the first slot old_map put it in (all replicas agree)
        first = {}
        for p in range(old.size - 1, -1, -1):
            first[int(old[p])] = p
        rows = {e: trial.inputs[p // slots]["old_weights"][p % slots] for e, p in first.items()}
        return [{"new_weights": np.stack([rows[int(new[r * slots + s])] for s in range(slots)])}
                for r in range(world)]

    def bytes(self, count, dtype, world, params):
        slots, _ = _slots(params, world)
        return slots * count * np.dtype(dtype).itemsize, 1.0


OPS = {"eplb_rebalance": Rebalance()}
