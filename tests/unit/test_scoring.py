from __future__ import annotations

import math

import pytest

from pytest_commbench import scoring, timing


def rec(verdict, speedup=None, **kw):
    return {"verdict": verdict, "speedup": speedup, "kind": "solution", **kw}


@pytest.mark.parametrize("s, band", [(1.2, "Better"), (1.19, "Comparable"), (0.95, "Comparable"),
                                     (0.949, "Degraded"), (0.6, "Degraded"),
                                     (0.59, "Severely degraded"), (None, "")])
def test_bands_follow_the_paper(s, band):
    assert scoring.band(s) == band


def test_scores_on_a_known_mix():
    records = [rec("pass", 2.0), rec("pass", 0.5), rec("pass", 1.0), rec("wrong_answer"),
               rec("timeout"), rec("skipped"), rec("infra_error"),
               {"verdict": "pass", "speedup": 9.0, "kind": "mutant"}]
    s = scoring.score(records)
    assert s.applicable == 5 and s.passes == 3 and s.not_applicable == 2
    assert s.pass_rate == pytest.approx(0.6)
    assert s.pass_good == pytest.approx(2 / 5)  # 2.0 and 1.0 are >= 0.95
    assert s.gm_speedup == pytest.approx(1.0)  # (2 * 0.5 * 1) ** (1/3)
    assert s.pass_x_gm == pytest.approx(0.6)


def test_compile_only_answers_are_never_scored():
    """A build is not a correct answer, nor a compile error of a run that runs nothing a
    fail among passes: a compile-only run's records, whatever their verdict, stay out of
    every score, its intervals and pass@k."""
    built = [rec("pass", task=f"t{i}", compile_only=True) for i in range(3)]
    broken = [rec("compile_error", task="t3", compile_only=True)]
    ran = [rec("pass", 1.0, task="t4"), rec("wrong_answer", task="t5")]
    s = scoring.score(built + broken + ran)
    assert (s.applicable, s.passes, s.not_applicable) == (2, 1, 4)
    assert s.pass_rate == pytest.approx(0.5)
    assert scoring.bootstrap(built + broken).tasks == 0
    assert scoring.score(built).pass_rate is None


def test_no_applicable_tasks_gives_no_numbers():
    s = scoring.score([rec("skipped")])
    assert s.pass_rate is None and s.gm_speedup is None and s.pass_x_gm is None


def test_fast_p_at_0_1_and_1_5_counted_by_hand():
    """KernelBench's fast_p: the share of the applicable tasks that pass with a speedup above
    p. Eight tasks: two not applicable, six applicable of which four pass (speedups 0.5, 1.0,
    1.2, 2.0) and a world size of a fifth fails: fast_0 4/6, fast_1 2/6 (1.0 is not above 1),
    fast_1.5 1/6."""
    records = [rec("pass", 0.5, task="a"), rec("pass", 1.0, task="b"),
               rec("pass", 1.2, task="c"), rec("pass", 2.0, task="d"),
               rec("pass", 3.0, task="e", world=2), rec("wrong_answer", task="e", world=4),
               rec("timeout", task="f"), rec("skipped", task="g"), rec("infra_error", task="h"),
               rec("pass", 9.0, task="m", kind="mutant")]
    fast = dict(scoring.score(records).fast)
    assert fast == {0.0: pytest.approx(4 / 6), 1.0: pytest.approx(2 / 6),
                    1.5: pytest.approx(1 / 6)}
    # a task's speedup is the geometric mean over its world sizes: sqrt(1.2 * 1.5) = 1.342
    both = [rec("pass", 1.2, task="x", world=2), rec("pass", 1.5, task="x", world=4)]
    assert dict(scoring.score(both).fast) == {0.0: 1.0, 1.0: 1.0, 1.5: 0.0}
    # a check-only run timed nothing: no fast_p at all, not zeros
    assert dict(scoring.score([rec("pass", task="a"), rec("wrong_answer", task="b")]).fast) \
        == {0.0: None, 1.0: None, 1.5: None}


def test_a_cost_is_unknown_unless_a_price_was_had():
    """A model without a price records a cost of 0: its Price is unknown (None), never $0;
    an answer priced at $0 (a price source named) is a known $0."""
    free = [rec("pass", 1.0, task="a", cost=0.0), rec("wrong_answer", task="b", cost=0.0)]
    assert scoring.score(free).price is None
    named = [{**r, "price_source": {"source": "models-file"}} for r in free]
    assert scoring.score(named).price == 0.0
    paid = [rec("pass", 1.0, task="a", cost=0.3), rec("wrong_answer", task="b", cost=0.1)]
    assert scoring.score(paid).price == pytest.approx(0.2)


def test_breakdown_groups_by_key():
    groups = dict(scoring.breakdown([rec("pass", 1.0, difficulty="easy"),
                                     rec("wrong_answer", difficulty="hard")], "difficulty"))
    assert groups["easy"].pass_rate == 1.0 and groups["hard"].pass_rate == 0.0


def test_pass_at_k_matches_the_unbiased_estimator():
    assert scoring.pass_at_k(10, 0, 1) == 0.0
    assert scoring.pass_at_k(10, 10, 5) == 1.0
    assert scoring.pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert scoring.pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))


def test_stats_median_and_spread():
    st = timing.summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert st.median == 3.0 and st.n == 5 and st.min == 1.0
    assert st.spread == pytest.approx((4.0 - 2.0) / 3.0)


def test_max_over_ranks_takes_the_slowest_rank_per_repetition():
    assert timing.max_over_ranks([[1, 5, 2], [3, 1, 2]]) == [3, 5, 2]
    with pytest.raises(ValueError):
        timing.max_over_ranks([[1, 2], [1]])


def test_speedup_is_reference_time_over_solution_time():
    fast, slow = timing.summarize([1.0]), timing.summarize([2.0])
    assert timing.speedup(ref=slow, sol=fast) == 2.0
    assert timing.speedup(ref=fast, sol=slow) == 0.5


def test_bus_bandwidth_the_nccl_tests_way():
    # 1 GB all-reduce over 4 ranks in 1 s: algbw 1 GB/s, busbw 2*(4-1)/4 = 1.5 GB/s
    assert timing.metric_value(1.0, 10**9, 1.5, "busbw", "GB/s") == pytest.approx(1.5)
    assert timing.metric_value(1.0, 10**9, 1.5, "algbw", "GB/s") == pytest.approx(1.0)
    assert timing.metric_value(2e-6, 0, 1.0, "none", "us") == pytest.approx(2.0)


def test_an_item_that_started_and_never_ended_counts_as_a_failure():
    """A killed run, a crashed worker or a solution that killed its own worker leaves an
    "aborted" item: applicable and not passed (else a solution could turn a fail into
    "not applicable" by taking its process down). Skips and infra errors stay out."""
    s = scoring.score([rec("pass", 1.0), rec("aborted"), rec("skipped"), rec("infra_error")])
    assert s.applicable == 2 and s.passes == 1 and s.not_applicable == 2
    assert s.pass_rate == pytest.approx(0.5)
    assert "aborted" not in scoring.NOT_APPLICABLE


def test_a_task_is_scored_once_over_its_world_sizes():
    from pytest_commbench.scoring import per_task, score

    def rec(task, world, verdict, speedup=None, cost=0.0):
        return {"task": task, "world": world, "verdict": verdict, "speedup": speedup,
                "cost": cost, "kind": "solution", "candidate": ""}

    records = [rec("a", 2, "pass", 2.0, cost=0.5), rec("a", 4, "pass", 0.5),   # GM 1.0
               rec("b", 2, "pass", 1.0), rec("b", 4, "wrong_answer"),          # fails
               rec("c", 2, "pass", 1.5), rec("c", 8, "skipped"),                # 8 GPUs absent
               rec("d", 2, "infra_error"), rec("d", 4, "skipped")]              # not applicable
    tasks = {t["task"]: t for t in per_task(records)}
    assert tasks["a"]["verdict"] == "pass" and tasks["a"]["speedup"] == pytest.approx(1.0)
    assert tasks["a"]["cost"] == 0.5 and tasks["a"]["worlds"] == [2, 4]
    assert tasks["b"]["verdict"] == "wrong_answer" and tasks["b"]["speedup"] is None
    assert tasks["c"]["verdict"] == "pass" and tasks["c"]["speedup"] == 1.5
    s = score(per_task(records))
    assert (s.applicable, s.passes, s.not_applicable) == (3, 2, 1)
    assert s.pass_rate == pytest.approx(2 / 3)
    assert s.gm_speedup == pytest.approx(1.5 ** 0.5)
    assert s.price == pytest.approx(0.5 / 3)


@pytest.mark.parametrize("dof, want", [(1, 6.3138), (2, 2.9200), (4, 2.1318), (10, 1.8125),
                                       (100, 1.6602)])
def test_t_quantiles_match_the_tables(dof, want):
    assert timing.t_quantile(0.95, dof) == pytest.approx(want, abs=2e-4)


def test_a_band_needs_its_whole_interval_and_an_uncontended_timing():
    assert scoring.band(1.0) == "Comparable"  # a record of an older run: no trust, the plain band
    assert scoring.band(1.0, [0.97, 1.03], "ok") == "Comparable"
    assert scoring.band(1.0, [0.97, 1.03], "noisy") == "Comparable"  # the interval speaks for it
    assert scoring.band(1.0, [0.97, 1.03], "contended") == "inconclusive"
    assert scoring.band(0.96, [0.93, 0.99], "ok") == "inconclusive"  # straddles 0.95
    assert scoring.band(1.3, None, "ok") == "inconclusive"  # no error, no band
    assert scoring.band(None, None, "ok") == ""
    iv = timing.interval90(1.0, 0.01, 2)  # two jobs a role: t(0.95, 2 dof) = 2.92
    assert iv == pytest.approx([math.exp(-0.0292), math.exp(0.0292)], rel=1e-4)
    assert timing.interval90(1.0, None, 3) is None and timing.interval90(1.0, 0.01, 1) is None


def test_a_tasks_interval_and_trust_come_from_its_world_sizes():
    common = {"task": "a", "kind": "solution", "verdict": "pass"}
    records = [{**common, "world": 2, "speedup": 1.0, "speedup_ci90": [0.9, 1 / 0.9],
                "timing_trust": "ok"},
               {**common, "world": 4, "speedup": 1.0, "speedup_ci90": [0.9, 1 / 0.9],
                "timing_trust": "noisy"},
               {"task": "b", "kind": "solution", "verdict": "pass", "world": 2, "speedup": 2.0,
                "speedup_ci90": [1.9, 2.1], "timing_trust": "contended"}]
    tasks = {t["task"]: t for t in scoring.per_task(records)}
    assert tasks["a"]["timing_trust"] == "noisy"
    half = math.log(1 / 0.9) * math.sqrt(2) / 2  # two equal errors, a mean of two
    assert tasks["a"]["speedup_ci90"] == pytest.approx([math.exp(-half), math.exp(half)])
    s = scoring.score(records)
    assert s.gm_speedup == pytest.approx(2 ** 0.5)
    lo, hi = s.gm_ci90
    assert lo < s.gm_speedup < hi and s.pass_x_gm_ci90 == pytest.approx([lo, hi])
    # a passing task without an interval: GM-Speedup has none either
    assert scoring.score([*records, {"task": "c", "kind": "solution", "verdict": "pass",
                             "speedup": 1.0}]).gm_ci90 is None


def test_passes_by_round_counts_each_models_task_apart():
    from pytest_commbench.scoring import passes_by_round

    history = [{"round": 1, "verdict": "wrong_answer"}, {"round": 2, "verdict": "pass"}]
    recs = [{"model": "a", "task": "t", "candidate": "", "verdict": "pass", "round": 2,
             "round_history": history},
            {"model": "b", "task": "t", "candidate": "", "verdict": "pass", "round": 1,
             "round_history": history[:1]},
            {"model": "b", "task": "u", "candidate": "", "verdict": "timeout", "round": None,
             "round_history": history}]
    # three tasks (one of a, two of b): b's t by round 1, a's t by round 2, b's u never
    assert passes_by_round(recs) == [(1, 1), (2, 2)]


def test_bootstrap_intervals_hold_the_scores_and_repeat():
    recs = [{"task": f"t{k}", "nodeid": f"t{k}", "verdict": "pass" if k % 3 else "wrong_answer",
             "speedup": 0.5 + k / 10 if k % 3 else None} for k in range(12)]
    s, iv = scoring.score(recs), scoring.bootstrap(recs)
    assert iv == scoring.bootstrap(recs) and iv.tasks == 12 and iv.resamples == 2000
    for name in ("pass_rate", "pass_good", "gm_speedup", "pass_x_gm"):
        lo, hi = getattr(iv, name)
        assert lo <= getattr(s, name) <= hi and lo < hi
    assert scoring.bootstrap(recs, seed=1) != iv  # other draws, other bounds


def _headline(records):
    from pytest_commbench.report import headline

    return headline(records, scoring.score(records))


def test_the_headline_leads_with_what_was_measured():
    base = {"event": "result", "kind": "solution", "world": 2, "category": "p2p",
            "library": "mpi", "difficulty": "easy", "model": "m", "candidate": ""}
    timed = [{**base, "task": f"p2p/t{i}", "nodeid": f"t{i}", "verdict": "pass",
              "speedup": 1.5, "speedup_ci90": [1.4, 1.6], "timing_trust": "ok"} for i in range(2)]
    (line,) = _headline(timed)
    assert "GM-Speedup 1.500 (90% CI " in line and "PASS+Good 100.0%" in line, line
    contended = [{**r, "timing_trust": "contended"} for r in timed]
    first, why = _headline(contended)
    assert first.startswith("Pass Rate 100.0% (2/2)") and "GM-Speedup" not in first
    assert "left out" in why and "contended" in why and "--commbench-check-only" in why
    # one readable item keeps the speedup scores
    assert "GM-Speedup" in _headline([timed[0], contended[1]])[0]
    checked = [{**r, "speedup": None, "speedup_ci90": None, "check_only": True,
                "timing_trust": None} for r in timed]
    (only,) = _headline(checked)
    assert "nothing was timed" in only and "GM-Speedup" not in only and "PASS+Good" not in only


def test_a_run_timed_only_on_a_contended_host_prints_no_speedup_score():
    """fast_p and the scores' intervals are speedup scores too: left out with PASS+Good and
    GM-Speedup where no timing could be read; the per-size table says its bandwidths are
    not to be read."""
    from pytest_commbench.report import render

    base = {"event": "result", "kind": "solution", "world": 2, "category": "p2p",
            "library": "mpi", "difficulty": "easy", "model": "m", "candidate": "",
            "sizes": [{"count": 1024, "dtype": "float64", "time_s": 1e-5, "ref_time_s": 1e-5,
                       "speedup": 1.0, "metric": 1.0, "ref_metric": 1.0}]}
    timed = [{**base, "task": f"p2p/t{i}", "nodeid": f"t{i}", "verdict": "pass",
              "speedup": 1.5 + i, "speedup_ci90": [1.4, 1.6 + i]} for i in range(3)]

    def lines(records):
        out = []
        render(records, out.append, lambda *a, **k: None)
        return "\n".join(out)

    readable = lines([{**r, "timing_trust": "ok"} for r in timed])
    assert "fast_1 " in readable and "GM-Speedup" in readable
    contended = lines([{**r, "timing_trust": "contended"} for r in timed])
    assert "fast_" not in contended and "GM-Speedup left out" in contended, contended
    assert "PASS+Good 100.0%" not in contended and "90% CI" not in contended, contended
    # ... nor in the breakdowns by difficulty, category and library (GM 2.359 where readable)
    assert readable.count("2.359") >= 6 and "2.359" not in contended, contended


def test_per_size_bandwidths_are_the_nccl_tests_columns():
    """algbw = bytes / time; busbw = the task's busbw metric (algbw x the collective's
    factor) where its manifest names busbw; nothing for a metric that is a time."""
    from pytest_commbench.htmlreport import _sizes_table
    from pytest_commbench.report import bandwidths, size_rows

    # 1 MiB all-reduce at 2 ranks: busbw = algbw x 2 (n - 1) / n = algbw
    size = {"count": 262144, "dtype": "float32", "bytes": 1 << 20, "t_sol_us": 10.0,
            "t_ref_us": 20.0, "speedup": 2.0, "metric": "busbw", "unit": "GB/s",
            "value_sol": 104.8576, "value_ref": 52.4288}
    algbw, busbw = bandwidths(size)
    assert algbw == pytest.approx((1 << 20) / 10e-6 / 1e9) and busbw == 104.8576
    assert bandwidths(size, "ref") == (pytest.approx((1 << 20) / 20e-6 / 1e9), 52.4288)
    assert bandwidths({**size, "metric": "algbw"})[1] is None
    assert bandwidths({**size, "metric": "latency", "unit": "us"}) == (None, None)
    record = {"task": "collective/x", "world": 2, "nodeid": "x", "verdict": "pass",
              "sizes": [size, {**size, "metric": "latency", "unit": "us"}]}
    (row,) = size_rows([record])
    assert row[:5] == ["collective/x", 2, 1 << 20, 262144, "float32"]
    assert row[5:] == ["10.00", "104.86", "104.86", "20.00", "52.43", "2.000"]
    assert size_rows([{**record, "verdict": "wrong_answer"}]) == []
    page = _sizes_table([size])
    assert "busbw GB/s (ref / sol)" in page and "52.43 / 104.86" in page
    assert "busbw" not in _sizes_table([{**size, "metric": "latency", "unit": "us"}])
