"""The expert-parallel oracles of checks/ep_suite.py: hand-checked cases (the prompts'
examples), right outputs accepted, and each mutant of the tasks' references rejected (its
outputs simulated in numpy)."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_commbench import checks
from pytest_commbench.checks import lowp
from pytest_commbench.checks.base import Case, Trial
from pytest_commbench.checks.ep_suite import E4M3_VALUES, fp8_inputs


def _case(op, count, dtype, world, params, trials=()):
    return Case("c0", count, dtype, world, dict(params), op.args(params), list(trials), op=op)


def _verify(op, trial, got, case, rtol=0.0, atol=0.0):
    events = [{"t_enter": 0.0, "t_exit": 1e-4} for _ in range(case.world)]
    return op.verify(trial, got, events, case, rtol, atol)


def _copy(outputs):
    return [{k: np.array(v, copy=True) for k, v in named.items()} for named in outputs]


# -- ep_dispatch_layout --------------------------------------------------------------------------
LAYOUT = checks.get("ep_dispatch_layout")


def test_the_layout_of_the_prompts_example():
    params = {"num_experts": 8, "topk": 3}
    idx = np.array([[1, 6, 3], [-1, 5, 7], [-1, -1, -1]], dtype=np.int64)
    trial = Trial([{"topk_idx": idx}, {"topk_idx": idx[::-1].copy()}],
                  [{}, {}])
    want = LAYOUT.expected(trial, 3, "int64", 2, params)
    assert want[0]["num_tokens_per_rank"].tolist() == [1, 2]
    assert want[0]["num_tokens_per_expert"].tolist() == [0, 1, 0, 1, 0, 1, 1, 1]
    assert want[0]["is_token_in_rank"].tolist() == [[1, 1], [0, 1], [0, 0]]
    assert want[1]["is_token_in_rank"].tolist() == [[0, 0], [0, 1], [1, 1]]
    assert {a.dtype.name for a in want[0].values()} == {"int32", "uint8"}


def _layout_trial(world=4, count=333):
    params = {"num_experts": 256, "topk": 8}
    rng = np.random.default_rng(1)
    case = LAYOUT.make_case(rng, "c0", count, "int64", world, params, 3, 1)
    trial = case.trials[1]  # skewed, masked
    return case, trial, LAYOUT.expected(trial, count, "int64", world, params)


def test_the_layout_oracle_accepts_right_outputs_and_masks_some_slots():
    case, trial, want = _layout_trial()
    assert _verify(LAYOUT, trial, _copy(want), case) == []
    assert any((named["topk_idx"] == -1).any() for named in trial.inputs)


def test_the_layout_oracle_rejects_rank_counts_per_expert_slot():
    case, trial, want = _layout_trial()
    got = _copy(want)
    per_rank = 256 // case.world
    for r, named in enumerate(trial.inputs):  # the mutant: (token, expert) pairs per rank
        idx = named["topk_idx"]
        home = idx[idx >= 0] // per_rank
        got[r]["num_tokens_per_rank"] = np.bincount(home, minlength=case.world).astype(np.int32)
    assert _verify(LAYOUT, trial, got, case)


def test_the_layout_oracle_rejects_expert_zero_taken_as_masked():
    case, trial, _ = _layout_trial()
    masked = [{"topk_idx": np.where(n["topk_idx"] == 0, -1, n["topk_idx"])}
              for n in trial.inputs]
    assert any((n["topk_idx"] == 0).any() for n in trial.inputs)
    got = LAYOUT.expected(Trial(masked, trial.outputs), case.count, "int64", case.world,
                          case.params)
    assert _verify(LAYOUT, trial, got, case)


def test_the_layout_oracle_rejects_a_dropped_tail():
    case, trial, want = _layout_trial(count=1)
    got = _copy(want)
    for named in got:  # nothing counted, the table never written (poison)
        named["num_tokens_per_rank"][:] = 0
        named["num_tokens_per_expert"][:] = 0
        named["is_token_in_rank"][:] = 255
    assert _verify(LAYOUT, trial, got, case)


# -- ep_notify_dispatch --------------------------------------------------------------------------
NOTIFY = checks.get("ep_notify_dispatch")


def test_the_notify_step_of_the_prompts_example():
    trial = Trial([
        {"num_tokens_per_rank": np.array([5, 3], np.int32),
         "num_tokens_per_expert": np.array([4, 2, 3, 0], np.int32)},
        {"num_tokens_per_rank": np.array([2, 6], np.int32),
         "num_tokens_per_expert": np.array([1, 1, 2, 5], np.int32)},
    ], [{}, {}])
    want = NOTIFY.expected(trial, 4, "int32", 2, {})
    assert want[1]["recv_from_rank"].tolist() == [3, 6]
    assert want[1]["rank_prefix"].tolist() == [0, 3]
    assert want[1]["num_recv_per_expert"].tolist() == [5, 5]
    assert want[1]["num_recv"].tolist() == [9]
    assert want[0]["recv_from_rank"].tolist() == [5, 2]
    assert want[0]["num_recv_per_expert"].tolist() == [4 + 1, 2 + 1]


def _notify_case(world=4, experts=40):
    rng = np.random.default_rng(2)
    case = NOTIFY.make_case(rng, "c0", experts, "int32", world, {"tokens": 512, "topk": 4}, 3, 1)
    return case


def test_the_notify_oracle_accepts_right_outputs_and_rejects_an_inclusive_prefix():
    case = _notify_case()
    trial = case.trials[0]
    want = NOTIFY.expected(trial, case.count, case.dtype, case.world, case.params)
    assert _verify(NOTIFY, trial, _copy(want), case) == []
    got = _copy(want)
    for named in got:
        named["rank_prefix"] = np.cumsum(named["recv_from_rank"]).astype(np.int32)
    assert _verify(NOTIFY, trial, got, case)


def test_the_notify_oracle_rejects_a_late_peers_stale_counts():
    # stale epoch / no wait for the last source: the held rank's counts of an earlier call
    case = _notify_case()
    now, before = case.trials[2], case.trials[0]
    held = case.world - 1
    mixed = [dict(n) for n in now.inputs]
    mixed[held] = before.inputs[held]
    got = NOTIFY.expected(Trial(mixed, now.outputs), case.count, case.dtype, case.world,
                          case.params)
    errors = _verify(NOTIFY, now, got, case)
    assert any(e.startswith("rank 0:") for e in errors)  # a rank that was not held


def test_the_notify_oracle_rejects_the_senders_own_first_experts():
    case = _notify_case()
    trial = case.trials[0]
    per_rank = case.count // case.world
    shifted = []
    for named in trial.inputs:  # every destination gets the sender's experts 0 .. L-1
        experts = np.tile(named["num_tokens_per_expert"][:per_rank], case.world)
        shifted.append({"num_tokens_per_rank": named["num_tokens_per_rank"],
                        "num_tokens_per_expert": experts})
    got = NOTIFY.expected(Trial(shifted, trial.outputs), case.count, case.dtype, case.world,
                          case.params)
    errors = _verify(NOTIFY, trial, got, case)
    assert errors and all("rank 0:" not in e for e in errors)


# -- ep_ll_dispatch ------------------------------------------------------------------------------
LL_DISPATCH = checks.get("ep_ll_dispatch")
LL_PARAMS = {"hidden": 8, "num_experts": 4, "topk": 2}


def test_the_low_latency_layout_of_the_prompts_example():
    x0 = np.arange(3 * 8, dtype=np.float32).reshape(3, 8)
    x1 = -np.arange(3 * 8, dtype=np.float32).reshape(3, 8) - 1
    trial = Trial([
        {"x": x0, "topk_idx": np.array([[1, 3], [0, 1], [-1, 2]], np.int64)},
        {"x": x1, "topk_idx": np.array([[1, -1], [2, 3], [3, 0]], np.int64)},
    ], [{}, {}])
    want = LL_DISPATCH.expected(trial, 3, "float32", 2, LL_PARAMS)[0]
    assert want["recv_count"].tolist() == [2, 3]
    assert want["recv_from"].tolist() == [[1, 1], [2, 1]]
    assert want["recv_src"][0, :2].tolist() == [1, 2]
    assert want["recv_src"][1, :3].tolist() == [0, 1, 0]
    assert np.array_equal(want["recv_x"][0, 1], x1[2])
    assert np.array_equal(want["recv_x"][1, 2], x1[0])


def _ll_dispatch_case(world=2, count=7):
    rng = np.random.default_rng(3)
    params = {"hidden": 64, "num_experts": 16, "topk": 4}
    return LL_DISPATCH.make_case(rng, "c0", count, "float32", world, params, 3, 1)


def _full_outputs(op, trial, case):
    """The expected outputs as the rank's buffers would hold them (the checked rows first)."""
    want = op.expected(trial, case.count, case.dtype, case.world, case.params)
    got = []
    for rank, spec in enumerate(trial.outputs):
        named = {}
        for name, (shape, dtype) in spec.items():
            buf = np.zeros(shape, dtype=dtype)
            w = np.asarray(want[rank][name])
            buf[tuple(slice(0, n) for n in w.shape)] = w
            named[name] = buf
        got.append(named)
    return got


def test_the_low_latency_dispatch_oracle_accepts_right_outputs_with_any_tail():
    case = _ll_dispatch_case()
    trial = case.trials[1]
    got = _full_outputs(LL_DISPATCH, trial, case)
    for named in got:  # rows past n_j are not checked
        named["recv_x"][:, -1] = np.nan
        named["recv_src"][:, -1] = -7
    assert _verify(LL_DISPATCH, trial, got, case) == []


def test_the_low_latency_dispatch_oracle_rejects_a_late_peers_stale_rows():
    # stale epoch / no wait for the last source: the last rank's rows and counts of an
    # earlier call are packed
    case = _ll_dispatch_case()
    now, before = case.trials[2], case.trials[0]
    mixed = [dict(n) for n in now.inputs]
    mixed[-1] = before.inputs[-1]
    got = _full_outputs(LL_DISPATCH, Trial(mixed, now.outputs), case)
    assert _verify(LL_DISPATCH, now, got, case)


def test_the_low_latency_dispatch_oracle_rejects_source_major_regions():
    case = _ll_dispatch_case()
    trial = case.trials[0]
    world, per_rank = case.world, 16 // case.world
    got = _full_outputs(LL_DISPATCH, trial, case)
    want = LL_DISPATCH.expected(trial, case.count, case.dtype, world, case.params)
    topks = [n["topk_idx"] for n in trial.inputs]
    for r in range(world):
        # region p = j * world + s holds what source p // L sent its expert p % L
        for j in range(per_rank):
            row = 0
            for s in range(world):
                n = int(want[r]["recv_from"][j, s])
                p = j * world + s
                src, jj = p // per_rank, p % per_rank
                toks = np.flatnonzero((topks[src] == r * per_rank + jj).any(axis=1))
                take = min(n, toks.size)
                got[r]["recv_x"][j, row:row + take] = trial.inputs[src]["x"][toks[:take]]
                got[r]["recv_src"][j, row:row + take] = toks[:take]
                row += n
    assert _verify(LL_DISPATCH, trial, got, case)


# -- ep_ll_combine -------------------------------------------------------------------------------
LL_COMBINE = checks.get("ep_ll_combine")


def test_the_low_latency_combine_weights_each_experts_row():
    # world 2, E 4 (L 2), topk 2, T 2, H 2
    y0 = np.full((2, 4, 2), np.nan, np.float32)
    y1 = np.full((2, 4, 2), np.nan, np.float32)
    # rank 0's tokens: t0 -> [0, 3], t1 -> [1, -1]; rank 1's: t0 -> [3, 0], t1 -> [-1, -1]
    idx0 = np.array([[0, 3], [1, -1]], np.int64)
    idx1 = np.array([[3, 0], [-1, -1]], np.int64)
    w0 = np.array([[0.5, 0.25], [2.0, 9.0]], np.float32)
    w1 = np.array([[0.25, 0.75], [1.0, 1.0]], np.float32)
    # expert 0 (rank 0, j 0): pairs (0, 0), (1, 0); expert 1 (rank 0, j 1): (0, 1)
    y0[0, 0], y0[0, 1], y0[1, 0] = [1, 2], [3, 4], [5, 6]
    # expert 3 (rank 1, j 1): pairs (0, 0), (1, 0); expert 2: none
    y1[1, 0], y1[1, 1] = [7, 8], [9, 10]
    src0 = np.array([[0, 0, -1, -1], [1, -1, -1, -1]], np.int32)
    src1 = np.array([[-1, -1, -1, -1], [0, 0, -1, -1]], np.int32)
    trial = Trial([
        {"y": y0, "recv_src": src0, "recv_from": np.array([[1, 1], [1, 0]], np.int32),
         "topk_idx": idx0, "topk_weights": w0},
        {"y": y1, "recv_src": src1, "recv_from": np.array([[0, 0], [1, 1]], np.int32),
         "topk_idx": idx1, "topk_weights": w1},
    ], [{}, {}])
    params = {"hidden": 2, "num_experts": 4, "topk": 2}
    want = LL_COMBINE.expected(trial, 2, "float32", 2, params)
    assert want[0]["out"].tolist() == [[0.5 * 1 + 0.25 * 7, 0.5 * 2 + 0.25 * 8], [10.0, 12.0]]
    assert want[1]["out"].tolist() == [[0.25 * 9 + 0.75 * 3, 0.25 * 10 + 0.75 * 4], [0.0, 0.0]]


def _ll_combine_case(world=2, count=7):
    rng = np.random.default_rng(4)
    params = {"hidden": 64, "num_experts": 16, "topk": 4}
    return LL_COMBINE.make_case(rng, "c0", count, "float32", world, params, 3, 1)


def _combine_with(trial, case, weights=None, inputs=None, drop_from=None):
    """out as a variant of the combine computes it (float32)."""
    hidden = case.params["hidden"]
    per_rank = case.params["num_experts"] // case.world
    inputs = inputs or trial.inputs
    outs = []
    for s in range(case.world):
        idx = trial.inputs[s]["topk_idx"]
        w = trial.inputs[s]["topk_weights"] if weights is None else weights(s)
        out = np.zeros((case.count, hidden), np.float32)
        for t in range(case.count):
            for k in range(idx.shape[1]):
                e = int(idx[t, k])
                if e < 0 or (drop_from is not None and e >= drop_from):
                    continue
                named = inputs[e // per_rank]
                j = e % per_rank
                start = int(named["recv_from"][j, :s].sum())
                rows = named["recv_src"][j, start:start + int(named["recv_from"][j, s])]
                i = start + int(np.flatnonzero(rows == t)[0])
                out[t] += w[t, k] * named["y"][j, i]
        outs.append({"out": out})
    return outs


def test_the_low_latency_combine_oracle_accepts_a_float32_evaluation():
    case = _ll_combine_case()
    trial = case.trials[1]
    assert _verify(LL_COMBINE, trial, _combine_with(trial, case), case, 1e-6, 1e-6) == []


def test_the_low_latency_combine_oracle_rejects_the_first_weight_for_every_slot():
    case = _ll_combine_case()
    trial = case.trials[0]

    def first(s):
        w = trial.inputs[s]["topk_weights"]
        return np.repeat(w[:, :1], w.shape[1], axis=1)

    assert _verify(LL_COMBINE, trial, _combine_with(trial, case, weights=first), case, 1e-6, 1e-6)


def test_the_low_latency_combine_oracle_rejects_unwritten_slots_of_later_ranks_experts():
    case = _ll_combine_case()
    trial = case.trials[0]
    per_rank = case.params["num_experts"] // case.world
    got = _combine_with(trial, case, drop_from=per_rank)  # the slots past L stay zero
    assert _verify(LL_COMBINE, trial, got, case, 1e-6, 1e-6)


def test_the_low_latency_combine_oracle_rejects_a_late_peers_stale_rows():
    case = _ll_combine_case()
    now, before = case.trials[2], case.trials[0]
    held = case.world - 1
    stale = [dict(n) for n in now.inputs]
    stale[held] = dict(now.inputs[held], y=before.inputs[held]["y"].copy())
    # the stale rows, laid out as the current call's (the slots are where they were)
    stale[held]["y"] = np.where(np.isnan(stale[held]["y"]), 1.0, stale[held]["y"])
    got = _combine_with(now, case, inputs=stale)
    errors = _verify(LL_COMBINE, now, got, case, 1e-6, 1e-6)
    assert errors


# -- ep_dispatch_fp8 -----------------------------------------------------------------------------
FP8 = checks.get("ep_dispatch_fp8")
FP8_PARAMS = {"hidden": 256, "num_experts": 16, "topk": 4}


def test_e4m3_values_and_a_hand_checked_quantization():
    assert E4M3_VALUES[0x7E] == 448.0 and E4M3_VALUES[0x01] == 2.0 ** -9
    assert np.isnan(E4M3_VALUES[0xFF]) and np.isnan(E4M3_VALUES[0x7F])
    x = np.zeros((1, 128), np.float32)
    x[0, :4] = [-3.5, 1.0, 0.6, 0.0]  # amax 3.5: scale 3.5 / 448 = 1 / 128
    trial = Trial([{"x": x, "topk_idx": np.array([[0, 1]], np.int64)}], [{}])
    want = FP8.expected(trial, 1, "float32", 1, {"hidden": 128, "num_experts": 2, "topk": 2})
    assert want[0]["recv_scales"].tolist() == [[3.5 / 448]]
    assert E4M3_VALUES[want[0]["recv_x"][0, :4]].tolist() == [-448.0, 128.0, 80.0, 0.0]
    # 0.6 * 128 = 76.8: between 72 and 80 (spacing 8 in [64, 128)), nearest 80


def _fp8_case(world=2, count=5):
    rng = np.random.default_rng(5)
    return FP8.make_case(rng, "c0", count, "float32", world, FP8_PARAMS, 3, 1)


def _fp8_outputs(trial, case, quantize=None, scale_of=None):
    """A rank's outputs as a variant computes them: scale_of(amax) in float32, then
    quantize(v) -> bits (default: round to nearest)."""
    want = FP8.expected(trial, case.count, case.dtype, case.world, case.params)
    got = _full_outputs(FP8, trial, case)
    for rank, named in enumerate(got):
        n = int(want[rank]["num_recv"][0])
        src = want[rank]["recv_src"]
        rows = np.stack([trial.inputs[s]["x"][t] for s, t in src]) if n else None
        if rows is None:
            continue
        amax = np.abs(rows).reshape(n, -1, 128).max(axis=2)
        scale = (scale_of or (lambda a: np.maximum(a, np.float32(1e-4)) / np.float32(448)))(amax)
        scale = scale.astype(np.float32)
        v = (rows.reshape(n, -1, 128) * (np.float32(1) / scale)[:, :, None]).reshape(n, -1)
        named["recv_scales"][:n] = scale
        named["recv_x"][:n] = (quantize or (lambda a: lowp.encode(a, "float8_e4m3")))(v)
    return got


def test_the_fp8_oracle_accepts_its_expected_outputs_and_a_float32_quantization():
    case = _fp8_case()
    trial = case.trials[1]
    assert _verify(FP8, trial, _full_outputs(FP8, trial, case), case) == []
    assert _verify(FP8, trial, _fp8_outputs(trial, case), case) == []


def test_the_fp8_oracle_accepts_scales_within_two_ulps_and_either_value_at_a_tie():
    case = _fp8_case()
    trial = case.trials[0]
    # amax / 448.f rounded, then one float32 ulp further: at most 1.5 ulps off
    got = _fp8_outputs(trial, case, scale_of=lambda a: np.nextafter(
        np.maximum(a, np.float32(1e-4)) / np.float32(448), np.float32(1)))
    assert _verify(FP8, trial, got, case) == []
    # amax * (1 / 448.f), two roundings
    got = _fp8_outputs(trial, case, scale_of=lambda a: np.maximum(a, np.float32(1e-4)) *
                       (np.float32(1) / np.float32(448)))
    assert _verify(FP8, trial, got, case) == []
    # a tie: v = 76 lies halfway between 72 and 80; both are correctly rounded
    x = np.zeros((1, 128), np.float32)
    x[0, 0], x[0, 1] = 448 / 128, 76 / 128
    one = Trial([{"x": x, "topk_idx": np.array([[0, 1]], np.int64)}], [{
        "recv_x": ((1, 128), "uint8"), "recv_scales": ((1, 1), "float32"),
        "recv_src": ((1, 2), "int64"), "num_recv": ((1,), "int64")}])
    params = {"hidden": 128, "num_experts": 2, "topk": 2}
    one_case = _case(FP8, 1, "float32", 1, params, [one])
    for bits in (0x69, 0x6A):  # 72 and 80
        assert E4M3_VALUES[bits] in (72.0, 80.0)
        q = lowp.encode(x[0] * 128, "float8_e4m3").reshape(1, 128)
        q[0, 1] = bits
        got = [{"recv_x": q, "recv_scales": np.array([[1 / 128]], np.float32),
                "recv_src": np.array([[0, 0]], np.int64), "num_recv": np.array([1], np.int64)}]
        assert _verify(FP8, one, got, one_case) == []
    q[0, 1] = 0x68  # 64: off by more than half an ulp
    assert _verify(FP8, one, got, one_case)


def test_the_fp8_oracle_rejects_an_int8_scale():
    case = _fp8_case()
    trial = case.trials[0]
    got = _fp8_outputs(trial, case,
                       scale_of=lambda a: np.maximum(a, np.float32(1e-4)) / np.float32(127))
    errors = _verify(FP8, trial, got, case)
    assert any("recv_scales" in e for e in errors)


def test_the_fp8_oracle_rejects_truncation():
    case = _fp8_case()
    trial = case.trials[0]

    def truncate(v):
        bits = lowp.encode(v, "float8_e4m3")
        dec = E4M3_VALUES[bits].astype(np.float64)
        over = np.abs(dec) > np.abs(v)  # rounded away from zero: one code toward zero
        return np.where(over & ((bits & 0x7F) > 0), bits - 1, bits).astype(np.uint8)

    errors = _verify(FP8, trial, _fp8_outputs(trial, case, quantize=truncate), case)
    assert errors and all("recv_scales" not in e for e in errors)


def test_the_fp8_oracle_rejects_scales_over_256_channels():
    case = _fp8_case()
    trial = case.trials[0]

    def pairs(a):
        wide = np.repeat(a.reshape(a.shape[0], -1, 2).max(axis=2), 2, axis=1)
        return np.maximum(wide, np.float32(1e-4)) / np.float32(448)

    errors = _verify(FP8, trial, _fp8_outputs(trial, case, scale_of=pairs), case)
    assert any("recv_scales" in e for e in errors)


def test_the_fp8_oracle_rejects_unwritten_rows():
    case = _fp8_case()
    trial = case.trials[0]
    got = _fp8_outputs(trial, case)
    rank = next(r for r, named in enumerate(got) if named["num_recv"][0] > 0)
    got[rank]["recv_x"][0, :] = 255  # the poison
    errors = _verify(FP8, trial, got, case)
    assert any("recv_x" in e for e in errors)


def test_fp8_inputs_spread_their_group_magnitudes():
    x = fp8_inputs(np.random.default_rng(6), 64, 1024)
    amax = np.abs(x).reshape(-1, 128).max(axis=1)
    live = amax[amax > 0]
    assert live.min() < 1e-4 < 1.0 < live.max()
    assert 0 < (amax == 0).sum() < amax.size // 10  # some all-zero groups (the floor's scale)


@pytest.mark.parametrize("name", ["ep_dispatch_layout", "ep_notify_dispatch", "ep_ll_dispatch",
                                  "ep_ll_combine", "ep_dispatch_fp8"])
def test_every_ep_oracle_rejects_a_timed_repetitions_fresh_inputs(name):
    op = checks.get(name)
    params = {"ep_dispatch_layout": {"num_experts": 32, "topk": 4},
              "ep_notify_dispatch": {"tokens": 64, "topk": 4},
              "ep_ll_dispatch": {"hidden": 16, "num_experts": 8, "topk": 2},
              "ep_ll_combine": {"hidden": 16, "num_experts": 8, "topk": 2},
              "ep_dispatch_fp8": FP8_PARAMS}[name]
    count = 16 if name == "ep_notify_dispatch" else 9
    rng = np.random.default_rng(8)
    case = op.make_case(rng, "c0", count, "int32" if name == "ep_notify_dispatch" else
                        "float32", 2, params, 2, 1)
    trial = case.trials[0]
    got = _full_outputs(op, trial, case)
    assert _verify(op, trial, got, case, 1e-6, 1e-6) == []
    assert _verify(op, op.timed_trial(rng, case), got, case, 1e-6, 1e-6)


# -- eplb_rebalance --------------------------------------------------------------------------------
EPLB = checks.get("eplb_rebalance")


def test_the_rebalance_of_a_hand_made_placement():
    # two ranks, two slots each: experts 0 and 1 (world * (S - 1) = 2), expert 1 replicated
    w0, w1 = np.array([1.0, 2.0], np.float32), np.array([3.0, 4.0], np.float32)
    old = np.array([0, 1, 1, 1], np.int32)
    new = np.array([1, 1, 0, 1], np.int32)
    trial = Trial([{"old_weights": np.stack([w0, w1]), "old_map": old, "new_map": new},
                   {"old_weights": np.stack([w1, w1]), "old_map": old, "new_map": new}], [{}, {}])
    want = EPLB.expected(trial, 2, "float32", 2, {"slots": 2})
    assert want[0]["new_weights"].tolist() == [[3.0, 4.0], [3.0, 4.0]]
    assert want[1]["new_weights"].tolist() == [[1.0, 2.0], [3.0, 4.0]]


def _eplb_case(world, count=1023, trials=3):
    rng = np.random.default_rng(7)
    return EPLB.make_case(rng, "c0", count, "float32", world, {"slots": 4}, trials, 1)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_the_rebalance_trials_keep_every_expert_and_the_last_moves_every_rank(world):
    case = _eplb_case(world)
    experts = world * 3
    for trial in case.trials:
        for named in trial.inputs:  # the maps are the same on every rank
            assert (named["old_map"] == trial.inputs[0]["old_map"]).all()
            assert (named["new_map"] == trial.inputs[0]["new_map"]).all()
        old, new = trial.inputs[0]["old_map"], trial.inputs[0]["new_map"]
        assert set(old.tolist()) == set(new.tolist()) == set(range(experts))
        # replicas agree bit for bit
        rows = {}
        for p, e in enumerate(old.tolist()):
            row = trial.inputs[p // 4]["old_weights"][p % 4]
            assert (rows.setdefault(e, row).view(np.uint32) == row.view(np.uint32)).all()
    stay, moves, fresh = (t.inputs[0] for t in case.trials)
    assert (stay["old_map"] == stay["new_map"]).all()
    assert (moves["old_map"] != moves["new_map"]).any()
    for r in range(world):  # in the last (late) trial every rank needs a peer's weights
        mine = fresh["old_map"][r * 4:(r + 1) * 4]
        assert np.setdiff1d(fresh["new_map"][r * 4:(r + 1) * 4], mine).size


def _eplb_outputs(case, trial, owner, tail=True, stale=None):
    """What the reference computes with the placement read by `owner(q) -> (rank, row)`; the
    tail after the last whole vector dropped (NaN) unless `tail`; reading `stale`'s weights
    (a held rank's previous inputs) for rank `stale[0]`."""
    world, slots = case.world, 4
    old, new = trial.inputs[0]["old_map"], trial.inputs[0]["new_map"]
    out = []
    for r in range(world):
        rows = []
        for s in range(slots):
            e = new[r * slots + s]
            q = next(q % old.size for q in range(r * slots, r * slots + old.size)
                     if old[q % old.size] == e)
            rank, row = owner(q)
            src = stale[1] if stale and rank == stale[0] and rank != r else trial.inputs[rank]["old_weights"]
            line = src[row].copy()
            if not tail:
                line[(case.count // 4) * 4 if (s * case.count) % 4 == 0 else case.count - 1:] = np.nan
            rows.append(line)
        out.append({"new_weights": np.stack(rows)})
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_the_rebalance_oracle_accepts_the_reference_and_rejects_each_mutant(world):
    case = _eplb_case(world)
    trial = case.trials[-1]
    blocked = lambda q: (q // 4, q % 4)  # noqa: E731
    assert _verify(EPLB, trial, _eplb_outputs(case, trial, blocked), case) == []
    # wrong_owner: the placement read as strided over the ranks
    assert _verify(EPLB, trial, _eplb_outputs(case, trial, lambda q: (q % world, q // world)), case)
    # tail_dropped: the floats past the last whole vector are never written
    assert _verify(EPLB, trial, _eplb_outputs(case, trial, blocked, tail=False), case)
    # no_ready_wait / stale_epoch: a held peer's weights read before its call put them in place
    earlier = case.trials[0].inputs
    for held in range(world):
        got = _eplb_outputs(case, trial, blocked, stale=(held, earlier[held]["old_weights"]))
        readers = [r for r in range(world) if r != held]
        msgs = _verify(EPLB, trial, got, case)
        if any(m.startswith(f"rank {r}:") for r in readers for m in msgs):
            break
    else:
        pytest.fail("no held rank's stale weights were read by a peer")
    # a rank that keeps its old weights (nothing moved) is wrong
    assert _verify(EPLB, trial, [{"new_weights": named["old_weights"]} for named in trial.inputs],
                   case)
