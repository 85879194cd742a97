"""Shared set-up for the plugin's own tests: a throw-away benchmark tree run through pytester.

The tests are layered: tests/unit (no job launched: logic, and sessions run in-process on a
fake job runner, `Bench.run_fake`), tests/e2e (real jobs, sandbox, compilers, browser),
tests/system (whole sessions: interrupted and resumed, sharded, a job array under Slurm, ranks
over simulated hosts) and tests/cheats (every cheat as a full item). This file and the helpers
beside it (oracle_kit.py, llm_servers.py, fake_runner.py) serve all four."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]


def pytest_configure(config):
    """Ctrl-C as a terminal delivers it, whoever started the tests: a shell that starts a
    command in the background without job control (`pytest ... &` in a script) hands it
    SIGINT ignored, and every process it starts inherits that, so the tests that interrupt a
    controller (test_compile_jail, test_plugin_jobs) would see it ignore them. The handler is
    Python's own; the processes the tests start get the default and install it likewise."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parent.parent
TASK = "collective/ring_allreduce"
# quick settings: the tests check the pipeline, not the numbers; correctness only unless a
# test times (Bench.timed)
INI = """[pytest]
commbench_runs_dir = runs
commbench_timing_rounds = 1
commbench_timing_max_rounds = 1
commbench_reps = 3
commbench_timing_budget = 0
commbench_warmup = 1
"""
CHECK_ONLY = "commbench_check_only = true\n"


class Bench:
    """A benchmark tree inside a pytester directory: suites/, references/, fixture solutions."""

    def __init__(self, pytester: pytest.Pytester) -> None:
        self.pytester = pytester
        self.root = pytester.path
        (self.root / "pytest.ini").write_text(INI + CHECK_ONLY)

    def timed(self, alone: bool = True) -> Bench:
        """Items are timed against the reference (the tests of the timing itself): the test
        has the CPUs to itself (see `cpu_share`) unless `alone` is False (a fake job
        runner's times are its own, whatever else the machine runs)."""
        (self.root / "pytest.ini").write_text(INI)
        if alone:
            exclusive_cpus()
        return self

    def add_task(self, relpath: str = TASK, ranks: int | None = 2, name: str | None = None,
                 sizes: list[int] | None = None) -> Path:
        dst_rel = relpath if name is None else f"{Path(relpath).parent}/{name}"
        suite = self.root / "suites" / dst_rel
        shutil.copytree(REPO / "suites" / relpath, suite)
        shutil.copytree(REPO / "references" / relpath, self.root / "references" / dst_rel)
        manifest = suite / "task.toml"
        lines = manifest.read_text().splitlines()
        if ranks is not None:
            lines = [f"ranks = [{ranks}]" if line.startswith("ranks =") else line for line in lines]
        if sizes is not None:
            lines = [f"sizes = {sizes}" if line.startswith("sizes =") else line for line in lines]
        manifest.write_text("\n".join(lines) + "\n")
        return suite

    def solution_dir(self, case: str) -> Path:
        return REPO / "fixtures" / "solutions" / case

    def run(self, *args: str) -> pytest.RunResult:
        return self.pytester.runpytest_subprocess("suites", "-p", "no:cacheprovider", *args)

    def run_fake(self, *args: str, jobs=None) -> pytest.RunResult:
        """The run in this process with a fake job runner (tests/fake_runner.py: every job
        passes, unless `jobs` says otherwise): no rank is launched, an item takes
        milliseconds. For what the session, the records and the reports make of verdicts
        and times; what real ranks do is tests/e2e's."""
        from fake_runner import FakeJobs

        return self.pytester.runpytest_inprocess("suites", "-p", "no:cacheprovider", *args,
                                                 plugins=[jobs if jobs is not None else FakeJobs()])

    def records(self) -> list[dict]:
        """Result lines of every run in this tree, in the order the runs were made (a run's
        folder is named by the second it began: two runs of one second, on the fake runner,
        are told apart by when their logs were last written)."""
        out = []
        logs = (self.root / "runs").glob("*/results.jsonl")
        for log in sorted(logs, key=lambda p: (p.parent.name[:15], p.stat().st_mtime_ns)):
            for line in log.read_text().splitlines():
                entry = json.loads(line)
                if entry["event"] == "result":
                    out.append(entry)
        return out

    def verdicts(self) -> dict[str, str]:
        return {r["nodeid"]: r["verdict"] for r in self.records()}


def _processes_with(needle: bytes) -> list[int]:
    """Pids of live processes whose command line contains `needle`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if needle in cmd:
                found.append(int(entry))
    return found


_SHARE: list[int] = []  # this test's descriptor of the CPU lock, while it runs


@pytest.fixture(autouse=True)
def cpu_share(tmp_path_factory):
    """Under pytest-xdist every test holds a shared lock on the machine's CPUs, and a test
    whose assertions rest on timing (`exclusive_cpus`) holds it alone: on a 2-CPU machine a
    timing test next to another worker's MPI jobs measures the contention, not the code."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    path = tmp_path_factory.getbasetemp().parent / "commbench-cpus.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    _SHARE.append(fd)
    try:
        yield
    finally:
        _SHARE.remove(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def exclusive_cpus() -> None:
    """The running test needs the CPUs to itself from now on (waits for the others' tests)."""
    for fd in _SHARE:
        fcntl.flock(fd, fcntl.LOCK_EX)


@pytest.fixture
def cpus_alone():
    """A function: the running test has the CPUs to itself from then on."""
    return exclusive_cpus


@pytest.fixture
def processes_with():
    """A function: pids of live processes whose command line contains a byte string."""
    return _processes_with


@pytest.fixture
def bench(pytester: pytest.Pytester) -> Bench:
    return Bench(pytester)


@pytest.fixture
def sim_hosts(tmp_path_factory):
    """Two simulated hosts (`pytest_commbench.simhosts`), the test's temporary folders shared
    between them at the same path; skipped with the reason where unprivileged namespaces
    are not available. At teardown (a failed test's too) the rig is removed, and the test
    fails where anything of it is left: a process, a namespace, its folder."""
    from pytest_commbench import simhosts

    reason = simhosts.unavailable()
    if reason:
        pytest.skip(reason)
    rig = simhosts.SimHosts(shared=(tmp_path_factory.getbasetemp(),))
    rig.start()
    try:
        yield rig
    finally:
        pidns, netns, folder = rig.pidns, dict(rig.netns), rig.dir
        rig.close()
        left = simhosts.left_behind(pidns, list(netns.values()),
                                    time.clock_gettime(time.CLOCK_BOOTTIME))
        assert not left, f"the simulated hosts left {left}"
        assert folder is not None and not folder.exists(), f"the rig's folder {folder} is left"
