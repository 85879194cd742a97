"""The job sandbox: what a job can see and write, and that nothing of it outlives the job."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from pytest_commbench import sandbox, sandbox_init
from pytest_commbench.launch import find_mpiexec, mpi_env, run_job

pytestmark = pytest.mark.skipif(sandbox.probe() is not None,
                                reason=f"no job sandbox here: {sandbox.probe()}")


def _job(tmp_path: Path) -> Path:
    job = tmp_path / "runs" / "run1" / "work" / "item" / "sol0"
    (job / "ro").mkdir(parents=True, exist_ok=True)
    return job


def _run(tmp_path: Path, code: str, hide: list[Path], deadline: float = 60,
         keep: list[Path] | None = None, job: Path | None = None):
    job = job or _job(tmp_path)
    (job / "ro").mkdir(parents=True, exist_ok=True)
    script = job / "ro" / "probe.py"
    script.write_text(textwrap.dedent(code))
    argv = sandbox.wrap(job, [sys.executable, "-I", str(script)],
                        {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, hide=hide, keep=keep)
    return job, run_job(argv, job, deadline)


def _said(out: str, key: str):
    """A value the probe printed as `KEY repr(value)`."""
    return eval(out.split(f"{key} ", 1)[1].splitlines()[0])  # noqa: S307 - our probe's output


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
        for target in [{str(outside)!r}, {str(package / 'engine' / 'flow.py')!r}, "/etc/commbench-x",
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

    def left() -> str:
        """The job's processes (the controller's command line names the marker too)."""
        out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
        return "\n".join(x for x in out.splitlines() if x.split()[0] != str(proc.pid))

    assert proc.stdout.readline().strip() == "running"
    deadline = time.time() + 20
    while time.time() < deadline and "time.sleep(600)" not in left():
        time.sleep(0.1)
    assert "time.sleep(600)" in left(), "never started"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline and left():
        time.sleep(0.1)
    assert not left().strip(), f"the job outlived its controller: {left()}"


@pytest.fixture
def home_secret():
    """A file in $HOME, outside every tree a job may see (removed afterwards)."""
    home = Path.home()
    try:
        folder = Path(tempfile.mkdtemp(prefix=".commbench-sandbox-test-", dir=home))
    except OSError:
        pytest.skip(f"$HOME ({home}) is not writable")
    (folder / "secret").write_text("SECRET")
    yield folder / "secret"
    shutil.rmtree(folder, ignore_errors=True)


def test_a_job_sees_only_the_allow_list(tmp_path, home_secret):
    outside = tmp_path / "outside"  # outside the job and outside keep
    outside.mkdir()
    (outside / "secret").write_text("SECRET")
    kept = tmp_path / "kept"
    (kept / "hidden").mkdir(parents=True)
    (kept / "data.txt").write_text("KEPT")
    (kept / "hidden" / "answer").write_text("ANSWER")
    (tmp_path / "kept-link").symlink_to("kept")
    job = _job(tmp_path)
    keep = [*sandbox.system_keep(), tmp_path / "kept-link"]
    mark = f"commbench-{os.getpid()}-{time.time_ns()}"
    job, result = _run(tmp_path, f"""
        import errno, os, stat
        print("ROOT", sorted(os.listdir("/")))
        print("CWD", repr(os.getcwd()))
        seen = {{p: os.path.exists(p) for p in [{str(outside / 'secret')!r},
                                                {str(home_secret)!r}, "/srv", "/mnt", "/boot",
                                                "/home", "/var/lib", "/var/cache"]}}
        print("SEEN", seen)
        print("HOME", sorted(os.listdir({str(home_secret.parent.parent)!r})))
        print("VAR", sorted(os.listdir("/var")))
        print("RUN", os.listdir("/run"))
        print("LINK", os.path.islink({str(tmp_path / 'kept-link')!r}),
              open({str(tmp_path / 'kept-link' / 'data.txt')!r}).read(),
              os.listdir({str(kept / 'hidden')!r}))
        for target in [{str(kept / 'data.txt')!r}, {str(kept / 'new')!r}, "/usr/commbench-x",
                       "/etc/commbench-x", "/commbench-x", "/dev/commbench-x",
                       {str(sys.prefix) + '/commbench-x'!r}, {str(job / 'ro' / 'x')!r}]:
            try:
                open(target, "a").write("tampered")
                print("WROTE", target)
            except OSError as exc:
                print("REFUSED", target, errno.errorcode[exc.errno])
        for target in [{str(job / 'mine.txt')!r}, "/tmp/{mark}", "/var/tmp/{mark}",
                       "/dev/shm/{mark}", "/run/{mark}"]:
            open(target, "w").write("ok")
        blocks = [os.path.join(d, f) for d, _, fs in os.walk("/dev") for f in fs
                  if stat.S_ISBLK(os.lstat(os.path.join(d, f)).st_mode)]
        print("BLOCKS", blocks)
        """, hide=[kept / "hidden"], keep=keep, job=job)
    out = result.output
    assert result.returncode == 0, out
    allowed = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "sys",
               "proc", "tmp", "var", "run"}
    allowed |= {Path(p).parts[1] for p in [*sandbox.python_roots(), *keep, str(job)]}
    assert set(_said(out, "ROOT")) <= allowed, out
    assert _said(out, "CWD") == str(job.resolve())
    assert not any(_said(out, "SEEN").values()), out
    # $HOME shows at most the trees a kept path goes through (e.g. a pyenv interpreter)
    on_the_way = {Path(p).relative_to(home_secret.parent.parent).parts[0]
                  for p in [*sandbox.python_roots(), *keep]
                  if Path(p).is_relative_to(home_secret.parent.parent)}
    assert set(_said(out, "HOME")) <= on_the_way, out
    assert set(_said(out, "VAR")) <= {"tmp", "run"}, out
    assert _said(out, "RUN") == [], out
    assert "LINK True KEPT []" in out, out  # a kept link is a link, hide subtracts inside it
    assert "WROTE" not in out, out
    assert out.count("REFUSED") == 8, out
    assert (kept / "data.txt").read_text() == "KEPT" and not (kept / "new").exists()
    assert (job / "mine.txt").read_text() == "ok"
    for scratch in ("/tmp", "/var/tmp", "/dev/shm", "/run"):
        assert not (Path(scratch) / mark).exists(), scratch  # the job's own, gone with it
    assert _said(out, "BLOCKS") == [], out  # no disk to read raw


def test_the_venvs_python_and_mpiexec_run_inside(tmp_path):
    """A 2-rank MPI job of the environment's mpiexec and Python, with the project hidden."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec")
    job = _job(tmp_path)
    # each rank's line in one write: the launcher forwards output as it is written, so a
    # line printed in pieces (print's arguments, unbuffered) may interleave with another's
    code = ("import sys; from mpi4py import MPI; import numpy as np; c = MPI.COMM_WORLD; "
            "y = np.empty(4); c.Allreduce(np.full(4, c.rank + 1.0), y); "
            "sys.stdout.write(f'RANK {c.rank} {c.size} {y.sum()} {sys.prefix}\\n'); "
            "sys.stdout.flush()")
    argv = [mpiexec, "-n", "2", "--oversubscribe", sys.executable, "-c", code]
    env = {**mpi_env(), "TMPDIR": "/tmp"}
    project = Path(sandbox.__file__).resolve().parent.parent
    result = run_job(sandbox.wrap(job, argv, env, hide=[project]), job, 120, env=env)
    assert result.returncode == 0, result.output
    for rank in (0, 1):
        assert f"RANK {rank} 2 12.0 {sys.prefix}" in result.output, result.output


def test_a_non_ascii_project_stays_read_only(tmp_path):
    """mountinfo writes a space as \\040 and UTF-8 as it is: every mount but the job's own
    and its scratch is read-only, wherever the project lies."""
    project = tmp_path / "projé-测试 x"
    env_tree = project / ".venv"
    env_tree.mkdir(parents=True)
    (env_tree / "lib.txt").write_text("LIB")
    job = project / "runs" / "run1" / "work" / "item" / "sol0"
    job, result = _run(tmp_path, f"""
        import errno, os, re
        def unescape(b):
            return re.sub(rb"\\\\([0-7]{{3}})", lambda m: bytes([int(m.group(1), 8)]), b).decode()
        rw = []
        for line in open("/proc/self/mountinfo", "rb"):
            f = line.split(b" ")
            if b"ro" not in f[5].split(b","):
                rw.append(unescape(f[4]))
        print("RW", sorted(set(rw)))
        print("READ", open({str(env_tree / 'lib.txt')!r}).read())
        for target in [{str(env_tree / 'lib.txt')!r}, {str(job / 'ro' / 'x')!r}]:
            try:
                open(target, "a").write("tampered")
                print("WROTE", target)
            except OSError as exc:
                print("REFUSED", target, errno.errorcode[exc.errno])
        open({str(job / 'mine.txt')!r}, "w").write("ok")
        """, hide=[project], keep=[env_tree], job=job)
    out = result.output
    assert result.returncode == 0, out
    job_real = str(job.resolve())
    # below the job's scratch a /dev/shm of the host's lies covered; /proc stays writable
    for point in _said(out, "RW"):
        assert point in {job_real, "/tmp", "/var/tmp", "/dev/shm", "/run"} or \
            point == "/proc" or point.startswith("/proc/") or point.startswith("/dev/"), out
    assert job_real in _said(out, "RW"), out
    assert "READ LIB" in out and "WROTE" not in out and \
        sum(line.startswith("REFUSED") and line.endswith("EROFS") for line in out.splitlines()) == 2, out
    assert (env_tree / "lib.txt").read_text() == "LIB"
    assert (job / "mine.txt").read_text() == "ok"


def test_mountinfo_paths_are_decoded_as_bytes():
    assert sandbox_init.unescape(rb"/a\040b\011c\012d\134e") == "/a b\tc\nd\\e"
    assert sandbox_init.unescape("/projé-测试\\040x".encode()) == "/projé-测试 x"
    assert sandbox_init.unescape("/projé-测试".encode()) == "/projé-测试"


def test_pid_1_exits_with_the_launchers_status_or_125(tmp_path):
    job, result = _run(tmp_path, "import sys; sys.exit(7)", hide=[])
    assert result.returncode == 7, result.output
    missing = tmp_path / "gone"
    argv = sandbox.wrap(missing, [sys.executable, "-c", "pass"], {"PATH": "/usr/bin:/bin"},
                        hide=[])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == sandbox.SETUP_FAILED, done.stderr
    assert "set-up failed" in done.stderr


def test_a_job_sees_of_etc_only_what_programs_need(tmp_path):
    """A rank that reads the host's secrets (shadow, registry settings, keys) finds none of
    them: /etc holds only `ETC_KEEP`, and the name service still answers."""
    job, result = _run(tmp_path, """
        import os, socket
        print("ETC", sorted(os.listdir("/etc")))
        print("SEEN", [p for p in ["/etc/shadow", "/etc/gshadow", "/etc/pip.conf", "/etc/npmrc",
                                   "/etc/gitconfig", "/etc/ssh", "/etc/ssl", "/etc/machine-id",
                                   "/etc/munge"] if os.path.lexists(p)])
        print("LOCALHOST", socket.gethostbyname("localhost"))
        """, hide=[])
    out = result.output
    assert result.returncode == 0, out
    assert set(_said(out, "ETC")) <= set(sandbox.ETC_KEEP), out
    assert _said(out, "SEEN") == [], out
    assert "LOCALHOST 127." in out, out


def test_ranks_in_sandboxes_of_their_own_share_their_nodes_shm_and_get_their_launchers_variables(
        tmp_path):
    """Two ranks as srun starts them (`sandbox.rank_wrap`: one plan, a sandbox each, the
    launcher's variables in each one's environment): each gets its own SLURM_* and PMIx
    variables over the plan's, the PID its task has on the host (SLURM_TASK_PID), the job
    step's PMIx folder read-only at its own path (a folder bound "rw" writable), and one
    /dev/shm with its peer, which the
    last to end removes; what the plan hides stays hidden, and nothing else of the
    launcher's environment comes in."""
    refs = tmp_path / "references"
    refs.mkdir()
    (refs / "solution.py").write_text("SECRET")
    step = tmp_path / "spool" / "pmix.9.0"
    step.mkdir(parents=True)
    (step / "dstore").write_text("store")
    other = tmp_path / "spool" / "other"  # a folder a plan may bind writable
    other.mkdir()
    (tmp_path / "spool" / "cred_state").write_text("slurmd's")
    job = _job(tmp_path)
    (job / "ro" / "probe.py").write_text(textwrap.dedent(f"""
        import os, sys, time
        rank = int(os.environ["SLURM_PROCID"])
        open(f"/dev/shm/from-{{rank}}", "w").write(str(rank))
        end = time.monotonic() + 30
        while not os.path.exists(f"/dev/shm/from-{{1 - rank}}") and time.monotonic() < end:
            time.sleep(0.05)
        for mode in ("ro", "rw"):
            try:
                open(os.path.join(os.environ[f"STEP_{{mode.upper()}}"], f"w-{{rank}}"), "w").write("x")
                print("WROTE", mode)
            except OSError as exc:
                print("REFUSED", mode, exc.errno)
        print("RANK", rank, "PID", os.getpid(), "PEER", os.path.exists(f"/dev/shm/from-{{1 - rank}}"),
              "SEEN", os.path.exists({str(refs / 'solution.py')!r}),
              "SPOOL", os.path.exists({str(tmp_path / 'spool' / 'cred_state')!r}),
              "STORE", open({str(step / 'dstore')!r}).read(),
              "ENV", sorted(k for k in os.environ if k.startswith(("SLURM", "PMIX", "HOME"))),
              "JOB", os.environ["SLURM_JOB_ID"], "BTL", os.environ["OMPI_MCA_btl"], flush=True)
        """))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_JOB_ID": "9",
           "SLURM_PROCID": "plan's", "OMPI_MCA_btl": "self,vader"}
    words = sandbox.rank_wrap(job)
    spec = sandbox.rank_plan(job, env, hide=[refs])
    spec["bind_env"] = {**spec["bind_env"], "STEP_RO": "ro", "STEP_RW": "rw"}
    spec["inherit"] = {**spec["inherit"], "STEP_*": "launcher"}
    (job / "ro" / sandbox.RANK_PLAN).write_text(json.dumps(spec))
    shm = Path(spec["shared_shm"])
    procs = []
    for rank in (0, 1):
        launcher = {**os.environ, "SLURM_PROCID": str(rank), "SLURM_TASK_PID": str(20000 + rank),
                    "PMIX_SERVER_TMPDIR": f"{step}/", "PMIX_RANK": str(rank),
                    "OMPI_MCA_btl": "tcp", "HOME": "/root", "STEP_RO": str(step),
                    "STEP_RW": str(other)}
        procs.append(subprocess.Popen([*words, sys.executable, "-I", str(job / "ro" / "probe.py")],
                                      env=launcher, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for rank, (proc, out) in enumerate(zip(procs, outs)):
        assert proc.returncode == 0, out
        said = out.split("RANK ", 1)[1].split()
        assert said[:7] == [str(rank), "PID", str(20000 + rank), "PEER", "True", "SEEN", "False"], out
        assert "SPOOL False" in out and "STORE store" in out, out  # the step's folder alone
        assert "['PMIX_RANK', 'PMIX_SERVER_TMPDIR', 'SLURM_JOB_ID', 'SLURM_PROCID', " \
               "'SLURM_TASK_PID']" in out and "HOME" not in out, out
        assert "JOB 9 BTL self,vader" in out, out  # the plan's, where the launcher's does not win
        # the job step's PMIx folder read-only, as the rank plan binds it; "rw" writable
        assert f"REFUSED ro {errno.EROFS}" in out and "WROTE rw" in out, out
        assert not (step / f"w-{rank}").exists() and (other / f"w-{rank}").exists()
    assert not shm.exists(), "the last rank's sandbox leaves its node's /dev/shm folder"
