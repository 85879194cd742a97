"""Shared placement (--commbench-ranks-per-gpu) without a GPU: which items run where (a fake
`nvidia-smi`), what a job on shared GPUs is given, and the lifecycle of its MPS daemon (a
fake control program that behaves as the real one does: `-d` starts a daemon and returns,
`quit` on its standard input ends it)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_commbench import sandbox
from pytest_commbench.platforms import make
from pytest_commbench.platforms import nvidia as gpu
from pytest_commbench.rank import mps
from pytest_commbench.tasks import load_task

REPO = Path(__file__).resolve().parents[2]

FAKE_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=name,driver_version,memory.total*)
    i=0; while [ $i -lt ${FAKE_GPUS:-1} ]; do echo "NVIDIA H200, 580.159.04, 143771 MiB"; i=$((i+1)); done ;;
  *) exit 0 ;;
esac
"""

FAKE_MPS = """#!PYTHON
import os, sys, time
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
ctl = os.path.join(pipe, "control")
if sys.argv[1:] == ["-d"]:
    if os.environ.get("FAKE_MPS_BROKEN"):
        sys.exit(0)  # says it started, opens no pipe
    if os.fork():
        sys.exit(0)  # the caller returns at once, as with the real daemon
    os.setsid()
    os.mkfifo(ctl)
    with open(os.path.join(os.environ["CUDA_MPS_LOG_DIRECTORY"], "control.log"), "a") as log:
        log.write(f"started {os.getpid()}\\n")
    while True:
        with open(ctl) as f:
            if "quit" in f.read():
                os.unlink(ctl)
                sys.exit(0)
else:
    command = sys.stdin.read()
    with open(ctl, "w") as f:
        f.write(command)
"""


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    """A folder first on PATH with a fake nvidia-smi (FAKE_GPUS of them) and MPS control."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "nvidia-smi").write_text(FAKE_SMI)
    (folder / "nvidia-cuda-mps-control").write_text(FAKE_MPS.replace("PYTHON", sys.executable))
    for f in folder.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    gpu.nvidia_gpus.cache_clear()
    yield folder
    gpu.nvidia_gpus.cache_clear()


def _task(relpath: str):
    return load_task(REPO / "suites" / relpath / "task.toml", REPO / "suites")


def _platform(per_gpu: int = 1) -> gpu.NvidiaPlatform:
    platform = make("h200")
    platform.place(per_gpu)
    return platform


# -- which items run where ---------------------------------------------------------------------

def test_one_gpu_runs_two_ranks_only_when_they_may_share_it(fake_bin, monkeypatch):
    monkeypatch.setenv("FAKE_GPUS", "1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    task = _task("collective/oneshot_allreduce_ipc")
    alone = _platform(1).skip_reason(task, 2)
    assert alone and "needs 2 H200 GPUs, this machine has 1" in alone
    assert "--commbench-ranks-per-gpu" in alone  # the way out is named
    shared = _platform(2)
    if shared.skip_reason(task, 2) is not None:  # no nvcc or mpiexec on this machine
        assert "compiler" in shared.skip_reason(task, 2) or "mpiexec" in shared.skip_reason(task, 2)
    else:
        assert shared.gpus_for(2) == 1 and shared.shared(2)
    # 4 ranks at 2 per GPU need 2 GPUs; at 4 per GPU one
    assert "needs 2 H200 GPUs" in _platform(2).skip_reason(task, 4)
    assert _platform(4).gpus_for(4) == 1 and _platform(4).gpus_for(8) == 2


def test_a_task_that_needs_distinct_gpus_is_skipped_there_and_only_there(fake_bin, monkeypatch):
    monkeypatch.setenv("FAKE_GPUS", "2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    topo = _task("utility/nvml_topology")
    assert "distinct-gpus" in topo.requires
    reason = _platform(2).skip_reason(topo, 2)
    assert reason and "needs a GPU per rank" in reason and "ranks-per-gpu=2" in reason
    # one GPU per rank (2 GPUs, 2 ranks): the feature is there
    assert "distinct" not in (_platform(1).skip_reason(topo, 2) or "")
    # every other GPU task of the suite is not skipped for placement
    for manifest in sorted((REPO / "suites").glob("*/*/task.toml")):
        task = load_task(manifest, REPO / "suites")
        if "h200" not in task.platforms or "distinct-gpus" in task.requires:
            continue
        assert "GPU per rank" not in (_platform(2).skip_reason(task, 2) or ""), task.relpath


def test_a_sandboxed_job_sharing_a_gpu_keeps_to_one_node(fake_bin, monkeypatch):
    """Ranks sharing a GPU start through the job's MPS wrapper, which runs in one sandbox:
    such an item over nodes is skipped saying so; without the sandbox it is not."""
    from pytest_commbench.nodes import Launcher, Node, Placement

    monkeypatch.setenv("FAKE_GPUS", "1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    task = _task("collective/nccl_allreduce")
    assert task.spans_nodes

    def placed(per_gpu: int, sandboxed: bool = True, launcher: str = "mpirun",
               nodes: tuple = ("n1", "n2")):
        platform = _platform(per_gpu)
        platform.node_placement = Placement(tuple(Node(n) for n in nodes), Launcher(launcher),
                                            3 - len(nodes), "test", "n1", None, sandboxed)
        return platform

    reason = placed(2).skip_reason(task, 2) or ""
    assert "would run on n2 and share a GPU" in reason and "MPS wrapper" in reason, reason
    assert "share a GPU" not in (placed(2, sandboxed=False).skip_reason(task, 2) or "")
    # srun's ranks, each in a sandbox of its own: on one node too
    reason = placed(2, launcher="srun", nodes=("n1",)).skip_reason(task, 2) or ""
    assert "would share a GPU" in reason and "srun's ranks run each in a sandbox" in reason, \
        reason
    assert "share a GPU" not in (placed(2, sandboxed=False, launcher="srun", nodes=("n1",))
                                 .skip_reason(task, 2) or "")


def test_without_the_mps_control_program_shared_items_are_skipped_saying_so(fake_bin,
                                                                             monkeypatch):
    monkeypatch.setenv("FAKE_GPUS", "1")
    (fake_bin / "nvidia-cuda-mps-control").unlink()
    monkeypatch.setattr(gpu, "MPS_CONTROL_DIRS", ())
    monkeypatch.setenv("PATH", f"{fake_bin}:/usr/bin:/bin")
    task = _task("collective/oneshot_allreduce_ipc")
    reason = _platform(2).skip_reason(task, 2) or ""
    assert "MPS" in reason or "compiler" in reason or "mpiexec" in reason


def test_a_shared_job_is_given_its_gpus_loopback_nccl_and_the_mps_launcher(fake_bin, monkeypatch,
                                                                            tmp_path):
    monkeypatch.setenv("FAKE_GPUS", "2")
    monkeypatch.setenv("COMMBENCH_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    platform = _platform(2)
    with platform.lease(4, exclusive=False) as env:
        assert env["CUDA_VISIBLE_DEVICES"] in ("0,1", "1,0")
        assert env["NCCL_SOCKET_IFNAME"] == "lo" and env["NCCL_IB_DISABLE"] == "1"
    with _platform(1).lease(2, exclusive=False) as env:
        assert "NCCL_SOCKET_IFNAME" not in env
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"out": str(tmp_path / "out")}))
    argv = platform.launch_argv(2, job)
    assert argv[1:3] == ["-m", "commbench_rank.mps"] and argv[4] == str(tmp_path / "out")
    assert argv[5] == "--" and "commbench_rank" in argv[-2]
    assert "commbench_rank.mps" not in _platform(1).launch_argv(2, job)
    assert platform.fingerprint()["placement"].startswith("shared: up to 2 ranks per GPU")
    assert _platform(1).fingerprint()["placement"] == "one GPU per rank"
    platform.place(2, 3)  # untimed jobs side by side, each a slot of the GPU
    assert platform.fingerprint()["placement"].endswith("up to 3 untimed jobs per GPU")
    with platform.lease(2, exclusive=False) as first, \
            platform.lease(2, exclusive=False) as second, \
            platform.lease(2, exclusive=False) as third:
        # the two GPUs first, then side by side on one of them
        assert {first["CUDA_VISIBLE_DEVICES"], second["CUDA_VISIBLE_DEVICES"]} == {"0", "1"}
        assert third["CUDA_VISIBLE_DEVICES"] in ("0", "1")
        assert "COMMBENCH_RANK_CPUS" not in third  # side by side: not pinned to the same CPUs
    single = _platform(1)
    single.place(1, 4)  # one GPU per rank: no MPS, so jobs never share it
    assert single.jobs_per_gpu == 1


def test_each_rank_on_a_shared_gpu_is_its_own_nccl_host_with_a_share_of_the_sms(monkeypatch):
    from pytest_commbench.rank.gpu import share_gpu
    from pytest_commbench.rank.protocol import DEVICE_VENDORS

    cuda = DEVICE_VENDORS["cuda"]
    for var in ("NCCL_HOSTID", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"):
        monkeypatch.delenv(var, raising=False)
    share_gpu(SimpleNamespace(ranks_per_gpu=1), 0, 2, 0, cuda)
    assert "NCCL_HOSTID" not in os.environ
    hosts, shares = set(), []
    for rank in range(3):  # 3 ranks at up to 8 per GPU: one GPU, a third of its SMs each
        share_gpu(SimpleNamespace(ranks_per_gpu=8), rank, 3, rank, cuda)
        hosts.add(os.environ["NCCL_HOSTID"])
        shares.append(int(os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]))
    assert len(hosts) == 3 and sum(shares) <= 100 and shares == [33, 33, 33]


def test_a_shared_timing_is_never_banded_and_the_summary_says_why():
    from pytest_commbench.report import unreadable
    from pytest_commbench.scoring import band

    assert band(1.5, [1.4, 1.6], "shared") == "inconclusive"
    assert band(1.5, [1.4, 1.6], "ok") == "Better"
    record = {"task": "collective/x", "world": 2, "verdict": "pass", "timing_trust": "shared",
              "nodeid": "x"}
    assert "shared: its ranks shared a GPU" in unreadable([record])[0]


# -- the MPS daemon of a job -------------------------------------------------------------------

def _daemons(pipe: str) -> list[int]:
    return mps.daemon_pids(pipe)


def _wrapper(fake_bin: Path, out: Path, launcher: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest_commbench.rank.mps",
            str(fake_bin / "nvidia-cuda-mps-control"), str(out), "--", *launcher]


def _state(out: Path) -> dict:
    return json.loads((out / "mps.json").read_text())


def _await_running(out: Path, limit_s: float = 30) -> None:
    """Until the wrapper says its daemon runs (or the limit passes)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and not (
            (out / "mps.json").exists() and _state(out).get("state") == "running"):
        time.sleep(0.05)


def test_the_daemon_serves_the_launcher_and_is_stopped_after_it(fake_bin, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    show = "import os; print(os.environ['CUDA_MPS_PIPE_DIRECTORY'])"
    done = subprocess.run(_wrapper(fake_bin, out, [sys.executable, "-c", show]),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    state = _state(out)
    assert done.stdout.strip() == state["pipe"] and state["state"] == "stopped"
    assert os.path.exists(os.path.join(state["log"], "control.log"))  # it did start
    assert _daemons(state["pipe"]) == []
    # its private folder (pipes, log) is gone with it; the log is kept in the job's folder
    assert state["log"] == str(out / "mps-log")
    assert not os.path.exists(os.path.dirname(state["pipe"]))


def test_a_failing_launcher_keeps_its_status_and_the_daemon_is_stopped(fake_bin, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(_wrapper(fake_bin, out, [sys.executable, "-c", "raise SystemExit(7)"]),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 7
    assert _state(out)["state"] == "stopped" and _daemons(_state(out)["pipe"]) == []


def test_a_daemon_that_does_not_start_is_the_machines_failure_with_the_reason(
        fake_bin, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_BROKEN", "1")
    monkeypatch.setattr(mps, "START_S", 1.0)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = ("import sys; from pytest_commbench.rank import mps; mps.START_S = 1.0; "
            "sys.exit(mps.main(sys.argv[1:]))")
    argv = [sys.executable, "-c", code, *_wrapper(fake_bin, out, ["true"])[3:]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == mps.MPS_FAILED
    assert "no control pipe" in _state(out)["reason"] and "MPS daemon did not start" in done.stderr


def test_a_terminated_job_stops_its_daemon(fake_bin, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen(_wrapper(fake_bin, out, [sys.executable, "-c",
                                                     "import time; time.sleep(120)"]))
    _await_running(out)
    pipe = _state(out)["pipe"]
    assert _daemons(pipe), "the daemon runs while the job does"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert _daemons(pipe) == [] and _state(out)["state"] == "stopped"


def test_a_killed_sandboxed_job_takes_its_daemon_with_it(fake_bin, tmp_path, processes_with):
    """kill -9 of the wrapper: inside the job's sandbox the daemon is in the job's PID
    namespace, which the kernel empties when the job's first process dies."""
    if sandbox.probe():
        pytest.skip(f"no sandbox here: {sandbox.probe()}")
    job = tmp_path / "job"
    (job / "ro").mkdir(parents=True)
    out = job / "out"
    out.mkdir()
    code = job / "ro" / "code" / "commbench_rank"  # the job's own copy, as the runner stages it
    code.mkdir(parents=True)
    for src in (REPO / "pytest_commbench" / "rank").glob("*.py"):
        shutil.copyfile(src, code / src.name)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(code.parent)}
    argv = _wrapper(fake_bin, out, [sys.executable, "-c", "import time; time.sleep(120)"])
    argv[2] = "commbench_rank.mps"
    argv = sandbox.wrap(job, argv, env, hide=[], keep=[fake_bin])
    proc = subprocess.Popen(argv, start_new_session=True)
    _await_running(out)
    assert _state(out)["state"] == "running"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # the fake daemon's command line: <fake_bin>/nvidia-cuda-mps-control -d
    daemon = f"{fake_bin}/nvidia-cuda-mps-control\0-d".encode()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and processes_with(daemon):
        time.sleep(0.1)
    assert processes_with(daemon) == []


def test_an_unsandboxed_job_killed_outright_leaves_a_daemon_the_controller_stops(fake_bin,
                                                                                 tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen(_wrapper(fake_bin, out, [sys.executable, "-c",
                                                     "import time; time.sleep(120)"]),
                            start_new_session=True)
    _await_running(out)
    pipe = _state(out)["pipe"]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert _daemons(pipe), "a daemon outside any sandbox survives its job's kill -9"
    _platform(2).reap(out)
    assert _daemons(pipe) == []


def test_the_controller_never_reads_a_planted_fifo_as_the_daemons_state(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "mps.json")
    started = time.monotonic()
    _platform(2).reap(out)  # returns at once, reads nothing
    assert time.monotonic() - started < 5
