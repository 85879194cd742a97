"""Leaderboards (`commbench report RUN... --out DIR`): every table checked against numbers
computed here by hand from the recorded logs of fixtures/leaderboard, the figures written,
the files round-tripped, the fingerprints never pooled, the terminal summary the same
renderer's."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from pytest_commbench import leaderboard
from pytest_commbench.cli import main
from pytest_commbench.report import speed_readable
from pytest_commbench.results import load

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "leaderboard"
H200 = sorted((FIXTURES / "h200").glob("*.jsonl"))
CPU = sorted((FIXTURES / "cpu").glob("*.jsonl"))
MODELS = FIXTURES / "models.toml"
LABELS = {"atlas.jsonl": "atlas", "birch.jsonl": "birch", "cedar.jsonl": "cedar",
          "dune.jsonl": "dune (1 round)", "dune-budget.jsonl": "dune (4 rounds, $0.30/task budget)",
          "reference.jsonl": "reference"}
PRICES = {"atlas": (5.0, 25.0), "birch": (0.5, 2.0), "cedar": (1.0, 4.0), "dune": (2.0, 10.0)}


def _records(paths) -> list[dict]:
    return [r for p in paths for r in load(p)]


@pytest.fixture(scope="module")
def board() -> leaderboard.Board:
    return leaderboard.build(_records(H200), MODELS)


# -- by hand: straight from the JSON lines, nothing of the package ---------------------------

def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _hand(path: Path) -> dict:
    """One log's items at np2 (np4 and np8 were skipped: the machine has 2 GPUs): pass or not,
    speedup, cost; an item that started and never finished failed."""
    results = {e["nodeid"]: e for e in _lines(path) if e["event"] == "result"}
    started = {e["nodeid"]: e for e in _lines(path) if e["event"] == "started"}
    assert all(r["verdict"] == "skipped" for r in results.values() if r["world"] != 2)
    items = []
    for node, s in started.items():
        r = results.get(node)
        items.append({"task": s["task"], "candidate": s["candidate"], "difficulty":
                      s["difficulty"], "category": s["category"], "library": s["library"],
                      "pass": r is not None and r["verdict"] == "pass",
                      "speedup": r and r["speedup"], "cost": (r or {}).get("cost") or 0.0,
                      "round": (r or {}).get("round"), "tokens_in": (r or {}).get("tokens_in"),
                      "tokens_out": (r or {}).get("tokens_out")})
    n = len(items)
    passing = [i for i in items if i["pass"]]
    gm = math.exp(sum(math.log(i["speedup"]) for i in passing) / len(passing))
    return {"items": items, "n": n, "passes": len(passing),
            "good": sum(1 for i in passing if i["speedup"] >= 0.95),
            "pass_rate": len(passing) / n, "gm": gm, "pass_x_gm": len(passing) / n * gm,
            "price": sum(i["cost"] for i in items) / n}


HAND = {LABELS[p.name]: _hand(p) for p in H200}


def _csv_rows(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as f:
        return {row["label"]: row for row in csv.DictReader(f)}


@pytest.fixture(scope="module")
def out(board, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("leaderboard")
    leaderboard.write(board, folder, "commbench report ...")
    return folder


# -- Table 2 ---------------------------------------------------------------------------------

def test_the_leaderboard_matches_the_logs_counted_by_hand(board, out):
    rows = _csv_rows(out / "leaderboard.csv")
    assert set(rows) == set(HAND)
    for label, hand in HAND.items():
        row = rows[label]
        assert int(row["tasks"]) == hand["n"] and int(row["passes"]) == hand["passes"]
        assert int(row["good"]) == hand["good"]
        assert float(row["pass_rate"]) == pytest.approx(hand["pass_rate"])
        assert float(row["pass_good"]) == pytest.approx(hand["good"] / hand["n"])
        assert float(row["gm_speedup"]) == pytest.approx(hand["gm"])
        assert float(row["pass_x_gm"]) == pytest.approx(hand["pass_x_gm"])
        if label == "reference":
            assert row["price"] == "" and row["open_weights"] == ""  # no prices, no registry
        else:
            assert float(row["price"]) == pytest.approx(hand["price"])
    # the same numbers, read off the logs once more: passes, tasks and the ranking
    assert {k: (h["passes"], h["n"]) for k, h in HAND.items()} == {
        "reference": (16, 16), "cedar": (11, 16), "dune (4 rounds, $0.30/task budget)": (10, 16),
        "atlas": (9, 16), "birch": (18, 48), "dune (1 round)": (5, 16)}
    ranked = sorted(HAND, key=lambda k: -HAND[k]["pass_x_gm"])
    assert [e.label for e in board.entries] == ranked
    assert [int(rows[k]["rank"]) for k in ranked] == [1, 2, 3, 4, 5, 6]
    assert rows["atlas"]["open_weights"] == "False" and rows["birch"]["open_weights"] == "True"


def test_costs_are_the_tokens_at_the_models_prices():
    for label, hand in HAND.items():
        model = label.split()[0]
        if model == "reference":
            continue
        p_in, p_out = PRICES[model]
        for i in hand["items"]:
            if i["tokens_in"] is not None:
                # the rounds' tokens at the prices (rounded to a millionth of a dollar)
                assert i["cost"] == pytest.approx((i["tokens_in"] * p_in + i["tokens_out"]
                                                   * p_out) / 1e6, abs=1e-5)


def test_tiers_split_only_where_adjacent_intervals_separate(board, out):
    rows = sorted(json.loads((out / "leaderboard.json").read_text())["models"],
                  key=lambda r: r["rank"])
    tier = 1
    for upper, lower in zip(rows, rows[1:]):
        if upper["pass_x_gm_lo"] > lower["pass_x_gm_hi"]:
            tier += 1
        assert lower["tier"] == tier
    # the reference (every task, speedup ~1) stands apart; 16 tasks tell the rest apart from
    # nothing else
    assert [r["tier"] for r in rows] == [1, 2, 2, 2, 2, 2]


def test_a_model_that_passes_nothing_ranks_below_and_apart():
    common = {"event": "result", "kind": "solution", "category": "p2p", "library": "mpi",
              "difficulty": "easy", "setup": "bare-metal", "world": 2}
    recs = []
    for k in range(20):
        recs.append({**common, "model": "good", "nodeid": f"g{k}", "task": f"t{k}",
                     "verdict": "pass", "speedup": 1.0 + k / 100})
        recs.append({**common, "model": "none", "nodeid": f"n{k}", "task": f"t{k}",
                     "verdict": "wrong_answer", "speedup": None})
        for model, passes in (("half", k < 10), ("half+1", k < 11)):
            recs.append({**common, "model": model, "nodeid": f"{model}{k}", "task": f"t{k}",
                         "verdict": "pass" if passes else "timeout",
                         "speedup": 1.0 if passes else None})
    b = leaderboard.build(recs)
    assert [(e.label, e.tier) for e in b.entries] == [
        ("good", 1), ("half+1", 2), ("half", 2), ("none", 3)]
    assert b.entries[-1].intervals.pass_x_gm is None  # Pass x GM of no pass is no number


# -- Table 1 ---------------------------------------------------------------------------------

def test_the_suite_composition_is_counted_by_hand(board):
    tasks = {e["task"]: e for e in _lines(FIXTURES / "h200" / "reference.jsonl")}
    assert len(tasks) == 16
    for dim, want in (("category", {"collective": 6, "ep": 2, "fusion": 2, "p2p": 3,
                                    "utility": 3}),
                      ("library", {"cuda-runtime": 10, "cupy": 3, "nccl": 1, "nccl-device": 1,
                                   "nvshmem": 1})):
        assert Counter(t[dim] for t in tasks.values()) == want
        rows = {r[dim]: r for r in leaderboard.composition(board, dim)}
        for value, n in want.items():
            mine = [t for t in tasks.values() if t[dim] == value]
            assert rows[value]["tasks"] == n
            assert rows[value]["share"] == pytest.approx(n / 16)
            for d in ("easy", "medium", "hard"):
                assert rows[value][d] == sum(1 for t in mine if t["difficulty"] == d)
            assert rows[value]["bare-metal"] == sum(1 for t in mine
                                                    if t["setup"] == "bare-metal")
        assert rows["total"]["tasks"] == 16 and rows["total"]["share"] == 1.0
    assert leaderboard.composition(board, "category")[-1]["bare-metal"] == 9


# -- Figures 1-3 -----------------------------------------------------------------------------

def _rate(items, key, value):
    mine = [i for i in items if i[key] == value]
    return sum(i["pass"] for i in mine) / len(mine)


@pytest.mark.parametrize("key", ["difficulty", "category", "library"])
def test_pass_rates_by_difficulty_category_and_library(board, key):
    got = leaderboard.pass_rate_by(board, key)
    for label, hand in HAND.items():
        values = {i[key] for i in hand["items"]}
        assert got[label] == pytest.approx({v: _rate(hand["items"], key, v) for v in values})
    assert got["atlas"]["easy" if key == "difficulty" else next(iter(got["atlas"]))] >= 0
    # the counts the figures print on the bars and draw their intervals from
    counts = leaderboard.passes_by(board, key)
    for label, hand in HAND.items():
        for v in {i[key] for i in hand["items"]}:
            mine = [i for i in hand["items"] if i[key] == v]
            assert counts[label][v] == (sum(i["pass"] for i in mine), len(mine))


def test_the_wilson_interval_of_a_pass_rate():
    from pytest_commbench.scoring import wilson

    # none of n passed: the upper bound is z^2 / (n + z^2), the lower 0
    assert wilson(0, 10) == pytest.approx([0.0, 1.645 ** 2 / (10 + 1.645 ** 2)])
    lo, hi = wilson(10, 10)
    assert hi == pytest.approx(1.0) and lo == pytest.approx(10 / (10 + 1.645 ** 2))
    # it holds the estimate, and narrows as the tasks grow
    for p, n in ((3, 7), (30, 70), (1, 2)):
        lo, hi = wilson(p, n)
        assert lo < p / n < hi
    assert wilson(30, 70)[1] - wilson(30, 70)[0] < wilson(3, 7)[1] - wilson(3, 7)[0]
    assert wilson(0, 0) is None


def test_bands_over_passing_tasks(board):
    def hand_band(s):
        return ("Better" if s >= 1.2 else "Comparable" if s >= 0.95 else "Degraded"
                if s >= 0.6 else "Severely degraded")

    got = leaderboard.bands(board)
    for label, hand in HAND.items():
        want = Counter(hand_band(i["speedup"]) for i in hand["items"] if i["pass"])
        assert {b: n for b, n in got[label].items() if n} == dict(want)
        assert sum(got[label].values()) == hand["passes"]


# -- Table 3 and pass@k ----------------------------------------------------------------------

def test_cumulative_passes_per_round(board):
    got = leaderboard.rounds(board)
    assert set(got) == {"cedar", "dune (4 rounds, $0.30/task budget)"}
    for label, series in got.items():
        items = HAND[label]["items"]
        for n, passed in series:
            assert passed == sum(1 for i in items if i["round"] is not None and i["round"] <= n)
    assert got["cedar"] == [(1, 9), (2, 10), (3, 11)]
    assert got["dune (4 rounds, $0.30/task budget)"] == [(1, 3), (2, 7), (3, 10), (4, 10)]


def test_pass_at_k_for_every_k_run(board):
    per_task = defaultdict(list)
    for i in HAND["birch"]["items"]:
        per_task[i["task"]].append(i["pass"])
    assert all(len(v) == 3 for v in per_task.values())

    def at(k):
        return sum(1 - math.comb(3 - sum(v), k) / math.comb(3, k)
                   for v in per_task.values()) / len(per_task)

    assert leaderboard.pass_at_k(board) == {
        "birch": [(1, pytest.approx(at(1))), (2, pytest.approx(at(2))),
                  (3, pytest.approx(at(3)))]}
    assert at(3) == sum(any(v) for v in per_task.values()) / 16


# -- Table 4 ---------------------------------------------------------------------------------

def test_cost_matched_comparison(board):
    rows = leaderboard.cost_matched(board)
    priced = sorted((h["price"], label) for label, h in HAND.items() if label != "reference")
    assert [r["label"] for r in rows] == [label for _, label in priced]
    base = HAND["atlas"]  # the best-ranked single round with a price
    for r in rows:
        hand = HAND[r["label"]]
        assert r["baseline"] == "atlas"
        assert r["spend_ratio"] == pytest.approx(hand["price"] / base["price"])
        assert r["pass_x_gm_gain"] == pytest.approx(hand["pass_x_gm"] - base["pass_x_gm"])
    budget = next(r for r in rows if r["budget_usd"] is not None)
    assert budget["budget_usd"] == 0.30 and budget["refine_rounds"] == 4
    # about atlas's spend, and more of the tasks passed
    assert 0.8 < budget["spend_ratio"] < 1.0 and budget["pass_x_gm_gain"] > 0


def test_no_cost_matched_table_without_a_budget():
    b = leaderboard.build(_records([FIXTURES / "h200" / "atlas.jsonl",
                                    FIXTURES / "h200" / "cedar.jsonl"]), MODELS)
    assert leaderboard.cost_matched(b) == []
    assert not any(t.title.startswith("Table 4") for t in leaderboard.tables(b))


# -- speedup by size -------------------------------------------------------------------------

def test_speedups_by_size_per_task_and_model(board):
    got = leaderboard.speedups_by_size(board)
    ref = {e["task"]: e for e in _lines(FIXTURES / "h200" / "reference.jsonl")
           if e["event"] == "result" and e["world"] == 2}
    assert set(got) == set(ref)
    for task, series in got.items():
        mine = next(s for s in series if s["series"] == "reference np2")
        assert mine["points"] == [(s["bytes"], s["count"], s["speedup"])
                                  for s in ref[task]["sizes"]]
        passed = {label for label, h in HAND.items() for i in h["items"]
                  if i["task"] == task and i["pass"]}
        assert {s["series"].rsplit(" np2", 1)[0] for s in series} == passed


# -- bootstrap -------------------------------------------------------------------------------

def test_bootstrap_intervals_are_deterministic_and_hold_the_estimate(board):
    again = leaderboard.build(_records(H200), MODELS)
    for a, b in zip(board.entries, again.entries):
        assert a.intervals == b.intervals
        for metric in leaderboard.METRICS:
            lo, hi = getattr(a.intervals, metric)
            assert lo <= getattr(a.scores, metric) <= hi
        assert a.intervals.resamples == 2000 and a.intervals.tasks == 16
    ref = next(e for e in board.entries if e.label == "reference")
    assert ref.intervals.pass_rate == [1.0, 1.0]  # every task passes in every draw


def test_bootstrap_of_one_pass_and_one_fail():
    """Draws of two tasks, one passing: pass rate 0, 1/2 or 1 with chances 1/4, 1/2, 1/4, so
    the central 90% reaches from 0 to 1."""
    from pytest_commbench.scoring import bootstrap

    recs = [{"task": "a", "nodeid": "a", "verdict": "pass", "speedup": 2.0},
            {"task": "b", "nodeid": "b", "verdict": "runtime_error", "speedup": None}]
    iv = bootstrap(recs)
    assert iv.pass_rate == [0.0, 1.0] and iv.gm_speedup == [2.0, 2.0]
    assert iv.pass_x_gm == [0.0, 2.0]


# -- files -----------------------------------------------------------------------------------

FIGURES = ("fig1-pass-rate-by-difficulty.png", "fig2-performance-bands.png",
           "fig3-pass-rate-by-category-and-library.png")


def test_every_figure_is_a_png_and_not_empty(out):
    pytest.importorskip("matplotlib")
    tasks = {e["task"] for e in _lines(FIXTURES / "h200" / "reference.jsonl")}
    want = [*FIGURES, *(f"speedup-{t.replace('/', '-')}.png" for t in tasks)]
    for name in want:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    md = (out / "report.md").read_text()
    for name in want:
        assert f"]({name})" in md


def test_without_matplotlib_the_report_draws_text_bars(board, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pytest_commbench.figures", None)  # import fails
    written = leaderboard.write(board, tmp_path)
    assert not list(tmp_path.glob("*.png"))
    assert {p.name for p in written} == {"report.md", "leaderboard.csv", "leaderboard.json"}
    md = (tmp_path / "report.md").read_text()
    assert "## Figure 1: pass rate by difficulty" in md and "#####" in md
    assert ".png" not in md


def test_csv_and_json_round_trip(board, out):
    rows = leaderboard.leaderboard_rows(board)
    assert leaderboard.read_csv(out / "leaderboard.csv") == rows
    data = json.loads((out / "leaderboard.json").read_text())
    assert data["models"] == rows
    assert data["fingerprint"] == board.fingerprint and data["fingerprint"]["gpu"] == "NVIDIA H200"
    assert data["bootstrap"] == {"resamples": 2000, "seed": 20261201, "level": 0.9,
                                 "over": "tasks"}
    assert list(rows[0]) == list(leaderboard.COLUMNS)


def test_fast_p_of_every_model_is_its_logs_counted_by_hand(board, out):
    """fast_p at 0, 1 and 1.5 (KernelBench's): tasks passing with a speedup above p over the
    applicable tasks, from the JSON lines alone; in the CSV and in the command's Table 2b."""
    rows = _csv_rows(out / "leaderboard.csv")
    for label, hand in HAND.items():
        for p, column in ((0, "fast_0"), (1, "fast_1"), (1.5, "fast_1.5")):
            want = sum(1 for i in hand["items"] if i["pass"] and i["speedup"] > p) / hand["n"]
            assert float(rows[label][column]) == pytest.approx(want), (label, p)
    assert float(rows["reference"]["fast_0"]) == 1.0
    md = (out / "report.md").read_text()
    assert "## Table 2b: fast_p" in md


def test_the_summary_says_unknown_for_a_cost_never_priced(board):
    """The reference records a cost of 0 without a price: its summary says the price is
    unknown (as the board's '-'), never $0.0000; a priced model's is its mean cost."""
    by_label = {e.label: e for e in board.entries}
    lines: list[str] = []
    leaderboard.render_run(by_label["reference"].records, lines.append, lambda s, t: None)
    (scores,) = [x for x in lines if x.startswith("Pass Rate")]
    assert "Price unknown/task" in scores and "$0.0000" not in scores
    assert any(x.startswith("fast_p (pass with speedup > p, of 16 tasks): fast_0 100.0%")
               for x in lines)
    lines.clear()
    leaderboard.render_run(by_label["atlas"].records, lines.append, lambda s, t: None)
    (scores,) = [x for x in lines if x.startswith("Pass Rate")]
    assert f"Price ${HAND['atlas']['price']:.4f}/task" in scores


def test_the_report_has_every_table(out):
    md = (out / "report.md").read_text()
    for title in ("Table 1a: the suite by category", "Table 1b: the suite by library",
                  "Table 2: leaderboard", "Table 3: tasks passed after each refinement round",
                  "Table 3b: pass@k", "Table 4: cost-matched comparison",
                  "Figure 1", "Figure 2", "Figure 3", "Speedup by size, per task"):
        assert f"## {title}" in md, title
    assert "| 1   | 1      | reference" in md


# -- fingerprints ----------------------------------------------------------------------------

def test_runs_of_different_machines_are_refused_naming_the_difference():
    records = _records([FIXTURES / "h200" / "reference.jsonl", FIXTURES / "cpu" / "reference.jsonl"])
    with pytest.raises(leaderboard.FingerprintMismatch) as err:
        leaderboard.build(records)
    text = str(err.value)
    first = text.splitlines()[1]  # the platform first, then field by field
    assert first.startswith("  platform: 'h200' (model reference, runs 20261130-095333-226971, ")
    assert "'cpu' (model reference, run 20261201-" in text
    assert "gpu: 'NVIDIA H200'" in text and "(not recorded)" in text
    assert "python: '3.12.3'" in text and "--by-fingerprint" in text
    assert len(re.findall(r"^  platform: ", text, re.M)) == 1


def test_one_differing_field_is_named_alone(tmp_path):
    lines = _lines(FIXTURES / "h200" / "atlas.jsonl")
    for e in lines:
        if e.get("fingerprint"):
            e["fingerprint"] = {**e["fingerprint"], "nccl": "2.27.3"}
    other = tmp_path / "atlas-older-nccl.jsonl"
    other.write_text("".join(json.dumps(e) + "\n" for e in lines))
    with pytest.raises(leaderboard.FingerprintMismatch) as err:
        leaderboard.build(_records([FIXTURES / "h200" / "cedar.jsonl", other]))
    diff = [x.strip() for x in str(err.value).splitlines() if x.startswith("  ")]
    assert diff == ["nccl: '2.28.9' (model cedar, run 20261130-133040-51e7b2) vs '2.27.3' "
                    "(model atlas, run 20261130-110205-3f9a21)"]


def test_the_command_refuses_or_groups_by_fingerprint(tmp_path):
    paths = [str(FIXTURES / "h200" / "atlas.jsonl"), *map(str, CPU)]
    err, stdout = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout):
        assert main(["report", *paths, "--out", str(tmp_path / "none")]) == 2
    assert "platform: 'h200'" in err.getvalue() and not (tmp_path / "none").exists()
    with contextlib.redirect_stdout(stdout):
        assert main(["report", *paths, "--by-fingerprint", "--out", str(tmp_path / "g"),
                     "--models-file", str(MODELS)]) == 0
    groups = sorted(p.name for p in (tmp_path / "g").iterdir())
    assert len(groups) == 2 and groups[0].startswith("cpu-") and groups[1].startswith("h200-")
    cpu = json.loads((tmp_path / "g" / groups[0] / "leaderboard.json").read_text())
    assert [m["label"] for m in cpu["models"]] == ["reference", "template"]
    assert cpu["models"][0]["pass_rate"] == 1.0 and cpu["models"][1]["pass_rate"] == 0.0
    assert cpu["models"][0]["gm_speedup"] is None  # check-only: passes without a speedup
    h200 = json.loads((tmp_path / "g" / groups[1] / "leaderboard.json").read_text())
    assert [m["label"] for m in h200["models"]] == ["atlas"]
    assert "fingerprint group cpu-" in stdout.getvalue()


def test_an_item_that_never_finished_takes_its_runs_fingerprint():
    b = leaderboard.build(_records([FIXTURES / "h200" / "dune.jsonl"]))
    (entry,) = b.entries
    aborted = [r for r in entry.records if r["verdict"] == "aborted"]
    assert len(aborted) == 1 and "fingerprint" not in aborted[0]
    assert entry.scores.applicable == 16 and entry.scores.passes == 5


# -- the terminal: the command and the pytest summary ------------------------------------------

def test_the_command_prints_every_table_and_the_text_figures(tmp_path):
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["report", *map(str, H200), "--models-file", str(MODELS)]) == 0
    text = stdout.getvalue()
    for title in ("Table 1a", "Table 2", "Table 3:", "Table 3b", "Table 4", "Figure 1",
                  "Figure 2", "Figure 3"):
        assert title in text
    assert "commbench: model dune (1 round)" in text  # each entry's own report first
    lines = text.splitlines()
    bar = lines[lines.index("Figure 1: pass rate by difficulty") + 2]
    assert "reference" in bar and "#" * 30 in bar and "100.0%" in bar


def test_the_reports_page_shows_the_leaderboard_of_the_fixtures(board):
    page = (REPO / "docs" / "reports.md").read_text()
    begin = f"<!-- commbench:{leaderboard.README_SECTION} -->\n"
    end = f"\n<!-- /commbench:{leaderboard.README_SECTION} -->"
    block = page[page.index(begin) + len(begin):page.index(end)]
    assert block == leaderboard.leaderboard_markdown(board)
    for name in FIGURES:
        assert f"(leaderboard/{name})" in page
        assert (REPO / "docs" / "leaderboard" / name).stat().st_size > 0
    assert "commbench report fixtures/leaderboard/h200/*.jsonl" in page
    assert "--readme docs/reports.md" in page  # the command that writes the block


def test_the_pytest_summary_is_the_same_renderer(bench):
    bench.add_task()
    bench.add_task(name="ring_allreduce_again")
    result = bench.run_fake()
    result.assert_outcomes(passed=2)
    (log,) = (bench.root / "runs").glob("*/results.jsonl")
    lines: list[str] = []
    records = load(log)
    leaderboard.render_run(records, lines.append, lambda sep, title: None)
    if speed_readable(records):  # the intervals are speedup scores: only where timings read
        assert any(x.startswith("90% intervals over tasks (2000 bootstrap draws of 2 tasks)")
                   for x in lines)
    out = result.stdout.lines
    start = out.index(lines[0])
    assert out[start:start + len(lines)] == lines


def test_a_mutants_run_is_shown_and_never_ranked(tmp_path):
    common = {"event": "result", "category": "p2p", "library": "mpi", "difficulty": "easy",
              "setup": "bare-metal", "world": 2, "task": "p2p/pingpong"}
    recs = [{**common, "model": "mutants", "kind": "mutant", "nodeid": "m1", "candidate":
             "mutant-a", "verdict": "wrong_answer"},
            {**common, "model": "reference", "kind": "solution", "nodeid": "r", "candidate": "",
             "verdict": "pass", "speedup": 1.0}]
    b = leaderboard.build(recs)
    assert [e.label for e in b.entries] == ["reference"]
    assert [e.label for e in b.unranked] == ["mutants"]
    lines: list[str] = []
    leaderboard.render(b, lines.append, lambda sep, title: lines.append(title))
    assert "commbench: model mutants" in lines and "mutants rejected: 1/1" in lines
