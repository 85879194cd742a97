"""A job runner that launches no rank, as a pytest plugin (`pytest_commbench_job_runner`):
an item's build, verdict, record, JUnit and summary run in-process in milliseconds.

    pytester.runpytest("suites", plugins=[FakeJobs()])            # every job passes
    FakeJobs(Verdict.WRONG_ANSWER, "c0: 3 of 8 elements differ")  # every solution job fails
    FakeJobs(times=lambda role, task, n: ...)                    # timed: seconds per call
    FakeJobs(marked_verdicts={"raise X": (Verdict.RUNTIME_ERROR, "X")})  # an answer's verdict

The item-level tests of policy (what the summary shows, what is recorded, what a verdict
fails) use it; tests of what real ranks do stay with the real runner (tests/e2e)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pytest_commbench.engine import Outcome, Plan
from pytest_commbench.engine import measure as measure_module
from pytest_commbench.observer import Timing
from pytest_commbench.timing import CONTENTION_SLACK_CPUS
from pytest_commbench.verdicts import Verdict


@dataclass
class FakeJobs:
    """Every solution job ends as `verdict` (with `message`, `detail`, `output`) unless
    `verdicts` names the item's task (its relpath) with another; reference jobs always pass.
    A passing job's calls each take `times(role, task relpath, job number of that role)`
    seconds ("ref" or "sol"; 1 ms where None). `ran` keeps (task, job folder, timed).
    The host's load while an item is timed is as `outside_cpus` says (CPUs of other load;
    with the item's ranks and the observer more than the CPUs is `contended`), never the
    machine's: a test of the policy reads the same on a busy 2-CPU machine as on a 64-CPU
    one."""

    verdict: Verdict = Verdict.PASS
    message: str = ""
    detail: str = ""
    output: str = ""
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    times: Callable[[str, str, int], float] | None = None
    ran: list[tuple[str, str, bool]] = field(default_factory=list)
    outside_cpus: float = 0.0
    cpus: int = 64
    # seconds per call of an answer whose built file holds the text (an answer's mark: a
    # model's slower reply, say), in place of `times`
    marked: dict[str, float] = field(default_factory=dict)
    # the verdict and message of an answer whose built file holds the text (a model's failing
    # reply, say), before `verdicts` and `verdict`
    marked_verdicts: dict[str, tuple[Verdict, str]] = field(default_factory=dict)

    def pytest_commbench_job_runner(self, config):
        return self

    def pytest_configure(self, config):
        self._host_load = measure_module.HostLoad
        measure_module.HostLoad = lambda: FakeLoad(self.cpus, self.outside_cpus)

    def pytest_unconfigure(self, config):
        if "_host_load" in vars(self):  # configured (a usage error stops before)
            measure_module.HostLoad = vars(self).pop("_host_load")

    def __call__(self, plan: Plan, artifact: Path, job_dir: Path, timed: bool,
                 trials: bool = True, sanitize: str | None = None) -> Outcome:
        task, name = plan.task.relpath, job_dir.name
        self.ran.append((task, name, timed))
        role = "ref" if name.startswith("ref") or name == "warmup" else "sol"
        verdict = Verdict.PASS if role == "ref" else self.verdicts.get(task, self.verdict)
        message = self.message
        text = artifact.read_text(errors="replace") if artifact.is_file() else ""
        if role == "sol":
            verdict, message = next(((v, m) for mark, (v, m) in self.marked_verdicts.items()
                                     if mark in text), (verdict, message))
        if verdict != Verdict.PASS:
            return Outcome(verdict, message or f"{verdict} (a fake job)", self.detail,
                           output=self.output or f"{role} job {name}")
        count = sum(1 for t, n, _ in self.ran if t == task and
                    ("ref" if n.startswith("ref") or n == "warmup" else "sol") == role)
        t = self.times(role, task, count) if self.times else 1e-3
        t = next((secs for mark, secs in self.marked.items() if mark in text), t)
        calls = [Timing(t * (1 + 0.001 * i)) for i in range(5)]
        return Outcome(Verdict.PASS, times={c.id: list(calls) for c in plan.cases},
                       output=self.output or f"{role} job {name}", seconds=5 * t,
                       phases_s=(0.01, 5 * t, 0.01), hosts=[None] * plan.world)


class FakeLoad:
    """`timing.HostLoad`'s stand-in: `cpus` CPUs, `outside` of them busy with other work."""

    def __init__(self, cpus: int, outside: float) -> None:
        self.cpus, self.outside = cpus, outside

    def start(self) -> None:
        pass

    def stop(self, busy_ranks: int) -> dict:
        demand = busy_ranks + 1 + self.outside
        return {"cpus": self.cpus, "ranks": busy_ranks, "outside_cpus": self.outside,
                "contended": demand > self.cpus + CONTENTION_SLACK_CPUS}
