"""A third-party plugin, as docs/plugins.md describes one: a model, a platform and a strategy
registered through the hooks from a conftest.py, with no import of anything private."""

from __future__ import annotations

PLUGIN = '''
import dataclasses
from pathlib import Path

import pytest

from pytest_commbench.engine import ItemResult, evaluate
from pytest_commbench.models.base import Candidate, Reply
from pytest_commbench.models.conversation import AskableModel
from pytest_commbench.platforms.cpu import CpuPlatform

SEEN = []


class Shop(AskableModel):
    """Answers prompts only: the task's template first (wrong), then its reference (right),
    found by the template the prompt quotes."""

    name = "shop"
    asked = 0

    def answer(self, prompt):
        root = Path(str(self.config.rootpath))
        template = next(t for t in sorted(root.glob("suites/*/*/template.*"))
                        if t.read_text().rstrip() in prompt)
        task = template.parent.relative_to(root / "suites")
        answers = [template, root / "references" / task / f"solution{template.suffix}"]
        Shop.asked += 1
        return Reply(answers[min(Shop.asked, 2) - 1].read_text(), tokens_in=len(prompt))


class Laptop(CpuPlatform):
    """The CPU platform under another name: runs the tasks written for "cpu"."""

    name = "laptop"

    def skip_reason(self, task, world):
        if "cpu" not in task.platforms:
            return f"task runs on {', '.join(task.platforms)}, not on a CPU"
        return self.skip_reason_common(task, world)


class BestOfTwo:
    """A strategy over evaluate: two answers, the passing one kept."""

    name = label = "best-of-two"

    def run(self, task, world, candidate, platform, settings):
        results = []
        for number in (1, 2):
            conversation = candidate.conversation  # kept by the harness
            reply = conversation.ask(conversation.folder / self.label / f"a{number}",
                                     conversation.prompt())
            results.append(evaluate(task, world, Candidate("", "solution", lambda r=reply: r),
                                    platform, settings))
        assert all(isinstance(r, ItemResult) for r in results)
        SEEN.append([r.verdict for r in results])
        kept = next((r for r in results if r.passed), results[-1])
        return dataclasses.replace(
            kept, rounds=2, round_history=[{"round": i + 1, "verdict": r.verdict}
                                           for i, r in enumerate(results)])


def pytest_commbench_make_model(config, name):
    return Shop(config) if name == "shop" else None


def pytest_commbench_model_names(config):
    return ["shop"]


def pytest_commbench_make_platform(config, name):
    return Laptop() if name == "laptop" else None


def pytest_commbench_make_agent(config, name):
    return BestOfTwo() if name == "best-of-two" else None


def pytest_commbench_result(config, record):
    Path("seen.txt").write_text(str(SEEN))
'''


def test_a_model_a_platform_and_a_strategy_from_a_third_party_plugin(bench):
    bench.add_task()
    (bench.root / "conftest.py").write_text(PLUGIN)
    result = bench.run("--commbench-model=shop", "--platform=laptop",
                       "--commbench-agent=best-of-two")
    result.assert_outcomes(passed=1)
    (record,) = bench.records()
    assert record["model"] == "shop" and record["platform"] == "laptop"
    assert record["agent"] == "best-of-two" and record["verdict"] == "pass"
    first, second = (h["verdict"] for h in record["round_history"])
    assert first not in ("pass", "infra_error") and second == "pass"  # the template, then the ref
    assert (bench.root / "seen.txt").read_text() == f"[['{first}', 'pass']]"
