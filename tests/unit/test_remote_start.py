"""The remote start of a sandboxed job over nodes (`remote_start.py`, `sandbox.wrap_over_nodes`):
the broker starts each node once, through the launcher's own agent, in a sandbox built from
that node's plan; a node it does not wait for is refused; its socket closes once every node
is started; a start whose client is gone loses its lifeline. The agent here is a stand-in
that says what it was asked (no namespaces: tests/e2e/test_simhosts.py runs the real one)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_commbench import remote_start, sandbox, sandbox_init

# the launcher's agent, as ssh: AGENT NODE COMMAND; it says its arguments on its output,
# then holds its lifeline (its standard input) until it is cut, and says so in a file
AGENT = r"""
import json, os, sys
print("AGENT " + json.dumps(sys.argv[1:]), flush=True)
if sys.argv[1] == "slow":
    sys.stdin.read()
    open(os.environ["CUT_FILE"], "w").write("cut")
sys.exit(7)
"""

# the sandboxed launcher: asks for starts as mpirun would, through the client
LAUNCHER = r"""
import json, os, subprocess, sys, time
client = sys.argv[1]
def start(node, *words):
    done = subprocess.run([sys.executable, "-I", "-S", client, "start", node, *words],
                          capture_output=True, text=True, timeout=30)
    print("START " + json.dumps({"node": node, "rc": done.returncode, "out": done.stdout,
                                 "err": done.stderr}), flush=True)
if os.environ.get("RANKS_UP"):  # as the controller says once every rank runs
    os.kill(os.getppid(), 10)  # SIGUSR1
    time.sleep(0.5)
    start("b", "prted")
    sys.exit(0)
start("elsewhere", "true")
start("b", "prted", "--x", "'a b'")
start("b", "prted")   # the socket is closed once every node started
slow = subprocess.Popen([sys.executable, "-I", "-S", client, "start", "slow", "sleep"])
time.sleep(1.0)
slow.kill()
slow.wait()
time.sleep(1.0)
sys.exit(3)
"""


def _broker(tmp_path: Path, nodes: list[str], ranks_up: bool = False
            ) -> tuple[subprocess.CompletedProcess, Path]:
    ro = tmp_path / "job" / "ro"
    ro.mkdir(parents=True)
    client = ro / "remote_start.py"
    client.write_bytes(Path(remote_start.__file__).read_bytes())
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    plans = {n: str(ro / f"sandbox-{i}.json") for i, n in enumerate(nodes)}
    config = {"socket": str(tmp_path / "job" / "remote-start.sock"),
              "agent": [sys.executable, str(tmp_path / "agent.py")], "nodes": nodes,
              "plans": plans, "sandbox": ["SANDBOX", "-x"]}
    (ro / remote_start.CONFIG).write_text(json.dumps(config))
    cut = tmp_path / "cut"
    done = subprocess.run([sys.executable, "-I", "-S", remote_start.__file__, "serve",
                           str(ro / remote_start.CONFIG), "--", sys.executable,
                           str(tmp_path / "launcher.py"), str(client)],
                          capture_output=True, text=True, timeout=60,
                          env={"CUT_FILE": str(cut), "PATH": "/usr/bin:/bin",
                               **({"RANKS_UP": "1"} if ranks_up else {})})
    return done, cut


def _starts(done: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(ln[6:]) for ln in done.stdout.splitlines() if ln.startswith("START ")]


def test_the_broker_starts_each_node_once_in_its_sandbox_and_refuses_the_rest(tmp_path):
    done, cut = _broker(tmp_path, ["b", "slow"])
    assert done.returncode == 3, done.stdout + done.stderr  # the launcher's status
    other, first, again = _starts(done)
    assert other["rc"] == 255 and "elsewhere is not a node of this job" in other["err"]
    # the agent got the node and one command: the daemon's, inside that node's sandbox
    assert first["rc"] == 7 and first["out"].startswith("AGENT "), first
    said = json.loads(first["out"][len("AGENT "):])
    plan = str(tmp_path / "job" / "ro" / "sandbox-0.json")
    assert said[0] == "b"
    assert shlex.split(said[1]) == ["SANDBOX", "-x", "@" + plan, "--", "/bin/sh", "-c",
                                    "prted --x 'a b'"]
    assert again["rc"] == 255 and "b was started already" in again["err"]
    # a start whose client was killed loses its lifeline
    assert cut.read_text() == "cut"
    assert not (tmp_path / "job" / "remote-start.sock").exists()


def test_the_socket_closes_once_every_node_is_started(tmp_path):
    done, _cut = _broker(tmp_path, ["b"])
    _other, first, again = _starts(done)
    assert first["rc"] == 7
    # the listener is gone: the next client cannot even connect
    assert again["rc"] == 255 and "started already" not in again["err"]
    assert "No such file" in again["err"] or "refused" in again["err"], again


def test_the_socket_closes_when_the_controller_says_every_rank_runs(tmp_path):
    done, _cut = _broker(tmp_path, ["b"], ranks_up=True)
    (late,) = _starts(done)
    assert done.returncode == 0, done.stderr
    assert late["rc"] == 255 and ("No such file" in late["err"] or "refused" in late["err"])
    assert not (tmp_path / "job" / "remote-start.sock").exists()


@pytest.mark.parametrize("major", [4, 5])
def test_the_launchers_agent_is_taken_from_its_options_else_its_environment_else_ssh(major):
    flag = "--mca" if major == 4 else "--prtemca"
    param = "plm_rsh_agent" if major == 4 else "plm_ssh_agent"
    argv = ["mpirun", flag, "plm", "rsh", flag, param, "/rig/agent -q", "--mca", "btl", "tcp",
            "-n", "2"]
    kept, agent = sandbox.remote_agent(argv, {}, major)
    assert agent == ["/rig/agent", "-q"]
    assert kept == ["mpirun", "--mca", "btl", "tcp", "-n", "2"]
    env = {("OMPI_MCA_" if major == 4 else "PRTE_MCA_") + param: "rsh : ssh"}
    assert sandbox.remote_agent(["mpirun", "-n", "2"], env, major)[1] == ["rsh"]
    assert sandbox.remote_agent(["mpirun", "-n", "2"], {}, major) == (["mpirun", "-n", "2"],
                                                                       ["ssh"])


def test_a_plan_may_come_from_a_file_with_the_launcher_after_it(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"argv": ["/bin/false"], "job": "/j"}))
    assert sandbox_init.read_plan([f"@{plan}"])["argv"] == ["/bin/false"]
    assert sandbox_init.read_plan([f"@{plan}", "--", "sh", "-c", "x"])["argv"] == [
        "sh", "-c", "x"]
    assert sandbox_init.read_plan([json.dumps({"argv": ["a"]})])["argv"] == ["a"]
    with pytest.raises(sandbox_init.SetupError):
        sandbox_init.read_plan([f"@{plan}", "sh"])
    (tmp_path / "fifo").symlink_to(plan)
    with pytest.raises(OSError):  # never through a link
        sandbox_init.read_plan([f"@{tmp_path / 'fifo'}"])
