"""MoE expert-parallel dispatch and combine (DeepEP-like, simplified).

count = tokens per rank (T, the same on every rank). Parameters (`check.params`): `hidden` (H,
the row length of a token), `num_experts` (E, divisible by the world size) and `topk` (experts
per token, at most E). Expert e lives on rank e // (E // world). Every token picks `topk`
distinct experts; a token goes ONCE to every rank that hosts at least one of its experts.

The dispatch layout on rank r ("the layout" below): the tokens r receives, ordered by source
rank ascending, then by source token index ascending; row i is described by
recv_src[i] = (source rank, source token index).

moe_dispatch(ctx, x, topk_idx, num_experts, recv_x, recv_src, num_recv)
    inputs   x (T, H) float, topk_idx (T, topk) int64
    outputs  recv_x (world*T, H) float, recv_src (world*T, 2) int64, num_recv (1,) int64;
             only the first num_recv[0] rows are defined (and checked), bit for bit.

moe_combine(ctx, y, recv_src, topk_idx, num_experts, out)
    inputs   y (n_r, H) float: one row per received token, in the layout; recv_src (n_r, 2)
             int64 as dispatch made it; topk_idx (T, topk) int64 of this rank's own tokens
    output   out (T, H) float: out[t] = sum, over the ranks d that token t was dispatched to,
             of rank d's y row for (this rank, t). Checked against a float64 sum.

Routing: trial 0 draws experts uniformly (Gumbel top-k), later trials from skewed per-expert
popularity, so some ranks receive much more than others and small counts leave some
(source, destination) pairs empty.

bytes = T * topk * H * itemsize (the most token payload one rank can send: a token reaches at
most topk ranks), bus factor 1.0. The tasks report time, so this is for the record only.
"""

from __future__ import annotations

import numpy as np

from .base import Op, Trial, compare, random_data

SKEW = 1.5  # std of the expert logits in skewed trials


def _params(params, world):
    hidden = int(params.get("hidden", 64))
    experts = int(params.get("num_experts", 16))
    topk = int(params.get("topk", 2))
    if experts % world:
        raise ValueError(f"num_experts={experts} is not divisible by the world size {world}")
    if not 1 <= topk <= experts:
        raise ValueError(f"topk={topk} must be in 1..num_experts={experts}")
    return hidden, experts, topk


def _routing(rng, tokens, experts, topk, skewed):
    """(T, topk) int64 distinct experts per token: Gumbel top-k over per-expert logits."""
    logits = SKEW * rng.standard_normal(experts) if skewed else np.zeros(experts)
    keys = logits[None, :] + rng.gumbel(size=(tokens, experts))
    return np.argsort(-keys, axis=1, kind="stable")[:, :topk].astype(np.int64)


def routed_pairs(topks, match) -> np.ndarray:
    """(n, 2) int64 (source rank, source token) pairs, by source, then token, of the tokens
    for which `match(topk_idx)` (a (T, topk) boolean array) holds in any slot."""
    rows = []
    for src, topk_idx in enumerate(topks):
        tokens = np.flatnonzero(match(topk_idx).any(axis=1))
        rows.append(np.stack([np.full(tokens.size, src, dtype=np.int64), tokens], axis=1))
    return np.concatenate(rows).astype(np.int64).reshape(-1, 2)


def _layout(topks, dest_rank, per_rank):
    """The (source rank, source token) pairs rank `dest_rank` receives, in layout order: for
    each source in turn, its tokens with any expert on `dest_rank`, by token index."""
    return routed_pairs(topks, lambda idx: idx // per_rank == dest_rank)


class Routed(Op):
    """Trials differ in routing: trial 0 is uniform, later trials are skewed."""

    def make_trial(self, rng, count, dtype, world, params, skewed=False):
        raise NotImplementedError

    def make_case(self, rng, case_id, count, dtype, world, params, trials, reps):
        made = [self.make_trial(rng, count, dtype, world, params, skewed=t > 0)
                for t in range(trials)]
        case = super().make_case(rng, case_id, count, dtype, world, params, 0, reps)
        for t in made:
            t.extra = [{} for _ in range(world)]
            t.delays = [0.0] * world
        case.trials = made
        return case

    def bytes(self, count, dtype, world, params):
        hidden, _, topk = _params(params, world)
        return count * topk * hidden * np.dtype(dtype).itemsize, 1.0


class MoEDispatch(Routed):
    name = "moe_dispatch"
    exact = True

    def args(self, params):
        return ["x", "topk_idx", "num_experts", "recv_x", "recv_src", "num_recv"]

    def make_trial(self, rng, count, dtype, world, params, skewed=False):
        hidden, experts, topk = _params(params, world)
        inputs = []
        for _ in range(world):
            inputs.append({
                "x": random_data(rng, (count, hidden), dtype),
                "topk_idx": _routing(rng, count, experts, topk, skewed),
            })
        outputs = [{
            "recv_x": ((world * count, hidden), dtype),
            "recv_src": ((world * count, 2), "int64"),
            "num_recv": ((1,), "int64"),
        } for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        hidden, experts, _ = _params(params, world)
        per_rank = experts // world
        topks = [named["topk_idx"] for named in trial.inputs]
        want = []
        for r in range(world):
            src = _layout(topks, r, per_rank)
            rows = np.empty((src.shape[0], hidden), dtype=np.dtype(dtype))
            for s in range(world):
                mine = src[:, 0] == s
                rows[mine] = trial.inputs[s]["x"][src[mine, 1]]
            want.append({"recv_x": rows, "recv_src": src,
                         "num_recv": np.array([src.shape[0]], dtype=np.int64)})
        return want

    def verify(self, trial, got, events, case, rtol, atol):
        want = self.expected(trial, case.count, case.dtype, case.world, case.params)
        errors = []
        for rank, (w, g) in enumerate(zip(want, got)):
            missing = [k for k in w if k not in g]
            if missing:
                errors.append(f"rank {rank}: output '{missing[0]}' missing")
                continue
            n = int(w["num_recv"][0])
            msg = compare(g["num_recv"], w["num_recv"], 0.0, 0.0)
            if msg:
                errors.append(f"rank {rank}: num_recv is {g['num_recv'].tolist()}, "
                              f"expected [{n}]")
            for name in ("recv_src", "recv_x"):
                if g[name].ndim != 2 or g[name].shape[0] < n:
                    errors.append(f"rank {rank}: output '{name}' has shape {g[name].shape}")
                    continue
                msg = compare(g[name][:n], w[name], 0.0, 0.0)
                if msg:
                    errors.append(f"rank {rank}: output '{name}' (first {n} rows): {msg}")
        return errors


class MoECombine(Routed):
    name = "moe_combine"

    def args(self, params):
        return ["y", "recv_src", "topk_idx", "num_experts", "hidden", "topk", "out"]

    def make_trial(self, rng, count, dtype, world, params, skewed=False):
        hidden, experts, topk = _params(params, world)
        per_rank = experts // world
        topks = [_routing(rng, count, experts, topk, skewed) for _ in range(world)]
        inputs = []
        for r in range(world):
            src = _layout(topks, r, per_rank)
            inputs.append({
                "y": random_data(rng, (src.shape[0], hidden), dtype),
                "recv_src": src,
                "topk_idx": topks[r],
            })
        outputs = [{"out": ((count, hidden), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        hidden, _, _ = _params(params, world)
        out = [np.zeros((count, hidden), dtype=np.float64) for _ in range(world)]
        for named in trial.inputs:  # every destination rank sends its rows back to the source
            y = named["y"].astype(np.float64)
            src = named["recv_src"]
            for s in range(world):
                mine = src[:, 0] == s
                np.add.at(out[s], src[mine, 1], y[mine])
        return [{"out": o} for o in out]


OPS = {"moe_dispatch": MoEDispatch(), "moe_combine": MoECombine()}
