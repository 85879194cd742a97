"""A job's own MPS daemon: `python -m commbench_rank.mps CONTROL OUT -- LAUNCHER...`.

Shared placement puts several ranks on one GPU. Without MPS their kernels time-slice (a
cross-process flag handshake then costs milliseconds, and NVSHMEM runs only in its limited
multi-process-per-GPU mode); under an MPS daemon they run side by side. This program is the
job's launcher when ranks share GPUs: it starts an MPS control daemon whose pipe and log
folders are private to the job (a fresh folder under the job's /tmp), runs the real launcher
(mpiexec) with the variables that make the ranks its clients, and stops the daemon
(`quit`) when the launcher ends, fails, or is asked to stop (SIGTERM, SIGINT). Inside the
job's sandbox the daemon lives in the job's PID namespace, so it also dies with the job when
this program is killed outright; outside one (`--commbench-unsandboxed`) the pipe folder is
written to OUT/mps.json so that the controller can stop a daemon left behind.

Exit status: the launcher's; MPS_FAILED when the daemon could not be started, its reason in
OUT/mps.json and on stderr. The code decides nothing by itself (a rank can end with it too):
no rank has run then, so no rank said it was loading the solution, and that is what makes the
controller judge the job the machine's failure.
Standard library only; imports nothing of the controller.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MPS_FAILED = 124  # the daemon could not be started (the job never ran)
START_S = 20.0  # how long the daemon may take to open its control pipe
STOP_S = 15.0  # ... and to end after `quit`
KILLED_S = 5.0  # ... and to be gone once killed


def _write(out: str, **fields) -> None:
    if fields.get("reason"):
        sys.stderr.write(f"[commbench mps] the job's MPS daemon did not start: "
                         f"{fields['reason']}\n")
    path = os.path.join(out, "mps.json")
    try:  # whole or not at all: the controller (and a reader waiting for a state) reads it
        with open(path + ".tmp", "w") as f:
            json.dump(fields, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def daemon_pids(pipe: str) -> list[int]:
    """Processes of this daemon: MPS control and server processes whose environment names
    this pipe folder (visible to the job's own PID namespace, or to the same user outside)."""
    found = []
    want = f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/comm", "rb") as f:
                comm = f.read().strip()
            if not comm.startswith(b"nvidia-cuda-mps"):
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if want in env:
            found.append(int(entry))
    return found


def stop(control: str, env: dict[str, str], pipe: str) -> bool:
    """Ask the daemon to quit and wait until its processes are gone (killed after STOP_S);
    True when none is left."""
    try:
        subprocess.run([control], input=b"quit\n", env=env, timeout=STOP_S,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        pass
    deadline = time.monotonic() + STOP_S
    while time.monotonic() < deadline:
        if not daemon_pids(pipe):
            return True
        time.sleep(0.1)
    for pid in daemon_pids(pipe):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + KILLED_S  # a loaded machine takes a while to reap them
    while time.monotonic() < deadline and daemon_pids(pipe):
        time.sleep(0.1)
    return not daemon_pids(pipe)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: python -m commbench_rank.mps CONTROL OUT -- LAUNCHER...\n")
        return 2
    control, out, launcher = argv[0], argv[1], argv[3:]
    # short paths: the daemon's sockets live in the pipe folder (108 bytes at most)
    base = tempfile.mkdtemp(prefix="mps-", dir="/tmp" if os.path.isdir("/tmp") else None)
    pipe, logs = os.path.join(base, "pipe"), os.path.join(base, "log")
    os.makedirs(pipe)
    os.makedirs(logs)
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=logs)
    _write(out, pipe=pipe, log=logs, control=control, state="starting")
    said = os.path.join(base, "start.txt")
    try:
        # its output to a file: a daemon keeps the descriptors it was given, and a pipe
        # would hold this program until the daemon ends
        with open(said, "w") as f:
            started = subprocess.run([control, "-d"], env=env, timeout=START_S,
                                     stdin=subprocess.DEVNULL, stdout=f, stderr=f)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _write(out, pipe=pipe, state="failed", reason=f"{control} -d: {exc}")
        return MPS_FAILED
    deadline = time.monotonic() + START_S
    while started.returncode == 0 and time.monotonic() < deadline:
        if os.path.exists(os.path.join(pipe, "control")):
            break
        time.sleep(0.05)
    else:
        try:
            with open(said, errors="replace") as f:
                why = f.read().strip()[-500:]
        except OSError:
            why = ""
        _write(out, pipe=pipe, state="failed",
               reason=f"{control} -d exited with {started.returncode}, no control pipe "
                      f"after {START_S:.0f} s: {why}")
        stop(control, env, pipe)
        return MPS_FAILED
    _write(out, pipe=pipe, log=logs, control=control, state="running",
           daemons=daemon_pids(pipe))
    child = subprocess.Popen(launcher, env=env)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    status = 1
    try:
        while True:
            try:
                status = child.wait()
                break
            except InterruptedError:
                continue
    finally:
        clean = stop(control, env, pipe)
        kept = _keep_logs(logs, out)
        _write(out, pipe=pipe, log=kept or logs, control=control,
               state="stopped" if clean else "left running")
        if clean:  # the daemon is gone: its folder goes with it (its log kept in the job's)
            shutil.rmtree(base, ignore_errors=True)
    return status if status >= 0 else 128 - status


def _keep_logs(logs: str, out: str) -> str | None:
    """The daemon's log folder copied into the job's output folder (where the job's evidence
    is kept); None where it could not be."""
    kept = os.path.join(out, "mps-log")
    try:
        shutil.copytree(logs, kept, dirs_exist_ok=True)
    except OSError:
        return None
    return kept


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
