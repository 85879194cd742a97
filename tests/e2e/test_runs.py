"""Runs found and picked: `commbench runs` lists a runs folder's runs, `commbench label` names
one, and `commbench report RUNS_DIR` takes per model the run in which the most items ran
(never a newer one-item or all-skipped run unnoticed), picks by --model and --run-label, and
refuses two runs of one model that judged the same items unless they are labelled apart."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

from pytest_commbench import leaderboard
from pytest_commbench.cli import main

COMMON = {"category": "p2p", "library": "mpi", "difficulty": "easy", "setup": "bare-metal",
          "kind": "solution", "candidate": "", "platform": "cpu", "refine_rounds": 1,
          "fingerprint": {"platform": "cpu"}}


def _run(root: Path, run: str, model: str, started: str, seed: int,
         verdicts: dict[str, str]) -> Path:
    """A run folder as a session leaves it: run.json and a results log of one item per
    task (np2) with the verdicts given."""
    folder = root / run
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({
        "run": run, "seed": seed, "model": model, "platform": "cpu", "started": started}))
    lines = []
    for task, verdict in verdicts.items():
        node = f"suites/p2p/{task}/task.toml::{task}[np2]"
        base = {**COMMON, "model": model, "run": run, "nodeid": node, "task": f"p2p/{task}",
                "world": 2, "started": started}
        lines.append({**base, "event": "started"})
        lines.append({**base, "event": "result", "verdict": verdict, "seed": seed,
                      **({"speedup": 1.0} if verdict == "pass" else {})})
    (folder / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest_commbench.cli", *args],
                          capture_output=True, text=True, timeout=120)


def _runs_dir(tmp_path: Path) -> Path:
    """Model m: a full run (3 items), then a one-item rerun, then an all-skipped run; model
    n: one run of 2 items."""
    root = tmp_path / "runs"
    _run(root, "20261201-100000-aaaaaa", "m", "2026-12-01T10:00:00+0000", 11,
         {"ping": "pass", "ring": "pass", "halo": "wrong_answer"})
    _run(root, "20261201-110000-bbbbbb", "m", "2026-12-01T11:00:00+0000", 12,
         {"ring": "runtime_error"})
    _run(root, "20261201-120000-cccccc", "m", "2026-12-01T12:00:00+0000", 13,
         {"ping": "skipped", "ring": "skipped"})
    _run(root, "20261201-093000-dddddd", "n", "2026-12-01T09:30:00+0000", 14,
         {"ping": "pass", "ring": "timeout"})
    return root


def test_runs_lists_every_run_newest_first_with_what_it_holds(tmp_path):
    root = _runs_dir(tmp_path)
    done = _cli("runs", str(root))
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()
            if line.startswith("20261201-")]
    # run, model, label, started, platform, items ran, skipped, passes, seed, in report
    assert rows == [
        ["20261201-120000-cccccc", "m", "-", "2026-12-01T12:00:00+0000", "cpu", "0", "2", "0",
         "13", "-"],
        ["20261201-110000-bbbbbb", "m", "-", "2026-12-01T11:00:00+0000", "cpu", "1", "0", "0",
         "12", "-"],
        ["20261201-100000-aaaaaa", "m", "-", "2026-12-01T10:00:00+0000", "cpu", "3", "0", "2",
         "11", "yes"],
        ["20261201-093000-dddddd", "n", "-", "2026-12-01T09:30:00+0000", "cpu", "2", "0", "1",
         "14", "yes"]]
    assert _cli("runs", str(tmp_path / "none")).returncode == 2


def test_report_of_a_runs_folder_takes_each_models_fullest_run_and_says_what_it_left(tmp_path):
    root = _runs_dir(tmp_path)
    done = _cli("report", str(root))
    assert done.returncode == 0, done.stderr
    assert "commbench: model m" in done.stdout and "commbench: model n" in done.stdout
    assert "Pass Rate 66.7% (2/3)" in done.stdout  # m's full run, not the one-item rerun
    notes = [x for x in done.stderr.splitlines() if x.startswith("commbench report: left out")]
    assert len(notes) == 2
    assert any("20261201-120000-cccccc" in x and "every item skipped" in x for x in notes)
    assert any("20261201-110000-bbbbbb" in x and "run 20261201-100000-aaaaaa of the same "
               "model ran 3 items" in x for x in notes)
    only_n = _cli("report", str(root), "--model", "n")
    assert only_n.returncode == 0, only_n.stderr
    assert "commbench: model n" in only_n.stdout and "model m" not in only_n.stdout
    assert "Pass Rate 50.0% (1/2)" in only_n.stdout
    none = _cli("report", str(root), "--model", "nobody")
    assert none.returncode == 2 and "no results log" in none.stderr


def test_two_runs_of_one_model_judging_the_same_items_are_refused_unless_labelled(tmp_path):
    root = _runs_dir(tmp_path)
    full, rerun = (str(root / r / "results.jsonl") for r in ("20261201-100000-aaaaaa",
                                                             "20261201-110000-bbbbbb"))
    refused = _cli("report", full, rerun)
    assert refused.returncode == 2
    assert ("model m: runs 20261201-100000-aaaaaa and 20261201-110000-bbbbbb both judged 1 "
            "item (e.g. suites/p2p/ring/task.toml::ring[np2])") in refused.stderr
    assert _cli("report", full, rerun, "--label", "v1", "--label", "v2").returncode == 0
    # runs of disjoint items (a suite run in parts) pool as before
    part = _run(tmp_path / "more", "20261201-130000-eeeeee", "m", "2026-12-01T13:00:00+0000",
                15, {"bcast": "pass"})
    pooled = _cli("report", full, str(part))
    assert pooled.returncode == 0, pooled.stderr
    assert "Pass Rate 75.0% (3/4)" in pooled.stdout


def test_a_label_keeps_a_run_apart_and_picks_it(tmp_path, capsys):
    root = _runs_dir(tmp_path)
    assert main(["label", str(root / "20261201-110000-bbbbbb"), "rerun"]) == 0
    info = json.loads((root / "20261201-110000-bbbbbb" / "run.json").read_text())
    assert info["label"] == "rerun" and info["seed"] == 12  # the rest kept
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", str(root)]) == 0
    text = out.getvalue()
    # both runs of m: the labelled one is an entry of its own
    assert " commbench: model m [rerun] " in text and " commbench: model m " in text
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", str(root), "--run-label", "rerun"]) == 0
    text = out.getvalue()
    assert "commbench: model m [rerun]" in text and "model n" not in text
    assert "Pass Rate 0.0% (0/1)" in text
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["runs", str(root)]) == 0
    assert main(["label", str(root / "20261201-110000-bbbbbb"), ""]) == 0
    assert "label" not in json.loads((root / "20261201-110000-bbbbbb" / "run.json").read_text())
    assert main(["label", str(tmp_path / "nowhere"), "x"]) == 2
    capsys.readouterr()


def test_a_model_of_no_judged_task_is_listed_and_never_ranked():
    base = {**COMMON, "event": "result", "world": 2}
    recs = []
    for k in range(4):
        recs.append({**base, "model": "good", "nodeid": f"g{k}", "task": f"t{k}",
                     "verdict": "pass", "speedup": 1.0})
        recs.append({**base, "model": "blank", "nodeid": f"b{k}", "task": f"t{k}",
                     "verdict": "infra_error" if k % 2 else "skipped"})
    board = leaderboard.build(recs)
    assert [(e.label, e.rank, e.tier) for e in board.entries] == [
        ("good", 1, 1), ("blank", None, None)]
    table = next(t for t in leaderboard.tables(board) if t.title.startswith("Table 2:"))
    assert table.rows[1][:3] == ["-", "-", "blank"]
    assert table.rows[1][3] == "-" and table.rows[1][7] == "0/0"
