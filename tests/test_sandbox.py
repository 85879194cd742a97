"""The job sandbox: what a job can see and write, and that nothing of it outlives the job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_commbench import sandbox
from pytest_commbench.launch import run_job

pytestmark = pytest.mark.skipif(sandbox.probe() is not None,
                                reason=f"no job sandbox here: {sandbox.probe()}")


def _job(tmp_path: Path) -> Path:
    job = tmp_path / "runs" / "run1" / "work" / "item" / "sol0"
    (job / "ro").mkdir(parents=True, exist_ok=True)
    return job


def _run(tmp_path: Path, code: str, hide: list[Path], deadline: float = 60):
    job = _job(tmp_path)
    script = job / "ro" / "probe.py"
    script.write_text(textwrap.dedent(code))
    argv = sandbox.wrap(job, [sys.executable, "-I", str(script)],
                        {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, hide=hide)
    return job, run_job(argv, job, deadline)


def test_hidden_trees_are_empty_and_the_filesystem_is_read_only(tmp_path):
    refs = tmp_path / "references"
    (refs / "task").mkdir(parents=True)
    (refs / "task" / "solution.py").write_text("SECRET")
    other = tmp_path / "runs" / "run1" / "work" / "other-item"
    other.mkdir(parents=True)
    (other / "out.npy").write_text("ANSWER")
    outside = tmp_path / "outside.txt"
    outside.write_text("original")
    package = Path(sandbox.__file__).parent
    job = tmp_path / "runs" / "run1" / "work" / "item" / "sol0"
    job, result = _run(tmp_path, f"""
        import os, errno
        from pathlib import Path
        seen = []
        for p in [{str(refs)!r}, {str(other)!r}, {str(package)!r}]:
            seen.append(sorted(os.listdir(p)) if os.path.isdir(p) else None)
        print("SEEN", seen)
        for target in [{str(outside)!r}, {str(package / 'runner.py')!r}, "/etc/commbench-x",
                       {str(job / 'ro' / 'probe.py')!r}]:
            try:
                open(target, "a").write("tampered")
                print("WROTE", target)
            except OSError as exc:
                print("REFUSED", target, errno.errorcode[exc.errno])
        open({str(job / 'mine.txt')!r}, "w").write("ok")
        open("/tmp/private", "w").write("x")
        print("PIDS", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
        try:
            import ctypes
            rc = ctypes.CDLL(None, use_errno=True).mount(None, b"/", None, 32 | 4096, None)
            print("REMOUNT", rc, ctypes.get_errno())
        except Exception as exc:
            print("REMOUNT failed", exc)
        """, hide=[refs, tmp_path / "runs", package])
    out = result.output
    assert result.returncode == 0, out
    seen = eval(out.split("SEEN ")[1].splitlines()[0])  # noqa: S307 - our own probe's output
    # each hidden tree is empty, or gone (one under /tmp lies in the job's own /tmp)
    assert all(entry in ([], None) for entry in seen), out
    # the package, /etc and the job's read-only part refuse; a path under /tmp lands in the
    # job's own /tmp: the host's file is untouched either way
    assert out.count("REFUSED") >= 3 and "WROTE /work" not in out and "WROTE /etc" not in out, out
    assert outside.read_text() == "original"
    assert (job / "mine.txt").read_text() == "ok"
    assert not (Path("/tmp") / "private").exists() or (Path("/tmp") / "private").read_text() != "x"
    pids = eval(out.split("PIDS ")[1].splitlines()[0])  # noqa: S307 - our own probe's output
    assert max(pids) < 100, pids  # only the job's own processes
    assert "REMOUNT -1 1" in out, out  # EPERM: no capability left


def test_a_daemon_dies_with_its_job(tmp_path):
    marker = f"commbench-daemon-{os.getpid()}-{time.time_ns()}"
    _job, result = _run(tmp_path, f"""
        import os, subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", {marker!r}],
                         start_new_session=True)
        print("started")
        """, hide=[])
    assert "started" in result.output
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert not left.strip(), f"a daemon outlived its job: {left}"


def test_the_job_dies_with_its_controller(tmp_path):
    """kill -9 of the process that started a job (pytest, an xdist worker) ends the job."""
    marker = f"commbench-orphan-{os.getpid()}-{time.time_ns()}"
    job = _job(tmp_path)
    controller = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from pytest_commbench import sandbox
        from pytest_commbench.launch import Job
        job = Path({str(job)!r})
        argv = sandbox.wrap(job, [sys.executable, "-c", "import time; time.sleep(600)",
                                  {marker!r}], {{"PATH": "/usr/bin:/bin"}}, hide=[])
        Job(argv, job, 600)
        print("running", flush=True)
        time.sleep(600)
        """)
    proc = subprocess.Popen([sys.executable, "-c", controller], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "running"
    deadline = time.time() + 20
    while time.time() < deadline and not subprocess.run(["pgrep", "-f", marker],
                                                        capture_output=True).stdout:
        time.sleep(0.1)
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout, "never started"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline and subprocess.run(["pgrep", "-f", marker],
                                                    capture_output=True).stdout:
        time.sleep(0.1)
    left = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    assert not left.strip(), f"the job outlived its controller: {left}"
