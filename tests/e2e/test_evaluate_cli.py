"""`commbench eval FILE --task CATEGORY/TASK`: one answer file judged as an item would be (CPU
platform, a Python task), its result printed as JSON. Timings are shown, never asserted."""

from __future__ import annotations

import json
import re

import pytest

from pytest_commbench.cli import main

TASK = "collective/ring_allreduce"


def _eval(bench, capsys, answer, *args):
    code = main(["eval", str(answer), "--task", TASK, "--platform", "cpu",
                 "--suites", str(bench.root / "suites"),
                 "--references", str(bench.root / "references"), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_correct_answer_is_judged_and_timed(bench, capsys):
    """The reference itself as the answer file: it compiles, passes, and every size has both
    sides' times and a speedup."""
    bench.add_task(TASK, ranks=2, sizes=[3, 1001])
    answer = bench.root / "references" / TASK / "solution.py"
    code, out, err = _eval(bench, capsys, answer)
    result = json.loads(out)
    assert code == 0, (out, err)
    assert result["compiled"] is True and result["verdict"] == "pass"
    assert (result["task"], result["world"], result["platform"]) == (TASK, 2, "cpu")
    assert [s["count"] for s in result["sizes"]] == [3, 1001]
    for size in result["sizes"]:
        assert size["t_sol_us"] > 0 and size["t_ref_us"] > 0 and size["speedup"] > 0
    assert result["speedup"] > 0 and result["timing_trust"] in ("ok", "noisy", "contended")


def test_a_wrong_answer_given_as_its_regions_is_a_wrong_answer(bench, capsys, tmp_path):
    """A reply with only its edit region (as a model gives it), summing wrongly: it compiles
    and is rejected with the checker's evidence; the exit status is 1."""
    bench.add_task(TASK, ranks=2, sizes=[3, 1001])
    reference = (bench.root / "references" / TASK / "solution.py").read_text()
    region = re.search(r"    # >>> COMMBENCH EDIT allreduce\n.*?    # <<< COMMBENCH EDIT\n",
                       reference, re.S).group(0)
    reply = tmp_path / "reply.md"
    reply.write_text("```python\n" + region.replace("+= tmp", "-= tmp") + "```\n")
    code, out, _ = _eval(bench, capsys, reply)
    result = json.loads(out)
    assert code == 1
    assert result["compiled"] is True and result["verdict"] == "wrong_answer"
    assert result["message"] and result["speedup"] is None and result["sizes"] == []


@pytest.mark.parametrize("args, needle", [
    (["--world", "3"], "runs at world sizes 2, not 3"),
    (["--task", "collective/nothing_here"], "no task 'collective/nothing_here'"),
])
def test_a_task_or_world_it_cannot_judge_is_a_usage_error(bench, capsys, args, needle):
    bench.add_task(TASK, ranks=2)
    answer = bench.root / "references" / TASK / "solution.py"
    code, out, err = _eval(bench, capsys, answer, *args)
    assert code == 2 and needle in err and out == ""
