"""--commbench-shard K/N: the selected items split by task, the same way on every machine and
run, roughly balanced, each task whole in one shard; the shards of one run recorded as such
and merged by `commbench report`, which refuses overlapping shards and names missing ones."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_commbench import shards
from pytest_commbench.shards import Shard

REPO = Path(__file__).resolve().parents[2]


# -- the split --------------------------------------------------------------------------------

def _items(sizes: dict[str, int]) -> list[SimpleNamespace]:
    """Fake task items: `n` world sizes of each task, as a manifest yields them."""
    return [SimpleNamespace(task=SimpleNamespace(relpath=task), world=w,
                            nodeid=f"suites/{task}/task.toml::{task.split('/')[-1]}[np{w}]")
            for task, n in sizes.items() for w in range(2, 2 + n)]


@pytest.mark.parametrize("text, want", [("1/1", Shard(1, 1)), ("2/4", Shard(2, 4)),
                                        (" 3 / 3 ", Shard(3, 3)), ("10/12", Shard(10, 12))])
def test_a_shard_is_k_of_n(text, want):
    assert shards.parse(text) == want and str(want) == text.replace(" ", "")


@pytest.mark.parametrize("text", ["0/2", "3/2", "1/0", "2", "1/2/3", "a/b", "-1/2", "", "1.5/2"])
def test_a_shard_that_is_not_k_of_n_is_refused(text):
    with pytest.raises(ValueError, match=r"expected K/N"):
        shards.parse(text)


def test_every_task_lands_whole_in_exactly_one_shard_and_the_shards_cover_the_selection():
    items = _items({f"cat{i % 4}/task{i}": 1 + i % 3 for i in range(23)})
    for count in (1, 2, 3, 5, 23, 30):
        parts = [shards.split(items, Shard(k, count))[0] for k in range(1, count + 1)]
        ids = [item.nodeid for part in parts for item in part]
        assert sorted(ids) == sorted(item.nodeid for item in items)  # all, none twice
        home = {}
        for k, part in enumerate(parts, 1):
            for item in part:
                assert home.setdefault(item.task.relpath, k) == k  # never cut apart
        kept, dropped = shards.split(items, Shard(1, count))
        assert len(kept) + len(dropped) == len(items)


def test_the_split_is_balanced_in_items():
    sizes = {f"cat{i % 5}/task{i}": 1 + (i * 7) % 3 for i in range(61)}
    items = _items(sizes)
    for count in (2, 3, 4, 7):
        loads = [len(shards.split(items, Shard(k, count))[0]) for k in range(1, count + 1)]
        # dealt largest first to the lightest shard: apart by at most one task's items
        assert max(loads) - min(loads) <= max(sizes.values()), (count, loads)


def test_the_real_suite_splits_into_near_equal_parts():
    from pytest_commbench.tasks import load_suite

    tasks, _errors = load_suite(REPO / "suites")
    sizes = {t.relpath: len(t.ranks) for t in tasks}
    assert len(sizes) > 50
    for count in (2, 4, 8):
        where = shards.assign(sizes, count)
        loads = [sum(n for task, n in sizes.items() if where[task] == k)
                 for k in range(1, count + 1)]
        assert max(loads) - min(loads) <= max(sizes.values()), (count, loads)


def test_the_split_depends_on_the_tasks_paths_alone_not_on_order_or_pythons_hash():
    sizes = {"p2p/pingpong": 1, "collective/ring_allreduce": 1, "collective/binomial_bcast": 1,
             "p2p/flag_pingpong": 3, "utility/vectorized_copy": 3, "ep/moe_dispatch": 1}
    want = shards.assign(sizes, 3)
    # the same on every machine: SHA-256 of the paths (this table is the contract)
    assert want == {"p2p/flag_pingpong": 1, "utility/vectorized_copy": 2,
                    "p2p/pingpong": 3, "ep/moe_dispatch": 3, "collective/binomial_bcast": 3,
                    "collective/ring_allreduce": 1}, want
    assert shards.assign(dict(reversed(list(sizes.items()))), 3) == want
    items = _items(sizes)
    assert [i.nodeid for i in shards.split(items[::-1], Shard(2, 3))[0]] == \
        [i.nodeid for i in shards.split(items, Shard(2, 3))[0]][::-1]
    # another interpreter with another string-hash salt agrees
    code = ("import json,sys; from pytest_commbench import shards; "
            "print(json.dumps(shards.assign(json.loads(sys.argv[1]), 3), sort_keys=True))")
    for salt in ("1", "12345"):
        done = subprocess.run([sys.executable, "-c", code, json.dumps(sizes)],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONHASHSEED": salt})
        assert json.loads(done.stdout) == want, done.stderr


def test_an_item_of_no_task_is_split_by_its_file():
    plain = [SimpleNamespace(nodeid=f"tests/test_x.py::test_{i}") for i in range(3)]
    kept = [shards.split(plain, Shard(k, 2))[0] for k in (1, 2)]
    assert sorted(len(k) for k in kept) == [0, 3]


def test_the_run_name_of_a_slurm_job_array():
    assert shards.default_name({"SLURM_ARRAY_JOB_ID": "4711", "SLURM_JOB_ID": "4712"}) == \
        "slurm-4711"
    assert shards.default_name({"SLURM_JOB_ID": "4712"}) is None
    assert shards.parse_name("sweep-2026.12_a+b") == "sweep-2026.12_a+b"
    for bad in ("", "a b", "../x", "-x", "x" * 129):
        with pytest.raises(ValueError):
            shards.parse_name(bad)


# -- the option ---------------------------------------------------------------------------

TASKS = ("collective/ring_allreduce", "collective/binomial_bcast", "p2p/pingpong",
         "collective/ring_reduce_scatter", "p2p/ring_exchange")


def _suite(bench) -> None:
    """Five tasks, two of them of two world sizes (7 items)."""
    for i, task in enumerate(TASKS):
        suite = bench.add_task(task, ranks=None)
        manifest = suite / "task.toml"
        sizes = "[2, 3]" if i < 2 else "[2]"
        manifest.write_text(re.sub(r"(?m)^ranks = .*$", f"ranks = {sizes}",
                                   manifest.read_text()))


def _collected(bench, *args: str) -> tuple[list[str], str]:
    result = bench.run("--co", "-q", *args)
    ids = [line for line in result.stdout.lines if "::" in line]
    return ids, result.stdout.str()


def test_shards_deselect_like_k_and_together_make_the_unsharded_selection(bench):
    _suite(bench)
    whole, _ = _collected(bench)
    assert len(whole) == 7
    parts = []
    for k in (1, 2, 3):
        ids, out = _collected(bench, f"--commbench-shard={k}/3", "--commbench-run-name=r1")
        assert f"{len(ids)}/7 tests collected ({7 - len(ids)} deselected)" in out, out
        parts.append(ids)
    assert sorted(i for p in parts for i in p) == sorted(whole)  # disjoint, and all of them
    for p in parts:
        tasks = {i.split("::")[0] for i in p}
        for other in parts:
            if other is not p:
                assert not tasks & {i.split("::")[0] for i in other}  # a task never cut
    assert sorted(len(p) for p in parts) == [2, 2, 3]
    # -k first, then the shard of what it left
    narrowed = [_collected(bench, "-k", "ring", f"--commbench-shard={k}/2",
                           "--commbench-run-name=r1")[0] for k in (1, 2)]
    assert sorted(i for p in narrowed for i in p) == sorted(i for i in whole if "ring" in i)
    # more shards than tasks: a shard of none says so
    empty = bench.run("-k", "pingpong", "--commbench-shard=2/2", "--commbench-run-name=r1")
    assert empty.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    empty.stdout.fnmatch_lines(["commbench: shard 2/2 holds no task: the selection has 1 task, "
                                "fewer than the shards"])
    # the same split again (another process, another hash salt)
    again, _ = _collected(bench, "--commbench-shard=2/3", "--commbench-run-name=r1",
                          "-p", "no:randomly")
    assert again == parts[1]


@pytest.mark.parametrize("args, message", [
    (["--commbench-shard=3/2"], "ERROR: --commbench-shard: expected K/N with 1 <= K <= N "
                                "(e.g. 2/4), got '3/2'"),
    (["--commbench-shard=half"], "ERROR: --commbench-shard: expected K/N (shard K of N, e.g. "
                                 "2/4), got 'half'"),
    (["--commbench-shard=1/2"], "ERROR: --commbench-shard: give the shards of this run a name "
                                "they all share*"),
    (["--commbench-shard=1/2", "--commbench-run-name=a b"], "ERROR: --commbench-run-name: "
                                                             "expected a name*"),
])
def test_a_bad_shard_is_a_one_line_usage_error(bench, args, message):
    bench.add_task()
    result = bench.run(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert len([line for line in result.stderr.lines if line.strip()]) == 1, result.stderr.str()


def test_a_shard_run_records_its_part_and_runs_under_xdist_and_resumes(bench):
    pytest.importorskip("xdist")
    _suite(bench)
    want, _ = _collected(bench, "--commbench-shard=2/3", "--commbench-run-name=r1")
    result = bench.run("--commbench-shard=2/3", "--commbench-run-name=r1", "-n", "2")
    result.assert_outcomes(passed=len(want))
    result.stdout.fnmatch_lines(["commbench: shard 2/3 of the selected tasks, part of run r1"])
    (run,) = [p for p in (bench.root / "runs").iterdir() if p.is_dir()]
    info = json.loads((run / "run.json").read_text())
    assert info["shard"] == "2/3" and info["run_name"] == "r1"
    assert sorted(bench.verdicts()) == sorted(want)
    # killed before its last item ended: resumed, it runs that item alone, as shard 2/3
    log = run / "results.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if json.loads(line)["event"] == "result")
    lost = json.loads(lines[last])["nodeid"]
    log.write_text("".join(lines[:last] + lines[last + 1:]))
    resumed = bench.run(f"--commbench-resume={run.name}", "-n", "2")
    resumed.assert_outcomes(passed=len(want))
    resumed.stdout.fnmatch_lines(["commbench: shard 2/3 of the selected tasks, part of run r1"])
    new = [json.loads(line) for line in log.read_text().splitlines()][last:]
    assert [(e["event"], e["nodeid"]) for e in new] == [("started", lost), ("result", lost)]
    assert sorted(bench.verdicts()) == sorted(want)
    # a resume that would change the part is refused
    other = bench.run(f"--commbench-resume={run.name}", "--commbench-shard=1/3")
    assert other.ret == pytest.ExitCode.USAGE_ERROR
    other.stderr.fnmatch_lines([f"ERROR: --commbench-shard: run {run.name} is shard 2/3, not "
                                "shard 1/3*"])


# -- the report: merged shards ----------------------------------------------------------------

COMMON = {"category": "p2p", "library": "mpi", "difficulty": "easy", "setup": "bare-metal",
          "kind": "solution", "candidate": "", "platform": "cpu", "refine_rounds": 1,
          "fingerprint": {"platform": "cpu"}}


def _run(root: Path, run: str, verdicts: dict[str, str], shard: str | None = None,
         name: str | None = "sweep", model: str = "m", started: str = "") -> Path:
    """A run folder as a session leaves it, of the items given ({task[npW]: verdict})."""
    folder = root / run
    folder.mkdir(parents=True)
    started = started or f"2026-12-01T10:00:0{len(list(root.iterdir()))}+0000"
    info = {"run": run, "seed": 1, "model": model, "platform": "cpu", "started": started}
    if shard:
        info.update({"shard": shard, **({"run_name": name} if name else {})})
    (folder / "run.json").write_text(json.dumps(info))
    lines = []
    for item, verdict in verdicts.items():
        task = item.split("[")[0]
        base = {**COMMON, "model": model, "run": run, "task": f"p2p/{task}",
                "nodeid": f"suites/p2p/{task}/task.toml::{item}", "world": 2,
                "started": started}
        lines.append({**base, "event": "started"})
        lines.append({**base, "event": "result", "verdict": verdict, "seed": 1,
                      "check_only": True})
    (folder / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest_commbench.cli", *args],
                          capture_output=True, text=True, timeout=120)


def _rows(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if line.startswith("p2p/"))


def _headline(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("Pass Rate"))


WHOLE = {"a[np2]": "pass", "a[np4]": "pass", "b[np2]": "wrong_answer", "c[np2]": "pass",
         "d[np2]": "timeout"}


def test_the_report_merges_a_runs_shards_into_the_unsharded_runs_report(tmp_path):
    whole = _run(tmp_path / "whole", "w", WHOLE)
    runs = tmp_path / "runs"
    one = _run(runs, "s1", {k: WHOLE[k] for k in ("a[np2]", "a[np4]", "d[np2]")}, "1/2")
    two = _run(runs, "s2", {k: WHOLE[k] for k in ("b[np2]", "c[np2]")}, "2/2")
    unsharded = _cli("report", str(whole))
    assert unsharded.returncode == 0, unsharded.stderr
    for given in ([str(one), str(two)], [str(runs)]):  # the folders, or their runs folder
        merged = _cli("report", *given)
        assert merged.returncode == 0, merged.stderr
        assert _rows(merged.stdout) == _rows(unsharded.stdout)
        assert _headline(merged.stdout) == _headline(unsharded.stdout) == \
            "Pass Rate 50.0% (2/4)   Price unknown/task   (correctness only: nothing was timed)"
        assert "run sweep (model m): its 2 shards merged" in merged.stderr
    listed = _cli("runs", str(runs))
    assert listed.returncode == 0
    rows = [line.split() for line in listed.stdout.splitlines() if line.startswith("s")]
    assert {(r[0], r[-4], r[-3], r[-1]) for r in rows} == {("s1", "yes", "1/2", "sweep"),
                                                          ("s2", "yes", "2/2", "sweep")}


def test_a_runs_folder_takes_a_runs_shards_together_over_a_smaller_whole_run(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "s1", {"a[np2]": "pass", "b[np2]": "pass"}, "1/2")
    _run(runs, "s2", {"c[np2]": "pass"}, "2/2")
    _run(runs, "w", {"a[np2]": "pass", "b[np2]": "wrong_answer"}, started="2026-12-02T00:00:00+0000")
    done = _cli("report", str(runs))
    assert done.returncode == 0, done.stderr
    assert _headline(done.stdout).startswith("Pass Rate 100.0% (3/3)")
    assert "left out run w (m, 2026-12-02T00:00:00+0000, 2 items ran): shards 1/2, 2/2 of run " \
        "sweep of the same model ran 3 items" in done.stderr


def test_missing_shards_are_named_and_the_rest_reported_so(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "s1", {"a[np2]": "pass"}, "1/3")
    _run(runs, "s3", {"c[np2]": "wrong_answer"}, "3/3")
    done = _cli("report", str(runs))
    assert done.returncode == 0, done.stderr
    assert _headline(done.stdout) == (
        "Pass Rate 50.0% (1/2)   Price unknown/task   (correctness only: nothing was timed)   "
        "(PARTIAL: shards 1/3, 3/3 of run sweep, missing 2/3)")
    assert "commbench report: run sweep (model m): only shards 1/3, 3/3 here; missing 2/3" \
        in done.stderr


@pytest.mark.parametrize("second, why", [
    (("s1b", {"b[np2]": "pass"}, "1/2"), "shard 1/2 of run sweep (model m) is given twice ("),
    (("s2", {"a[np2]": "pass", "b[np2]": "pass"}, "2/2"),
     "shards 1/2 and 2/2 of run sweep (model m) both judged 1 item (e.g. "
     "suites/p2p/a/task.toml::a[np2])"),
    (("s2", {"b[np2]": "pass"}, "2/3"), "the shards of run sweep (model m) split the suite in "
                                        "different numbers of parts (1/2, 2/3)"),
])
def test_overlapping_shards_are_refused_in_one_line(tmp_path, second, why):
    runs = tmp_path / "runs"
    first = _run(runs, "s1", {"a[np2]": "pass"}, "1/2")
    other = _run(runs, *second)
    for given in ([str(first), str(other)], [str(runs)]):
        done = _cli("report", *given)
        assert done.returncode == 2
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"commbench report: {why}"), done.stderr
        assert done.stdout == ""


def test_shards_of_other_runs_or_models_are_not_merged(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "s1", {"a[np2]": "pass"}, "1/2")
    _run(runs, "t2", {"a[np2]": "wrong_answer"}, "2/2", name="other")  # same item, another run
    _run(runs, "n1", {"a[np2]": "pass"}, "1/2", model="n")
    parts = [shards.part(f, json.loads((f / "run.json").read_text()),
                         [json.loads(x) for x in (f / "results.jsonl").read_text().splitlines()],
                         [json.loads((f / "run.json").read_text())["model"]])
             for f in sorted(runs.iterdir())]
    merged = shards.merge(parts)
    assert merged.error is None
    assert sorted(merged.notes) == [
        "run other (model m): only shard 2/2 here; missing 1/2 (not given, not finished, or of "
        "no task): reporting what is there",
        "run sweep (model m): only shard 1/2 here; missing 2/2 (not given, not finished, or of "
        "no task): reporting what is there",
        "run sweep (model n): only shard 1/2 here; missing 2/2 (not given, not finished, or of "
        "no task): reporting what is there"]
