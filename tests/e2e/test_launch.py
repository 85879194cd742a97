from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from pytest_commbench.launch import run_job, session_pids

# a parent that starts children in process groups of their own (as mpiexec does with ranks)
# and then hangs; nothing of it may survive the deadline
TREE = """
import os, subprocess, sys, time
for _ in range(3):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                     preexec_fn=os.setpgrp)
print("children started", flush=True)
time.sleep(600)
"""


def test_deadline_kills_every_process_of_the_session(tmp_path, processes_with):
    start = time.monotonic()
    result = run_job([sys.executable, "-c", TREE], tmp_path, deadline_s=2.0)
    assert result.timed_out and result.returncode is None
    assert time.monotonic() - start < 2.0 + 10
    assert "children started" in result.output
    # the session id is the leader's pid; nothing with it is left
    assert processes_with(b"time.sleep(600)") == []


def test_a_finished_job_reports_its_exit_code_and_output(tmp_path):
    result = run_job([sys.executable, "-c", "print('hello'); raise SystemExit(3)"], tmp_path, 30)
    assert not result.timed_out and result.returncode == 3 and "hello" in result.output


def test_output_is_capped_to_its_tail(tmp_path):
    code = "import sys; sys.stdout.write('x' * 200000 + 'END')"
    result = run_job([sys.executable, "-c", code], tmp_path, 30)
    assert result.output.endswith("END") and len(result.output) < 70000
    assert "bytes cut" in result.output


def test_session_pids_sees_nothing_for_an_unused_session():
    assert session_pids(2**22 + 12345) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_a_job_never_outlives_the_pytest_that_started_it(bench, processes_with, sig):
    """pytest ended mid-item (a CI job cancelled, a scheduler's limit, kill -9): the item's
    job — launcher, ranks, sandbox — is gone within seconds, not at its deadline."""
    bench.add_task("collective/ring_allreduce", ranks=2)
    hang = bench.solution_dir("hang")
    log = bench.root / "pytest.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "suites", "-p", "no:cacheprovider",
             f"--commbench-model=dir:{hang}", "--platform=cpu", "--commbench-timeout=300"],
            cwd=bench.root, stdout=out, stderr=subprocess.STDOUT,
            # as from a terminal: the signals this test sends act (a run under nohup ignores
            # SIGHUP, and a child inherits an ignored signal)
            preexec_fn=_default_stop_signals)
    marker = str(bench.root).encode()

    def ranks() -> list[int]:  # the job's processes: sandbox, launcher and ranks
        return [p for p in processes_with(b"commbench_rank") if marker in _cmdline(p)]

    def started() -> int:  # its ranks proper (the harness's module run by the interpreter)
        return sum(_cmdline(p).split(b"\0")[1:3] == [b"-m", b"commbench_rank"]
                   for p in ranks())

    # on a loaded 2-CPU machine (the whole test suite and the builds beside it) a job's
    # start has taken minutes; the item's own timeout (300 s) is further off still
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and started() < 2 and proc.poll() is None:
        time.sleep(0.2)
    assert started() == 2, _table(ranks()) + log.read_text()[-2000:]
    time.sleep(1.0)  # the ranks are in the solution's hang now
    sent = time.monotonic()
    proc.send_signal(sig)
    proc.wait(timeout=30)
    while time.monotonic() < sent + 15 and ranks():
        time.sleep(0.1)
    gone = time.monotonic() - sent
    assert ranks() == [], f"job processes alive {gone:.1f} s after {sig.name}"
    assert proc.returncode == -sig, proc.returncode
    print(f"{sig.name}: the job was gone {gone:.2f} s after the signal")


def _default_stop_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _table(pids: list[int]) -> str:
    """What each process is doing (for a job that did not start): state, kernel wait,
    command line."""
    rows = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0].decode()
            with open(f"/proc/{pid}/wchan", "rb") as f:
                wchan = f.read().decode(errors="replace")
        except OSError:
            state, wchan = "gone", ""
        rows.append(f"{pid} {state} {wchan} {_cmdline(pid)[:160]!r}")
    return "\n".join(rows) + "\n"


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_jobs_get_the_shared_memory_transport_unless_the_user_or_a_batch_system_chose():
    from pytest_commbench.launch import SINGLE_NODE_BTL, single_node_transports

    assert single_node_transports({}) == {"OMPI_MCA_btl": SINGLE_NODE_BTL}
    assert single_node_transports({"OMPI_MCA_btl": "tcp,self"}) == {}
    assert single_node_transports({"SLURM_JOB_ID": "7"}) == {}
