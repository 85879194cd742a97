"""Expert-parallel building blocks in DeepEP's style: the dispatch layout, the notify step
before a dispatch, low-latency dispatch and combine through NVSHMEM, and a dispatch whose
payload travels as float8 e4m3 with per-128-channel scales.

Conventions (those of moe.py): `num_experts` (E) is divisible by the world size; expert e
lives on rank e // L, where L = E // world is the number of local experts per rank, and is
local expert e % L there. topk_idx (T, topk) int64 holds distinct experts per token, except
that where an op says so some slots are -1 ("masked": no expert; a token whose slots are all
-1 goes nowhere). Trial 0 routes uniformly, later trials from skewed per-expert popularity
(some experts and ranks receive far more than others, small counts leave pairs empty).

ep_dispatch_layout(ctx, topk_idx, num_experts, num_tokens_per_rank, num_tokens_per_expert,
                   is_token_in_rank)          count = T tokens; params num_experts, topk
    input    topk_idx (T, topk) int64, with masked slots
    outputs  num_tokens_per_rank (world,) int32: tokens with at least one expert on rank r;
             num_tokens_per_expert (E,) int32: tokens routed to expert e;
             is_token_in_rank (T, world) uint8: 1 where token t has an expert on rank r, else 0
    exact; every rank computes its own (no communication).

ep_notify_dispatch(ctx, num_tokens_per_rank, num_tokens_per_expert, recv_from_rank,
                   rank_prefix, num_recv_per_expert, num_recv)
                                              count = E experts; params tokens, topk
    inputs   the layout counts of this rank's routing (as ep_dispatch_layout makes them; the
             ranks' token counts differ in skewed trials, some ranks have none):
             num_tokens_per_rank (world,) int32, num_tokens_per_expert (E,) int32
    outputs  on rank r: recv_from_rank (world,) int32: [s] = rank s's num_tokens_per_rank[r];
             rank_prefix (world,) int32: exclusive prefix sum of recv_from_rank;
             num_recv_per_expert (L,) int32: [j] = sum over s of rank s's
             num_tokens_per_expert[r * L + j]; num_recv (1,) int32: sum of recv_from_rank
    exact.

ep_ll_dispatch(ctx, x, topk_idx, num_experts, recv_x, recv_src, recv_count, recv_from)
                                              count = T tokens; params hidden, num_experts, topk
    inputs   x (T, H) float (every bit of the significand used), topk_idx (T, topk) int64
             with masked slots
    outputs  on rank r, for local expert j (global expert e = r * L + j): the pairs
             (source s, token t) with e in rank s's topk_idx[t], ordered by s, then t
             ("the low-latency layout"); n_j of them.
             recv_x (L, world * T, H) float: row i of expert j is rank s's x[t] of the i-th
             pair (rows n_j and beyond unchecked); recv_src (L, world * T) int32: t of the
             i-th pair; recv_count (L,) int32: n_j; recv_from (L, world) int32: how many of
             expert j's pairs come from rank s
    exact.

ep_ll_combine(ctx, y, recv_src, recv_from, topk_idx, topk_weights, num_experts, out)
                                              count = T tokens; params hidden, num_experts, topk
    inputs   on rank r, in the low-latency layout of every rank's routing: y (L, world * T, H)
             float: row i of expert j is local expert j's output for its i-th pair (rows n_j
             and beyond are NaN); recv_src (L, world * T) int32 and recv_from (L, world)
             int32 as ep_ll_dispatch makes them (recv_src is -1 past n_j); this rank's own
             topk_idx (T, topk) int64 with masked slots and topk_weights (T, topk) float32
             (masked slots carry a weight too, which must not count)
    output   out (T, H) float: out[t] = sum over unmasked k of topk_weights[t, k] * (the y
             row of expert topk_idx[t, k] for (this rank, t)); 0 for a token routed nowhere.
             Checked against a float64 sum with the bound of a float32 evaluation in any
             order (2 * topk * 2^-23 * sum of |w * y|) added to the manifest's tolerances.

ep_dispatch_fp8(ctx, x, topk_idx, num_experts, recv_x, recv_scales, recv_src, num_recv)
                                              count = T tokens; params hidden, num_experts, topk
    The layout of moe_dispatch (a token goes once to every rank hosting one of its experts;
    rows by source rank, then token index); no masked slots. H is a multiple of 128.
    inputs   x (T, H) float32: per (token, 128-channel group) magnitudes spread over about
             2^-16 .. 2^8, some groups all zero
    outputs  recv_x (world * T, H) uint8: float8 e4m3 (e4m3fn) bits; recv_scales
             (world * T, H / 128) float32; recv_src (world * T, 2) int64; num_recv (1,) int64;
             the first num_recv rows are checked.
    The quantization of a (token, group): amax = max |x| over its 128 channels, scale =
    max(amax, 1e-4f) / 448, q = x / scale rounded to the nearest e4m3 (saturating at 448).
    Checked: num_recv and recv_src exactly; every scale within 2 float32 ulps of the exact
    max(amax, 1e-4f) / 448; every q, with v = x / (the scale the rank wrote), within half an
    e4m3 ulp of v (the spacing of e4m3 values at |v|, 2^-9 in the subnormal range) plus
    |v| * 2^-20 (for v's own float32 evaluation): a correctly rounded value of v, either way
    at a tie, and nothing else (a truncated value is off by up to a whole ulp).
"""

from __future__ import annotations

import numpy as np

from . import lowp
from .base import Trial, compare, full_random, random_data
from .moe import Routed, routed_pairs
from .moe import _layout as _moe_layout  # the layout of moe_dispatch, shared

SKEW = 1.5  # std of the per-expert logits in skewed trials
GROUP = 128  # channels per float8 scale
E4M3_MAX = lowp.E4M3_MAX
AMAX_FLOOR = float(np.float32(1e-4))  # the float32 nearest 1e-4: the smallest amax a scale uses
SCALE_ULPS = 2.0  # float32 ulps a scale may differ from max(amax, 1e-4f) / 448
QUANT_REL = 2.0 ** -20  # relative slack of x / scale evaluated in float32


def _experts(params, world, default_experts=16, default_topk=4):
    experts = int(params.get("num_experts", default_experts))
    topk = int(params.get("topk", default_topk))
    if experts % world:
        raise ValueError(f"num_experts={experts} is not divisible by the world size {world}")
    if not 1 <= topk <= experts:
        raise ValueError(f"topk={topk} must be in 1..num_experts={experts}")
    return experts, topk


def routing(rng: np.random.Generator, tokens: int, experts: int, topk: int, skewed: bool,
            masked: bool) -> np.ndarray:
    """(tokens, topk) int64 distinct experts per token, in no particular order, drawn without
    replacement with probabilities proportional to per-expert weights (uniform, or skewed:
    log-normal popularity) - the distribution of a Gumbel top-k, drawn as repeated draws that
    skip an expert already taken (fast for 10^5 tokens of 256 experts). With `masked`, some
    slots are -1 and a few tokens wholly masked."""
    weights = np.exp(SKEW * rng.standard_normal(experts)) if skewed else np.ones(experts)
    cdf = np.cumsum(weights / weights.sum())
    idx = np.full((tokens, topk), -1, dtype=np.int64)
    filled = np.zeros(tokens, dtype=np.int64)
    open_rows = np.arange(tokens)
    while open_rows.size:
        pick = np.minimum(np.searchsorted(cdf, rng.random(open_rows.size), side="right"),
                          experts - 1)
        fresh = ~(idx[open_rows] == pick[:, None]).any(axis=1)
        rows = open_rows[fresh]
        idx[rows, filled[rows]] = pick[fresh]
        filled[rows] += 1
        open_rows = open_rows[filled[open_rows] < topk]
    if masked and tokens:
        rate = rng.uniform(0.05, 0.35) if skewed else 0.15
        drop = rng.random((tokens, topk)) < rate
        drop |= (rng.random(tokens) < 0.03)[:, None]  # tokens routed nowhere
        idx[drop] = -1
    return idx


def layout_counts(topk_idx: np.ndarray, experts: int, world: int):
    """(num_tokens_per_rank, num_tokens_per_expert, is_token_in_rank) of one rank's routing."""
    per_rank = experts // world
    valid = topk_idx >= 0
    per_expert = np.bincount(topk_idx[valid], minlength=experts).astype(np.int32)
    home = np.where(valid, topk_idx // per_rank, -1)
    in_rank = np.stack([(home == r).any(axis=1) for r in range(world)], axis=1)
    in_rank = in_rank.reshape(topk_idx.shape[0], world).astype(np.uint8)
    return in_rank.sum(axis=0, dtype=np.int64).astype(np.int32), per_expert, in_rank


def ll_pairs(topks: list[np.ndarray], expert: int) -> np.ndarray:
    """(n, 2) int64 (source rank, token) pairs routed to `expert`, by source, then token."""
    return routed_pairs(topks, lambda idx: idx == expert)


def _check_rows(errors: list[str], rank: int, name: str, got: np.ndarray, want: np.ndarray,
                what: str, tol=0.0) -> None:
    """Compare `got` (at least as long as `want` along axis 0) with `want` on want's rows."""
    n = want.shape[0]
    if got.shape[0] < n or got.shape[1:] != want.shape[1:]:
        errors.append(f"rank {rank}: output '{name}' has shape {got.shape}")
        return
    msg = compare(got[:n], want, 0.0, tol)
    if msg:
        errors.append(f"rank {rank}: output '{name}' ({what}): {msg}")


# -- the layout --------------------------------------------------------------------------------
class DispatchLayout(Routed):
    name = "ep_dispatch_layout"
    exact = True

    def args(self, params):
        return ["topk_idx", "num_experts", "num_tokens_per_rank", "num_tokens_per_expert",
                "is_token_in_rank"]

    def make_trial(self, rng, count, dtype, world, params, skewed=False):
        experts, topk = _experts(params, world, 256, 8)
        inputs = [{"topk_idx": routing(rng, count, experts, topk, skewed, masked=True)}
                  for _ in range(world)]
        outputs = [{
            "num_tokens_per_rank": ((world,), "int32"),
            "num_tokens_per_expert": ((experts,), "int32"),
            "is_token_in_rank": ((count, world), "uint8"),
        } for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        experts, _ = _experts(params, world, 256, 8)
        want = []
        for named in trial.inputs:
            per_rank, per_expert, in_rank = layout_counts(named["topk_idx"], experts, world)
            want.append({"num_tokens_per_rank": per_rank, "num_tokens_per_expert": per_expert,
                         "is_token_in_rank": in_rank})
        return want

    def bytes(self, count, dtype, world, params):
        _, topk = _experts(params, world, 256, 8)
        return count * topk * 8, 1.0


# -- the notify step ---------------------------------------------------------------------------
class NotifyDispatch(Routed):
    name = "ep_notify_dispatch"
    exact = True

    def args(self, params):
        return ["num_tokens_per_rank", "num_tokens_per_expert", "recv_from_rank", "rank_prefix",
                "num_recv_per_expert", "num_recv"]

    def make_trial(self, rng, count, dtype, world, params, skewed=False):
        experts = count
        if experts < world or experts % world:
            raise ValueError(f"count (num_experts) {experts} is not a multiple of the world "
                             f"size {world}")
        tokens = int(params.get("tokens", 4096))
        topk = min(int(params.get("topk", 4)), experts)
        per_rank = experts // world
        inputs = []
        for _ in range(world):
            n = int(rng.integers(0, tokens + 1)) if skewed else tokens
            idx = routing(rng, n, experts, topk, skewed, masked=True)
            ranks, per_expert, _ = layout_counts(idx, experts, world)
            inputs.append({"num_tokens_per_rank": ranks, "num_tokens_per_expert": per_expert})
        outputs = [{
            "recv_from_rank": ((world,), "int32"),
            "rank_prefix": ((world,), "int32"),
            "num_recv_per_expert": ((per_rank,), "int32"),
            "num_recv": ((1,), "int32"),
        } for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        per_rank = count // world
        want = []
        for r in range(world):
            recv = np.array([trial.inputs[s]["num_tokens_per_rank"][r] for s in range(world)],
                            dtype=np.int64)
            prefix = np.concatenate([[0], np.cumsum(recv)[:-1]])
            local = sum(trial.inputs[s]["num_tokens_per_expert"][r * per_rank:(r + 1) * per_rank]
                        .astype(np.int64) for s in range(world))
            want.append({"recv_from_rank": recv.astype(np.int32),
                         "rank_prefix": prefix.astype(np.int32),
                         "num_recv_per_expert": np.asarray(local, dtype=np.int32),
                         "num_recv": np.array([recv.sum()], dtype=np.int32)})
        return want

    def bytes(self, count, dtype, world, params):
        return (world + count) * 4, 1.0


# -- low-latency dispatch and combine ----------------------------------------------------------
def _ll_params(params, world):
    hidden = int(params.get("hidden", 2048))
    experts, topk = _experts(params, world)
    return hidden, experts, topk


class LowLatencyDispatch(Routed):
    name = "ep_ll_dispatch"
    exact = True

    def args(self, params):
        return ["x", "topk_idx", "num_experts", "recv_x", "recv_src", "recv_count", "recv_from"]

    def make_trial(self, rng, count, dtype, world, params, skewed=False):
        hidden, experts, topk = _ll_params(params, world)
        per_rank = experts // world
        inputs = [{"x": full_random(rng, (count, hidden), dtype),
                   "topk_idx": routing(rng, count, experts, topk, skewed, masked=True)}
                  for _ in range(world)]
        outputs = [{
            "recv_count": ((per_rank,), "int32"),
            "recv_from": ((per_rank, world), "int32"),
            "recv_x": ((per_rank, world * count, hidden), dtype),
            "recv_src": ((per_rank, world * count), "int32"),
        } for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        """Per rank: recv_count, recv_from, and recv_x / recv_src of (L, n_max, ...) with
        expert j's n_j rows first (the rest zero and unchecked)."""
        hidden, experts, _ = _ll_params(params, world)
        per_rank = experts // world
        topks = [named["topk_idx"] for named in trial.inputs]
        want = []
        for r in range(world):
            pairs = [ll_pairs(topks, r * per_rank + j) for j in range(per_rank)]
            n_max = max(p.shape[0] for p in pairs)
            rx = np.zeros((per_rank, n_max, hidden), dtype=np.dtype(dtype))
            rs = np.zeros((per_rank, n_max), dtype=np.int32)
            frm = np.zeros((per_rank, world), dtype=np.int32)
            for j, p in enumerate(pairs):
                for s in range(world):
                    mine = p[:, 0] == s
                    rows = np.flatnonzero(mine)
                    rx[j, rows] = trial.inputs[s]["x"][p[mine, 1]]
                    frm[j, s] = rows.size
                rs[j, :p.shape[0]] = p[:, 1]
            want.append({"recv_count": np.array([p.shape[0] for p in pairs], dtype=np.int32),
                         "recv_from": frm, "recv_x": rx, "recv_src": rs})
        return want

    def verify(self, trial, got, events, case, rtol, atol, want=None, slack=None):
        if want is None:
            want = self.expected(trial, case.count, case.dtype, case.world, case.params)
        errors = []
        for rank, (w, g) in enumerate(zip(want, got)):
            missing = [k for k in w if k not in g]
            if missing:
                errors.append(f"rank {rank}: output '{missing[0]}' missing")
                continue
            for name in ("recv_count", "recv_from"):
                msg = compare(g[name], w[name], 0.0, 0.0)
                if msg:
                    errors.append(f"rank {rank}: output '{name}' is {g[name].tolist()}, "
                                  f"expected {w[name].tolist()}")
            for j, n in enumerate(w["recv_count"].tolist()):
                for name in ("recv_x", "recv_src"):
                    if g[name].ndim < 2 or g[name].shape[0] != w[name].shape[0]:
                        errors.append(f"rank {rank}: output '{name}' has shape {g[name].shape}")
                        continue
                    _check_rows(errors, rank, name, g[name][j], w[name][j, :n],
                                f"local expert {j}, first {n} rows")
        return errors

    def bytes(self, count, dtype, world, params):
        hidden, _, topk = _ll_params(params, world)
        return count * topk * hidden * np.dtype(dtype).itemsize, 1.0


class LowLatencyCombine(Routed):
    name = "ep_ll_combine"

    def args(self, params):
        return ["y", "recv_src", "recv_from", "topk_idx", "topk_weights", "num_experts", "out"]

    def make_trial(self, rng, count, dtype, world, params, skewed=False):
        hidden, experts, topk = _ll_params(params, world)
        per_rank = experts // world
        topks = [routing(rng, count, experts, topk, skewed, masked=True) for _ in range(world)]
        inputs = []
        for r in range(world):
            y = np.full((per_rank, world * count, hidden), np.nan, dtype=np.dtype(dtype))
            src = np.full((per_rank, world * count), -1, dtype=np.int32)
            frm = np.zeros((per_rank, world), dtype=np.int32)
            for j in range(per_rank):
                pairs = ll_pairs(topks, r * per_rank + j)
                n = pairs.shape[0]
                y[j, :n] = random_data(rng, (n, hidden), dtype)
                src[j, :n] = pairs[:, 1]
                frm[j] = np.bincount(pairs[:, 0], minlength=world)
            inputs.append({"y": y, "recv_src": src, "recv_from": frm})
        for r in range(world):
            weights = rng.uniform(0.05, 1.0, size=(count, topk)).astype(np.float32)
            inputs[r]["topk_idx"] = topks[r]
            inputs[r]["topk_weights"] = weights
        outputs = [{"out": ((count, hidden), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def _terms(self, trial, count, world, params):
        """Per home rank: (sum of w * y, sum of |w * y|), float64 (T, H) each."""
        hidden, experts, _ = _ll_params(params, world)
        per_rank = experts // world
        topks = [named["topk_idx"] for named in trial.inputs]
        sums = [np.zeros((count, hidden), dtype=np.float64) for _ in range(world)]
        mags = [np.zeros((count, hidden), dtype=np.float64) for _ in range(world)]
        for e in range(experts):
            pairs = ll_pairs(topks, e)  # the rows of expert e's y, in order
            y = trial.inputs[e // per_rank]["y"][e % per_rank]
            for s in range(world):
                rows = np.flatnonzero(pairs[:, 0] == s)
                toks = pairs[rows, 1]
                if not toks.size:
                    continue
                slot = np.argmax(topks[s][toks] == e, axis=1)  # each token names e once
                w = trial.inputs[s]["topk_weights"][toks, slot].astype(np.float64)
                term = w[:, None] * y[rows].astype(np.float64)
                sums[s][toks] += term  # a token appears once per expert
                mags[s][toks] += np.abs(term)
        return sums, mags

    def expected(self, trial, count, dtype, world, params):
        sums, _ = self._terms(trial, count, world, params)
        return [{"out": s} for s in sums]

    def slack(self, trial, case):
        _, _, topk = _ll_params(case.params, case.world)
        _, mags = self._terms(trial, case.count, case.world, case.params)
        eps = float(np.finfo(np.dtype(case.dtype)).eps)
        return [{"out": m * (2.0 * topk * eps)} for m in mags]

    def bytes(self, count, dtype, world, params):
        hidden, _, topk = _ll_params(params, world)
        return count * topk * hidden * np.dtype(dtype).itemsize, 1.0


# -- a dispatch with a float8 payload ----------------------------------------------------------
ROWS_AT_ONCE = 2048  # rows of a rank's output checked at a time (bounded temporaries)
E4M3_VALUES = lowp.decode(np.arange(256, dtype=np.uint8), "float8_e4m3").astype(np.float32)
E4M3_TYPE = lowp.STORAGE["float8_e4m3"][0]


def fp8_inputs(rng: np.random.Generator, tokens: int, hidden: int) -> np.ndarray:
    """(tokens, hidden) float32: normal values times a per-(token, group) power of two from
    2^-16 to 2^8, about 2% of the groups all zero."""
    groups = hidden // GROUP
    x = rng.standard_normal((tokens, groups, GROUP), dtype=np.float32)
    x *= np.exp2(rng.integers(-16, 9, size=(tokens, groups, 1))).astype(np.float32)  # exact
    x[rng.random((tokens, groups)) < 0.02] = 0.0
    return x.reshape(tokens, hidden)


def fp8_scales(x: np.ndarray) -> np.ndarray:
    """(rows, hidden / 128) float64: max(amax, 1e-4f) / 448, exact."""
    rows, hidden = x.shape
    amax = np.abs(x).reshape(rows, hidden // GROUP, GROUP).max(axis=2).astype(np.float64)
    return np.maximum(amax, AMAX_FLOOR) / E4M3_MAX


def fp8_quotients(x: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """x / scale (each 128-channel group by its scale) in float32: within 2^-24 of exact."""
    rows, hidden = x.shape
    v = x.reshape(rows, -1, GROUP) / scales.astype(np.float32)[:, :, None]
    return v.reshape(rows, hidden)


def fp8_tolerance(v: np.ndarray) -> np.ndarray:
    """How far a correctly rounded e4m3 value may be from v (float32): half an e4m3 ulp at |v|
    (2^(floor(log2 |v|) - 4), at least 2^-10 in the subnormal range) plus |v| * 2^-20."""
    mag = np.abs(v)
    binade = (mag.view(np.uint32) & np.uint32(0x7F800000)).view(np.float32)
    half_ulp = np.maximum(binade, np.float32(2.0 ** -6)) * np.float32(2.0 ** -4)
    return half_ulp + mag * np.float32(QUANT_REL)


class DispatchFp8(Routed):
    name = "ep_dispatch_fp8"

    def args(self, params):
        return ["x", "topk_idx", "num_experts", "recv_x", "recv_scales", "recv_src", "num_recv"]

    def _params(self, params, world):
        hidden = int(params.get("hidden", 2048))
        if hidden % GROUP:
            raise ValueError(f"hidden={hidden} is not a multiple of {GROUP}")
        experts, topk = _experts(params, world)
        return hidden, experts, topk

    def make_trial(self, rng, count, dtype, world, params, skewed=False):
        hidden, experts, topk = self._params(params, world)
        inputs = [{"x": fp8_inputs(rng, count, hidden),
                   "topk_idx": routing(rng, count, experts, topk, skewed, masked=False)}
                  for _ in range(world)]
        outputs = [{
            "recv_x": ((world * count, hidden), lowp.storage("float8_e4m3")),
            "recv_scales": ((world * count, hidden // GROUP), "float32"),
            "recv_src": ((world * count, 2), "int64"),
            "num_recv": ((1,), "int64"),
        } for _ in range(world)]
        return Trial(inputs, outputs)

    def _layouts(self, trial, world, params):
        _, experts, _ = self._params(params, world)
        topks = [named["topk_idx"] for named in trial.inputs]
        return [_moe_layout(topks, r, experts // world) for r in range(world)]

    @staticmethod
    def _rows(trial, src: np.ndarray) -> np.ndarray:
        """The x rows that (source rank, token) pairs name, float32."""
        hidden = trial.inputs[0]["x"].shape[1]
        rows = np.empty((src.shape[0], hidden), dtype=np.float32)
        for s in np.unique(src[:, 0]):
            mine = src[:, 0] == s
            rows[mine] = trial.inputs[int(s)]["x"][src[mine, 1]]
        return rows

    def expected(self, trial, count, dtype, world, params):
        """Per rank: num_recv, recv_src and recv_scales (exact, float64) of its n rows, and
        recv_x: the e4m3 bits of x / scale rounded to nearest even; `verify` allows the
        tolerances of the module docstring around them."""
        want = []
        for src in self._layouts(trial, world, params):
            rows = self._rows(trial, src)
            scales = fp8_scales(rows)
            want.append({"recv_x": lowp.encode(fp8_quotients(rows, scales), "float8_e4m3"),
                         "recv_scales": scales, "recv_src": src,
                         "num_recv": np.array([src.shape[0]], dtype=np.int64)})
        return want

    def verify(self, trial, got, events, case, rtol, atol, want=None, slack=None):
        hidden, _, _ = self._params(case.params, case.world)
        groups = hidden // GROUP
        errors = []
        for rank, (src, g) in enumerate(zip(self._layouts(trial, case.world, case.params), got)):
            names = ("num_recv", "recv_src", "recv_scales", "recv_x")
            missing = [k for k in names if k not in g]
            if missing:
                errors.append(f"rank {rank}: output '{missing[0]}' missing")
                continue
            n = src.shape[0]
            if compare(g["num_recv"], np.array([n], dtype=np.int64), 0.0, 0.0):
                errors.append(f"rank {rank}: num_recv is {g['num_recv'].tolist()}, "
                              f"expected [{n}]")
            _check_rows(errors, rank, "recv_src", g["recv_src"], src, f"first {n} rows")
            scales, q = g["recv_scales"], g["recv_x"]
            if scales.ndim != 2 or scales.shape[0] < n or scales.shape[1] != groups:
                errors.append(f"rank {rank}: output 'recv_scales' has shape {scales.shape}")
                continue
            if q.ndim != 2 or q.shape[0] < n or q.shape[1] != hidden:
                errors.append(f"rank {rank}: output 'recv_x' has shape {q.shape}")
                continue
            bad_scales = bad_q = 0
            first_scale = first_q = None
            for lo in range(0, n, ROWS_AT_ONCE):
                hi = min(n, lo + ROWS_AT_ONCE)
                rows = self._rows(trial, src[lo:hi])
                exact = fp8_scales(rows)
                got_s = scales[lo:hi].astype(np.float64)
                room = SCALE_ULPS * np.spacing(exact.astype(np.float32)).astype(np.float64)
                ok = np.abs(got_s - exact) <= room  # NaN (the poison) is never ok
                if not ok.all():
                    where = np.argwhere(~ok)
                    bad_scales += len(where)
                    if first_scale is None:
                        i, j = where[0]
                        first_scale = (lo + i, j, got_s[i, j], exact[i, j])
                # the quotient by the rank's own scale (where it is usable; wrong scales are
                # reported above)
                use = np.where(np.isfinite(got_s) & (got_s > 0), got_s, exact)
                v = fp8_quotients(rows, use)
                # the value rounded to nearest (even) always passes; any other is measured
                nearest = v.astype(E4M3_TYPE).view(np.uint8)
                block = q[lo:hi]
                other = (block != nearest) | ((nearest & 0x7F) == 0x7F)
                where = np.flatnonzero(other)
                if where.size:
                    vv = v.reshape(-1)[where]
                    dec = E4M3_VALUES[block.reshape(-1)[where]]
                    wrong = where[~(np.abs(dec - vv) <= fp8_tolerance(vv))]  # NaN: never ok
                    bad_q += wrong.size
                    if wrong.size and first_q is None:
                        i, j = np.unravel_index(wrong[0], block.shape)
                        first_q = (lo + i, j, int(block[i, j]), float(E4M3_VALUES[block[i, j]]),
                                   float(v[i, j]))
            if bad_scales:
                i, j, g0, w0 = first_scale
                errors.append(f"rank {rank}: output 'recv_scales' (first {n} rows, within "
                              f"{SCALE_ULPS:g} float32 ulps of max(amax, 1e-4) / 448): "
                              f"{bad_scales} of {n * groups} wrong; first at index ({i}, {j}): "
                              f"got {g0!r}, expected {w0!r}")
            if bad_q:
                i, j, bits, g0, v0 = first_q
                errors.append(f"rank {rank}: output 'recv_x' (first {n} rows, as e4m3 against x "
                              f"/ the rank's own scale, to the nearest): {bad_q} of "
                              f"{n * hidden} wrong; first at index ({i}, {j}): got bits "
                              f"0x{bits:02x} ({g0!r}), expected the e4m3 value nearest {v0!r}")
        return errors

    def bytes(self, count, dtype, world, params):
        hidden, _, topk = self._params(params, world)
        return count * topk * hidden, 1.0


OPS = {
    "ep_dispatch_layout": DispatchLayout(),
    "ep_notify_dispatch": NotifyDispatch(),
    "ep_ll_dispatch": LowLatencyDispatch(),
    "ep_ll_combine": LowLatencyCombine(),
    "ep_dispatch_fp8": DispatchFp8(),
}
