from __future__ import annotations

import sys
import time

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
