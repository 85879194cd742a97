"""`commbench report --html`: the static site of the fixture logs (fixtures/leaderboard), read
back as a DOM: by Python's HTML parser everywhere, and by headless Chromium where it is
installed (CI installs Debian's `chromium`), which also runs the pages' script."""

from __future__ import annotations

import collections
import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pytest_commbench.cli import main

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "leaderboard"
H200 = sorted((FIXTURES / "h200").glob("*.jsonl"))
TASK = "collective/cupy_nccl_allgather"
REPLY = """Here is the all-gather.

```python
import cupy as cp

def allgather(comm, send, recv):  # a < b && "quoted"
    comm.allGather(send.data.ptr, recv.data.ptr, send.size, 7, cp.cuda.Stream.null.ptr)
```

A note after the code: </pre><script>alert(1)</script>
"""


class Dom(HTMLParser):
    """The page as a tree of elements (tag, attributes, text, children), each with the ids of
    its ancestors: enough to find tables, rows, cells and links."""

    VOID = ("meta", "br", "img", "input", "line", "rect", "hr", "link")

    def __init__(self, text: str) -> None:
        super().__init__()
        self.stack: list[dict] = []
        self.elements: list[dict] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        el = {"tag": tag, "attrs": attrs, "text": "", "children": [],
              "ids": [a["attrs"].get("id") for a in self.stack if a["attrs"].get("id")]
              + [attrs.get("id")]}
        if self.stack:
            self.stack[-1]["children"].append(el)
        self.elements.append(el)
        if tag not in self.VOID:
            self.stack.append(el)

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()["tag"] == tag:
                break

    def handle_data(self, data):
        for el in self.stack:
            el["text"] += data

    def find(self, tag: str, within: str | None = None) -> list[dict]:
        return [e for e in self.elements if e["tag"] == tag and (within is None or within in e["ids"])]

    def body_rows(self, table: str) -> list[list[str]]:
        """The text of each cell of each row of a table's body."""
        bodies = [e for e in self.find("tbody", table)]
        return [[c["text"].strip() for c in row["children"] if c["tag"] in ("td", "th")]
                for body in bodies for row in body["children"] if row["tag"] == "tr"]

    def head(self, table: str) -> list[str]:
        return [th["text"].strip() for th in self.find("th", table)
                if any(t["tag"] == "thead" and th in self._all(t) for t in self.find("thead", table))]

    def _all(self, el: dict) -> list[dict]:
        out = []
        for c in el["children"]:
            out += [c, *self._all(c)]
        return out


def _counted_by_hand() -> dict[str, collections.Counter]:
    """Per model (label as the leaderboard gives it), the verdicts of its last record per item
    and sample, straight from the JSON lines; an item that started and never ended: aborted."""
    labels = {"dune.jsonl": "dune (1 round)", "dune-budget.jsonl": "dune (4 rounds, $0.30/task budget)"}
    out = {}
    for path in H200:
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        last = {}
        for e in lines:
            key = (e["nodeid"], e.get("candidate", ""))
            if e["event"] == "started":
                last.setdefault(key, "aborted")
            elif e["event"] == "result":
                last[key] = e["verdict"]
        out[labels.get(path.name, path.stem)] = collections.Counter(last.values())
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("html")
    replies = root / "replies"
    folder = replies / "atlas" / TASK / "s0"
    # atlas answered once (rounds 1): its kept replies also hold a round 2 of another run
    (folder / "r1").mkdir(parents=True)
    (folder / "r1" / "reply.md").write_text(REPLY)
    (folder / "r2").mkdir()
    (folder / "r2" / "reply.md").write_text("a later round of another run\n")
    out = root / "site"
    assert main(["report", *map(str, H200), "--models-file", str(FIXTURES / "models.toml"),
                 "--html", str(out), "--replies", str(replies)]) == 0
    return out


def _page(path: Path) -> Dom:
    return Dom(path.read_text())


def test_the_leaderboard_rows_are_the_models_in_rank_order(site):
    dom = _page(site / "index.html")
    rows = dom.body_rows("leaderboard")
    assert [r[2] for r in rows] == ["reference", "cedar", "dune (4 rounds, $0.30/task budget)",
                                    "atlas", "birch", "dune (1 round)"]
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4, 5, 6]
    # every interval is shown with its value: "66.7% [41.7%, 91.7%]"
    assert all("[" in r[5] for r in rows[1:])
    # fast_p at KernelBench's thresholds, after the price: the reference passes all at 1.0+
    assert dom.head("leaderboard")[-3:] == ["fast_0", "fast_1", "fast_1.5"]
    assert rows[0][-3] == "100.0%"
    # every model's name links to its page, and the page exists
    links = [a["attrs"]["href"] for a in dom.find("a", "leaderboard")]
    assert len(links) == 6 and all((site / h).is_file() for h in links)


def test_the_failure_anatomy_is_the_logs_counted_by_hand(site):
    dom = _page(site / "index.html")
    heads = dom.head("anatomy")[1:]
    hand = _counted_by_hand()
    rows = dom.body_rows("anatomy")
    assert len(rows) == len(hand)
    for label, *counts in rows:
        counts = [int(c) for c in counts]
        assert dict(zip(heads, counts)) == {h: hand[label][h] for h in heads}, label
        assert sum(counts) == sum(hand[label].values()), f"{label}: an outcome not shown"


def test_the_matrix_links_each_item_to_its_task_page_with_every_models_evidence(site):
    dom = _page(site / "index.html")
    links = {a["text"]: a["attrs"]["href"] for a in dom.find("a", "matrix")
             if a["attrs"]["href"].startswith("tasks/")}
    assert f"{TASK} np2" in links
    task = _page(site / links[f"{TASK} np2"])
    items = [d for d in task.find("div") if "item" in d["attrs"].get("class", "")]
    assert {d["text"].split(",")[0].strip() for d in items} >= {"atlas", "cedar", "reference"}
    atlas = next(d for d in items if d["text"].strip().startswith("atlas"))
    assert "verdict pass" in atlas["text"] and "speedup" in atlas["text"]


def test_the_reply_judged_is_highlighted_and_escaped(site):
    text = (site / "tasks" / "collective_cupy_nccl_allgather.html").read_text()
    dom = Dom(text)
    highlighted = [d for d in dom.find("div") if d["attrs"].get("class") == "highlight"]
    assert highlighted and "comm.allGather" in highlighted[0]["text"]
    # the reply of the round that was scored, not a later one the replies folder holds
    assert "a later round of another run" not in text and "reply (r1, the answer judged)" in text
    # nothing of the reply becomes markup: its </pre><script> is text
    assert [s for s in dom.find("script")] == dom.find("script")[-1:]  # the page's own only
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def _refined_task_page(tmp_path) -> str:
    """The task page of a three-round refinement (a pass at 0.9, a slower pass, a wrong
    answer; round 1 scored) beside an item of no price."""
    from pytest_commbench import htmlreport, leaderboard

    base = {"event": "result", "kind": "solution", "category": "p2p", "library": "mpi",
            "difficulty": "easy", "setup": "bare-metal", "world": 2, "task": "p2p/pingpong",
            "candidate": "", "run": "r1", "seed": 5}
    refined = {**base, "model": "kimi", "nodeid": "k", "verdict": "pass", "speedup": 0.9,
               "rounds": 3, "round": 1, "refine_rounds": 3, "tokens_in": 12345,
               "tokens_out": 678, "cost": 0.0123, "price_source": {"source": "models file"},
               "finished": "2026-12-01T10:00:00+0000",
               "requests": [{"endpoint": "http://127.0.0.1:8000/v1", "model": "kimi-k2"}],
               "round_history": [
                   {"round": 1, "verdict": "pass", "speedup": 0.9, "message": ""},
                   {"round": 2, "verdict": "pass", "speedup": 0.85, "message": ""},
                   {"round": 3, "verdict": "wrong_answer", "speedup": None,
                    "message": "element 3 differs"}]}
    unpriced = {**base, "model": "local", "nodeid": "l", "verdict": "wrong_answer",
                "cost": 0.0, "tokens_in": 10, "tokens_out": 5}
    replies = tmp_path / "replies"
    for n, text in ((1, "FIRST ROUND"), (2, "SECOND ROUND"), (3, "THIRD ROUND")):
        (replies / "kimi" / "p2p/pingpong" / "s0" / f"r{n}").mkdir(parents=True)
        (replies / "kimi" / "p2p/pingpong" / "s0" / f"r{n}" / "reply.md").write_text(text)
    board = leaderboard.build([refined, unpriced])
    return htmlreport.task_page("p2p/pingpong", board, lambda r: replies)


def _assert_the_rounds_and_what_was_asked(dom) -> None:
    (table,) = [t for t in dom.find("table") if t["attrs"].get("class") == "rounds"]
    rows = [[c["text"].strip() for c in tr["children"]] for body in table["children"]
            if body["tag"] == "tbody" for tr in body["children"]]
    assert rows == [["1", "pass", "0.900", ""], ["2", "pass", "0.850", ""],
                    ["3", "wrong_answer", "-", "element 3 differs"]]
    asked = [p["text"].strip() for p in dom.find("p") if p["attrs"].get("class") == "asked"]
    assert asked[0] == ("tokens 12,345 in / 678 out \u00b7 cost $0.0123 \u00b7 finished "
                        "2026-12-01T10:00:00+0000 \u00b7 endpoint http://127.0.0.1:8000/v1 "
                        "(model id kimi-k2)")
    assert asked[1] == "tokens 10 in / 5 out \u00b7 cost unknown"


def test_a_task_page_shows_the_scored_rounds_reply_its_history_tokens_cost_and_endpoint(
        tmp_path):
    """Three rounds: a pass at 0.9, a slower pass, a wrong answer. Refinement scored round 1
    (its fastest pass): the page shows round 1's reply, every round's verdict and speedup,
    the tokens and cost, when it ended and the endpoint the requests went to; a record of no
    price says its cost is unknown."""
    html = _refined_task_page(tmp_path)
    assert "FIRST ROUND" in html and "SECOND ROUND" not in html and "THIRD ROUND" not in html
    _assert_the_rounds_and_what_was_asked(Dom(html))


def test_a_page_per_model_lists_every_item_it_was_judged_on(site):
    dom = _page(site / "models" / "birch.html")
    rows = dom.body_rows("items")
    assert len(rows) == 144  # 16 tasks x 3 world sizes x 3 samples


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _dump(url: str) -> str:
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (CI installs Debian's chromium)")
def test_chromium_renders_the_leaderboard_and_a_click_through_to_a_reply(site):
    dom = Dom(_dump((site / "index.html").as_uri()))
    rows = dom.body_rows("leaderboard")
    assert len(rows) == 6 and rows[0][2] == "reference"
    assert dom.find("svg", "pass-x-gm"), "the figure is not in the page"
    href = next(a["attrs"]["href"] for a in dom.find("a", "matrix") if a["text"] == f"{TASK} np2")
    task = Dom(_dump((site / href).as_uri()))
    code = [d for d in task.find("div") if d["attrs"].get("class") == "highlight"]
    assert code and "comm.allGather" in code[0]["text"]
    # the reply's script is text on the page, never run: Chromium's DOM has no script of it
    assert all("alert" not in s["text"] for s in task.find("script"))


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (CI installs Debian's chromium)")
def test_chromium_renders_a_task_pages_round_history_and_what_was_asked(tmp_path):
    page = tmp_path / "task.html"
    page.write_text(_refined_task_page(tmp_path))
    rendered = _dump(page.as_uri())
    _assert_the_rounds_and_what_was_asked(Dom(rendered))
    assert "FIRST ROUND" in rendered and "SECOND ROUND" not in rendered  # the scored reply


# -- two runs compared ----------------------------------------------------------------------------

def _edited_copy(src: Path, a: Path, dst: Path) -> dict:
    """Run A: a fixture log, every pass given a 90% interval of +-5%; run B: run A's log with
    known edits. Returns what was done."""
    lines = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    for e in lines:
        if e["event"] == "result" and e["verdict"] == "pass":
            e["speedup_ci90"] = [e["speedup"] * 0.95, e["speedup"] * 1.05]
    a.write_text("".join(json.dumps(e) + "\n" for e in lines))
    results = [e for e in lines if e["event"] == "result" and e["verdict"] != "skipped"]
    passing = [e for e in results if e["verdict"] == "pass" and e.get("speedup_ci90")]
    failing = [e for e in results if e["verdict"] != "pass"]
    made = {"verdicts": {}, "moved": [], "removed": [], "new": []}
    flip_to_fail, flip_to_pass, faster, gone = passing[0], failing[0], passing[1], passing[2]
    made["verdicts"][flip_to_fail["nodeid"]] = ("pass", "wrong_answer")
    made["verdicts"][flip_to_pass["nodeid"]] = (flip_to_pass["verdict"], "pass")
    made["moved"].append(faster["nodeid"])
    made["removed"].append(gone["nodeid"])
    out = []
    for e in lines:
        e = dict(e)
        if e["nodeid"] == gone["nodeid"]:
            continue
        if e["event"] == "result" and e["nodeid"] == flip_to_fail["nodeid"]:
            e.update(verdict="wrong_answer", speedup=None, message="element 3 differs")
        elif e["event"] == "result" and e["nodeid"] == flip_to_pass["nodeid"]:
            e.update(verdict="pass", speedup=1.0, speedup_ci90=[0.9, 1.1], message="")
        elif e["event"] == "result" and e["nodeid"] == faster["nodeid"]:
            hi = e["speedup_ci90"][1]
            e.update(speedup=hi * 2, speedup_ci90=[hi * 1.5, hi * 2.5])
        out.append(e)
    extra = dict(results[0], nodeid="suites/p2p/new_task/task.toml::new_task[np2]",
                 task="p2p/new_task")
    made["new"].append(extra["nodeid"])
    out.append(extra)
    dst.write_text("".join(json.dumps(e) + "\n" for e in out))
    return made


def test_a_comparison_lists_exactly_the_changes_made_between_two_runs(tmp_path, capsys):
    a, b = tmp_path / "atlas-a.jsonl", tmp_path / "atlas-b.jsonl"
    made = _edited_copy(FIXTURES / "h200" / "atlas.jsonl", a, b)
    # a pass became a wrong answer: the comparison fails, naming it
    assert main(["report", str(a), str(b), "--compare", "--label", "before", "--label",
                 "after", "--out", str(tmp_path / "out")]) == 1
    text = (tmp_path / "out" / "compare.md").read_text()
    printed = capsys.readouterr()
    assert printed.out.startswith(text.rstrip("\n"))
    (flipped,) = [k for k, (x, _) in made["verdicts"].items() if x == "pass"]
    assert printed.err.splitlines() == [f"commbench report --compare: worse: {flipped}: pass "
                                        "in before, wrong_answer in after"]
    from pytest_commbench.results import load
    from pytest_commbench.scoring import compare

    got = compare(load(a), load(b))
    assert {item: (x, y) for item, x, y in got.verdicts} == made["verdicts"]
    assert [m[0] for m in got.moved] == made["moved"] and got.moved[0][5] == "faster"
    assert got.removed == made["removed"] and got.new == made["new"]
    for item in [*made["verdicts"], *made["moved"], *made["removed"], *made["new"]]:
        assert item in text
    assert "2 verdict changes, 1 speedups moved" in text


def _pair(tmp_path: Path, b_of: dict) -> tuple[Path, Path]:
    """Run A: three passing items with known speedups and intervals; run B: A with each
    item's (speedup, interval) replaced as `b_of` says."""
    base = {"event": "result", "model": "m", "kind": "solution", "category": "p2p",
            "library": "mpi", "difficulty": "easy", "setup": "bare-metal", "world": 2,
            "verdict": "pass", "run": "r"}
    a_of = {"fell10": (1.0, [0.99, 1.01]), "fell3": (1.0, [0.995, 1.005]),
            "fell20wide": (1.0, [0.7, 1.3])}
    paths = []
    for name, table in (("a", a_of), ("b", {**a_of, **b_of})):
        lines = [{**base, "nodeid": f"t/{n}::x[np2]", "task": f"t/{n}", "speedup": s,
                  "speedup_ci90": iv} for n, (s, iv) in table.items()]
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        paths.append(path)
    return paths[0], paths[1]


def test_fail_on_slower_fails_only_where_a_speedup_fell_past_the_threshold_and_its_intervals(
        tmp_path):
    """--fail-on slower:5%: of three speedups that fell (10% beyond the intervals, 3% beyond
    them, 20% inside wide ones) only the first fails the comparison; without --fail-on, and
    with no verdict made worse, it exits 0. Run as a user runs it, in a process of its own."""
    import sys

    a, b = _pair(tmp_path, {"fell10": (0.9, [0.89, 0.91]), "fell3": (0.97, [0.965, 0.975]),
                            "fell20wide": (0.8, [0.6, 1.0])})
    cli = [sys.executable, "-m", "pytest_commbench.cli", "report", str(a), str(b), "--compare"]
    plain = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    assert "2 speedups moved" in plain.stdout  # fell10 and fell3 moved; fell20wide did not
    failing = subprocess.run([*cli, "--fail-on", "slower:5%"], capture_output=True,
                             text=True, timeout=120)
    assert failing.returncode == 1
    (line,) = failing.stderr.splitlines()
    assert line.startswith("commbench report --compare: slower by 10.0% (more than 5%") \
        and "t/fell10::x[np2]" in line
    loose = subprocess.run([*cli, "--fail-on", "slower:15%"], capture_output=True, text=True,
                           timeout=120)
    assert loose.returncode == 0, loose.stderr
    for bad in ("faster:5%", "slower:5", "slower:x%", "slower:100%"):
        refused = subprocess.run([*cli, "--fail-on", bad], capture_output=True, text=True,
                                 timeout=120)
        assert refused.returncode == 2, bad
        assert refused.stderr.startswith(f"commbench report: --fail-on {bad}: "), bad


def test_fail_on_is_refused_without_compare(capsys):
    assert main(["report", str(H200[0]), "--fail-on", "slower:5%"]) == 2
    assert "--fail-on goes with --compare" in capsys.readouterr().err


def test_compare_takes_two_runs(tmp_path, capsys):
    a = str(FIXTURES / "h200" / "atlas.jsonl")
    assert main(["report", a, "--compare"]) == 2
    assert "two runs" in capsys.readouterr().err


def test_two_labelled_runs_of_one_model_stay_apart(tmp_path, capsys):
    a = FIXTURES / "h200" / "atlas.jsonl"
    b = tmp_path / "atlas-b.jsonl"
    _edited_copy(a, tmp_path / "atlas-a.jsonl", b)
    out = tmp_path / "site"
    assert main(["report", str(tmp_path / "atlas-a.jsonl"), str(b), "--label", "v1",
                 "--label", "v2", "--html", str(out)]) == 0
    rows = _page(out / "index.html").body_rows("leaderboard")
    assert sorted(r[2] for r in rows) == ["atlas [v1]", "atlas [v2]"]
    # each entry's page is its own run's: only B's has the failure B was given
    v1, v2 = ((out / "models" / f"atlas_{v}.html").read_text() for v in ("v1", "v2"))
    assert "element 3 differs" in v2 and "element 3 differs" not in v1
    assert "p2p/new_task" in v2 and "p2p/new_task" not in v1
    assert main(["report", str(a), str(b), "--label", "only-one"]) == 2
    assert "one --label per run" in capsys.readouterr().err


def test_table_1_counts_the_suite_not_the_logs(tmp_path):
    """--suites: Table 1 is the suite's tasks for the runs' platform (counted here from the
    manifests by hand), with how many of them the logs cover."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    manifests = [tomllib.loads(p.read_text()) for p in sorted((REPO / "suites").glob("*/*/task.toml"))]
    h200 = [m for m in manifests if "h200" in m["platforms"]]
    logged = {json.loads(x)["task"] for p in H200 for x in p.read_text().splitlines() if x.strip()}
    out = tmp_path / "out"
    assert main(["report", *map(str, H200), "--models-file", str(FIXTURES / "models.toml"),
                 "--suites", str(REPO / "suites"), "--out", str(out)]) == 0
    data = json.loads((out / "leaderboard.json").read_text())["composition"]["category"]
    total = data[-1]
    assert total["category"] == "total" and total["tasks"] == len(h200) > len(logged)
    assert total["run"] == len(logged)
    by_hand = collections.Counter(m["category"] for m in h200)
    assert {r["category"]: r["tasks"] for r in data[:-1]} == dict(by_hand)
