"""Agent mode (--commbench-agent=geak): generate -> evaluate -> reflect -> optimize, driven
through the real SDK against the scripted loopback server (tests/llm_servers.py). One loop runs
real jobs (a real rank's error is the reflector's evidence); the rest judge the loop's policy
on the fake job runner, where the template fails as a real rank would say it does."""

from __future__ import annotations

import functools
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from fake_runner import FakeJobs

from pytest_commbench import agent
from pytest_commbench.models import prompt as prompts
from pytest_commbench.tasks import load_task
from pytest_commbench.verdicts import Verdict

REPO = Path(__file__).resolve().parents[2]
TASK = "collective/ring_allreduce"
REF = (REPO / "references" / TASK / "solution.py").read_text()
TEMPLATE = (REPO / "suites" / TASK / "template.py").read_text()
NODE = f"suites/{TASK}/task.toml::ring_allreduce[np2]"
ANALYSIS = "ANALYSIS-7f3: the template raises NotImplementedError; write the ring."

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _region(text: str) -> str:
    return re.search(r"    # >>> COMMBENCH EDIT allreduce\n.*?    # <<< COMMBENCH EDIT\n", text,
                     re.S).group(0)


def _jobs(**kw) -> FakeJobs:
    """The fake runner on which the template (its `raise NotImplementedError`) fails as its
    real rank says it does (test_fail_reflect_pass_... runs it for real)."""
    return FakeJobs(marked_verdicts={"raise NotImplementedError": (
        Verdict.RUNTIME_ERROR, "rank 0 raised NotImplementedError: write the ring all-reduce "
        "here")}, **kw)


def _slow(seconds: float) -> str:
    """The reference's region with a sleep in every call: passes, and is slower."""
    return _region(REF).replace("# >>> COMMBENCH EDIT allreduce\n",
                                "# >>> COMMBENCH EDIT allreduce\n    import time\n"
                                f"    time.sleep({seconds})\n", 1)


def _servers():
    return pytest.importorskip("llm_servers", reason="the scripted servers")


@pytest.fixture
def agentic(bench, monkeypatch, tmp_path):
    """A bench with the task, the suite's knowledge packs, and a priced scripted model."""
    pytest.importorskip("openai")
    bench.add_task(TASK, ranks=2, sizes=[1, 1001])
    shutil.copytree(REPO / "suites" / "knowledge", bench.root / "suites" / "knowledge")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    models = tmp_path / "models.toml"
    models.write_text('[models.scripted]\nprovider = "openai"\nmodel = "coder"\n'
                      'price_in = 1.0\nprice_out = 2.0\n')
    bench.model_args = ["--commbench-model=scripted", f"--commbench-models-file={models}",
                        "--commbench-agent=geak", "--commbench-request-timeout=5",
                        "-p", "no:randomly"]
    return bench


def _run(bench, script, *args, jobs=None):
    """The run against the scripted server; with `jobs` (a fake job runner), in this process."""
    with _servers().ScriptedServer("openai", script) as srv:
        run = bench.run if jobs is None else functools.partial(bench.run_fake, jobs=jobs)
        result = run(*bench.model_args, f"--commbench-base-url={srv.base_url}", *args)
        requests = list(srv.requests)
    return result, [r["body"]["messages"][-1]["content"] for r in requests]


def _last(bench, node=NODE) -> dict:
    return [r for r in bench.records() if r["nodeid"] == node][-1]


def _steps(bench, sample="s0", label="geak") -> Path:
    (root,) = (bench.root / "runs" / "replies").glob(f"*/{TASK}/{sample}/{label}")
    return root


def test_fail_reflect_pass_and_a_rerun_asks_nothing(agentic):
    """The template raises: the reflector gets the code and the evidence, its analysis goes
    into the second generation, which passes; every step is kept and priced; a rerun replays
    the steps and sends nothing."""
    script = [{"text": f"```python\n{TEMPLATE}```", "usage": {"in": 1000, "out": 500}},
              {"text": ANALYSIS, "usage": {"in": 2000, "out": 100}},
              {"text": _region(REF), "usage": {"in": 3000, "out": 500}}]
    result, sent = _run(agentic, script, "--commbench-rounds=3", "--junitxml=out.xml")
    record = _last(agentic)
    assert record["verdict"] == "pass", (record["message"], result.stdout.str()[-2000:])
    assert len(sent) == 3  # check only: a pass has nothing to optimize, the loop ends
    assert "Library notes: mpi" in sent[0] and "Sendrecv" in sent[0]  # the knowledge pack
    assert "## Reflection" in sent[1] and TEMPLATE.splitlines()[-2].strip() in sent[1]
    assert "NotImplementedError" in sent[1]  # the evidence
    assert ANALYSIS in sent[2] and "NotImplementedError" in sent[2]
    assert record["agent"] == "geak" and record["round"] == 2 and record["rounds"] == 2
    assert [h["verdict"] for h in record["round_history"]] == ["runtime_error", "pass"]
    assert record["agent_calls"] == {"generate": 2, "reflect": 1, "optimize": 0}
    assert record["cost"] == pytest.approx((1000 + 1000 + 2000 + 200 + 3000 + 1000) / 1e6)
    assert record["tokens_in"] == 6000 and record["agent_knowledge"] == ["mpi"]
    root = _steps(agentic)
    assert sorted(p.name for p in root.glob("0*")) == ["01-generate", "02-reflect",
                                                       "03-generate"]
    for step in root.glob("0*"):
        assert {"prompt.md", "reply.md", "usage.json"} <= {p.name for p in step.iterdir()}
    first = json.loads((root / "01-generate" / "verdict-np2.json").read_text())
    assert first["verdict"] == "runtime_error" and first["cost"] == pytest.approx(0.002)
    assert json.loads((root / "done.json").read_text())["iterations"] == 2
    out = result.stdout.str()
    assert "agent geak" in out and "tasks passed by agent iteration (cumulative): r1: 0, r2: 1" \
        in out
    assert 'name="commbench.round" value="2"' in (agentic.root / "out.xml").read_text()
    # a rerun: the kept steps are replayed and judged again, nothing is asked
    _, again = _run(agentic, [{"status": 500}], "--commbench-rounds=3")
    assert again == []
    rerun = _last(agentic)
    assert rerun["verdict"] == "pass" and rerun["round"] == 2
    assert [h["verdict"] for h in rerun["round_history"]] == ["runtime_error", "pass"]


def test_optimize_keeps_a_faster_version_and_discards_a_slower_one(agentic):
    """Timed: a slow pass first; the optimizer's proposal (the reference) is measurably
    faster and kept; its next proposal (slow again) is discarded; the record is the kept
    one's, and each optimize prompt carries the per-size speedups. The jobs are a fake
    runner's (a reply that sleeps takes 4 ms a call, the rest 1 ms, on a host with no
    other load): what the agent makes of timings, whatever load this machine has."""
    agentic.timed(alone=False)
    script = [{"text": _slow(0.004)}, {"text": _region(REF)}, {"text": _slow(0.004)}]
    jobs = _jobs(marked={"time.sleep(0.004)": 4e-3})
    result, sent = _run(agentic, script, "--commbench-rounds=3",
                        "--commbench-timing-rounds=2", "--commbench-timing-max-rounds=2",
                        jobs=jobs)
    record = _last(agentic)
    assert record["verdict"] == "pass", (record["message"], result.stdout.str()[-2000:])
    history = record["round_history"]
    assert [h["role"] for h in history] == ["generate", "optimize", "optimize"], record
    assert [h["verdict"] for h in history] == ["pass"] * 3
    assert history[1]["kept"] is True and "above the best" in history[1]["why"], history
    assert history[2]["kept"] is False and "not shown faster" in history[2]["why"], history
    assert record["agent_kept"] == 1 and record["agent_iteration"] == 2
    assert record["speedup"] == history[1]["speedup"] > history[0]["speedup"]
    assert len(sent) == 3 and "## Optimize" in sent[1] and "count 1001" in sent[1]
    assert f"overall speedup {history[0]['speedup']:.3f}" in sent[1]
    assert "Your last proposal was discarded" not in sent[2]  # the second was kept
    assert f"overall speedup {history[1]['speedup']:.3f}" in sent[2]


def test_the_debugging_trap_restarts_from_a_fresh_generation(agentic):
    """With --commbench-max-debug=1 a fix attempt that ends in the same error springs the
    trap: the next generation is the first prompt again (no old code, no analysis)."""
    template = {"text": f"```python\n{TEMPLATE}```"}
    script = [template, {"text": ANALYSIS}, template, {"text": _region(REF)}]
    _, sent = _run(agentic, script, "--commbench-rounds=4", "--commbench-max-debug=1",
                   jobs=_jobs())
    record = _last(agentic)
    assert record["verdict"] == "pass" and record["round"] == 3, record["round_history"]
    assert len(sent) == 4 and sent[3] == sent[0] and ANALYSIS not in sent[3]
    assert record["round_history"][1]["restart"] is True and record["agent_restarts"] == 1
    assert record["agent_calls"] == {"generate": 3, "reflect": 1, "optimize": 0}


def test_k_agent_runs_the_best_passing_one_and_pass_at_k(agentic):
    """Two independent agent runs (samples): the first never produces code, the second
    passes; each is an item, the task's result is the best passing run, pass@k reported."""
    script = [{"text": "I cannot do this."}, {"text": "no idea"}, {"text": "still nothing"},
              {"text": _region(REF)}]
    result, sent = _run(agentic, script, "--commbench-rounds=2", "--commbench-samples=2",
                        "--commbench-temperature=0.7", jobs=_jobs())
    verdicts = {r["candidate"]: r["verdict"] for r in agentic.records()}
    assert verdicts == {"s0": "no_solution", "s1": "pass"}
    assert len(sent) == 4
    out = result.stdout.str()
    assert "pass@k over the samples: pass@1 50.0%, pass@2 100.0%" in out
    assert "best of 2 agent runs per task: 1/1 tasks pass" in out, out[-3000:]
    assert _steps(agentic, "s0").is_dir() and _steps(agentic, "s1").is_dir()


def test_an_outage_mid_run_keeps_the_finished_steps_and_a_rerun_goes_on(agentic):
    script = [{"text": f"```python\n{TEMPLATE}```"},
              {"status": 500, "headers": {"retry-after-ms": "1"}}]
    result, _ = _run(agentic, script, "--commbench-rounds=3", jobs=_jobs())
    record = _last(agentic)
    assert record["verdict"] == "infra_error", record["message"]
    assert "agent step 2 (reflect)" in record["message"]
    assert "Traceback" not in result.stdout.str()
    root = _steps(agentic)
    assert (root / "01-generate" / "reply.md").is_file()
    assert (root / "01-generate" / "verdict-np2.json").is_file()
    assert not (root / "done.json").exists()
    _, sent = _run(agentic, [{"text": ANALYSIS}, {"text": _region(REF)}], "--commbench-rounds=3",
                   jobs=_jobs())
    assert len(sent) == 2 and "## Reflection" in sent[0]  # step 1 replayed, not asked
    assert _last(agentic)["verdict"] == "pass"


def test_knowledge_off_sends_the_direct_prompt(agentic):
    _, sent = _run(agentic, [{"text": _region(REF)}], "--commbench-knowledge=off",
                   jobs=_jobs())
    task = load_task(agentic.root / "suites" / TASK / "task.toml", agentic.root / "suites")
    assert "Library notes" not in sent[0]
    assert sent[0].startswith(f"# {task.title}")
    record = _last(agentic)
    assert record["agent"] == "geak-noknowledge" and record["verdict"] == "pass"
    assert _steps(agentic, label="geak-noknowledge").is_dir()


def test_a_bad_agent_name_or_switch_is_a_usage_error(bench):
    bench.add_task(TASK, ranks=2)
    result = bench.run_fake("--commbench-agent=nonsense")
    assert result.ret != 0 and "unknown agent 'nonsense'" in result.stderr.str()
    result = bench.run_fake("--commbench-agent=geak", "--commbench-knowledge=maybe")
    assert result.ret != 0 and "expected on or off" in result.stderr.str()


# -- the parts, directly -----------------------------------------------------------------------

def _task(name=TASK):
    return load_task(REPO / "suites" / name / "task.toml", REPO / "suites")


def test_knowledge_on_and_off_change_the_prompt_and_retrieval_never_shows_a_reference():
    task = _task()
    base = prompts.build(task, {"platform": "cpu"})
    off, added = agent.first_prompt(base, task, REPO / "suites", False, False)
    assert off == base.rstrip() + "\n" and added == {"knowledge": [], "retrieved": None}
    on, added = agent.first_prompt(base, task, REPO / "suites", True, False)
    assert added["knowledge"] == ["mpi"] and on.startswith(off.rstrip())
    assert (REPO / "suites" / "knowledge" / "mpi.md").read_text().strip() in on
    both, added = agent.first_prompt(base, task, REPO / "suites", True, True)
    other = added["retrieved"]
    assert other and other != TASK
    assert (REPO / "suites" / other / "template.py").read_text().rstrip() in both
    ref = (REPO / "references" / other / "solution.py").read_text()
    assert _region_any(ref) not in both
    gpu = _task("collective/nvshmem_alltoall")
    assert agent.knowledge_names(gpu) == ["nvshmem", "nvlink"]
    assert [n for n, _ in agent.knowledge(gpu, REPO / "suites")] == ["nvshmem"]


def _region_any(text: str) -> str:
    return re.search(r"# >>> COMMBENCH EDIT.*?# <<< COMMBENCH EDIT", text, re.S).group(0)


def test_the_faster_rule_reads_the_interval_and_the_band():
    best = {"verdict": "pass", "speedup": 1.0, "speedup_ci90": [0.9, 1.1], "timing_trust": "ok"}
    above = {"verdict": "pass", "speedup": 1.3, "speedup_ci90": [1.05, 1.6],
             "timing_trust": "contended"}
    assert agent.faster(above, best)[0]  # its interval lies above the best's point
    overlapping = {**above, "speedup_ci90": [0.95, 1.7]}
    assert not agent.faster(overlapping, best)[0]
    banded = {"verdict": "pass", "speedup": 1.1, "speedup_ci90": [0.97, 1.15],
              "timing_trust": "ok"}
    degraded = {"verdict": "pass", "speedup": 0.9, "speedup_ci90": [0.92, 1.5],
                "timing_trust": "ok"}
    assert agent.faster(banded, {**degraded, "speedup_ci90": [0.7, 0.93]})[0]  # the band
    assert not agent.faster({**above, "speedup_ci90": None}, best)[0]  # no interval
    assert not agent.faster({"verdict": "pass", "speedup": None}, best)[0]  # check only
    assert not agent.faster({"verdict": "wrong_answer", "message": "x"}, best)[0]


def test_the_best_of_k_runs_is_the_fastest_passing_one():
    from pytest_commbench.scoring import best_of_samples

    recs = [{"model": "m", "task": "t", "candidate": f"s{k}", "verdict": v, "speedup": s,
             "kind": "solution", "nodeid": f"n{k}"}
            for k, (v, s) in enumerate([("pass", 0.8), ("wrong_answer", None), ("pass", 1.1)])]
    (best,) = best_of_samples(recs)
    assert best["candidate"] == "s2" and best["speedup"] == 1.1


def test_the_leaderboard_keeps_agent_and_direct_apart_and_compares_them():
    from pytest_commbench import leaderboard
    from pytest_commbench.report import agent_lines

    def rec(task, verdict, speedup, agent_=None, **extra):
        return {"model": "m", "task": task, "nodeid": f"{task}::x[np2]", "candidate": "",
                "kind": "solution", "verdict": verdict, "speedup": speedup, "world": 2,
                "refine_rounds": 3 if agent_ else 1, "category": "p2p", "library": "mpi",
                "difficulty": "easy", "setup": "bare-metal", "fingerprint": {"platform": "cpu"},
                "run": "a" if agent_ else "d", "cost": 0.01, **extra,
                **({"agent": agent_} if agent_ else {})}

    history = [{"round": 1, "role": "generate", "verdict": "wrong_answer", "speedup": None},
               {"round": 2, "role": "generate", "verdict": "pass", "speedup": 1.0,
                "kept": True},
               {"round": 3, "role": "optimize", "verdict": "pass", "speedup": 0.5,
                "kept": False}]
    agent_runs = [rec("t1", "pass", 1.0, "geak", round_history=history, round=2,
                      agent_calls={"generate": 2, "reflect": 1, "optimize": 1},
                      agent_first={"verdict": "wrong_answer", "speedup": None}),
                  rec("t2", "pass", 2.0, "geak", round_history=history[1:2], round=1,
                      agent_calls={"generate": 1}, agent_first={"verdict": "pass",
                                                                "speedup": 2.0})]
    direct = [rec("t1", "wrong_answer", None), rec("t2", "pass", 2.0)]
    board = leaderboard.build(direct + agent_runs)
    labels = {e.label for e in board.entries}
    assert labels == {"m (1 round)", "m (agent geak, 3 rounds)"}
    rows = leaderboard.agent_vs_direct(board)
    assert [r["mode"] for r in rows] == ["direct", "agent geak"]
    assert rows[1]["passes"] == 2 and rows[0]["passes"] == 1 and rows[1]["calls"] == 2.5
    assert rows[1]["pass_x_gm_gain"] == pytest.approx(board.entries[0].scores.pass_x_gm
                                                      - rows[0]["pass_x_gm"])
    assert any(t.title.startswith("Table 5") for t in leaderboard.tables(board))
    lines = agent_lines(agent_runs)
    assert "model calls generate 3, reflect 1, optimize 1" in lines[0]
    assert "i2 generate pass 1.00; i3 optimize pass 0.50 discarded" in lines[1]
    assert "Pass Rate 50.0% -> 100.0%" in lines[-1]
    # records of no agent: no Table 5, no agent lines
    plain = leaderboard.build(direct)
    assert not leaderboard.agent_vs_direct(plain) and agent_lines(direct) == []


def test_export_carries_the_answer_an_agent_run_stands_by(tmp_path):
    """`commbench export --agent LABEL`: per task, the last step the run kept as its best
    answer (a later proposal that was not kept is not it), else the run's last step."""
    from pytest_commbench.cli import main

    replies = tmp_path / "replies" / "m"

    def step(task: str, name: str, kept: bool | None) -> None:
        d = replies / task / "s0" / "geak" / name
        d.mkdir(parents=True)
        (d / "reply.md").write_text(f"{task} {name}\n")
        if kept is not None:
            (d / "verdict-np2.json").write_text(json.dumps({"verdict": "pass", "kept": kept}))

    step("p2p/pingpong", "01-generate", True)
    step("p2p/pingpong", "02-optimize", True)
    step("p2p/pingpong", "03-optimize", False)
    step("collective/ring_allreduce", "01-generate", False)
    step("collective/ring_allreduce", "02-reflect", None)
    out = tmp_path / "dir"
    assert main(["export", str(replies), str(out), "--agent", "geak"]) == 0
    assert (out / "p2p/pingpong/reply.md").read_text() == "p2p/pingpong 02-optimize\n"
    assert (out / "collective/ring_allreduce/reply.md").read_text() == \
        "collective/ring_allreduce 02-reflect\n"
    # without --agent: the direct rounds, which this folder has none of
    assert main(["export", str(replies), str(tmp_path / "none")]) == 1


@pytest.mark.parametrize("trust, interval, speedup, role", [
    ("contended", [0.06, 9.6], 0.88, None),  # a number the harness could not read
    ("shared", [0.50, 0.55], 0.52, None),
    ("ok", None, 0.5, None),  # one timing round: no interval, inconclusive
    ("ok", [0.40, 0.55], 0.47, "optimize"),  # readable: a faster proposal can be shown
    ("ok", [1.30, 1.40], 1.35, "optimize"),  # readable and faster already: still optimized
])
def test_the_optimizer_is_asked_only_where_the_best_timing_can_be_read(trust, interval,
                                                                       speedup, role):
    """The rule refinement follows: a proposal is kept only where its timing shows it faster,
    so where the best's own timing cannot be read no optimize step is paid for."""
    from types import SimpleNamespace

    from pytest_commbench.agent import GeakAgent, Run
    from pytest_commbench.engine import ItemResult

    run = Run(first="")
    run.best = ItemResult("pass", speedup=speedup, speedup_ci90=interval, timing_trust=trust)
    agent = GeakAgent(Path("suites"))
    assert agent._decide(run, SimpleNamespace(check_only=False)) == role
