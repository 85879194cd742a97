"""Each rank in a sandbox of its own, as srun starts them (`sandbox.rank_wrap`,
`sandbox.rank_plan`): the plan keys sandbox_init reads for it, `inherit` (what of the
launcher's daemon's environment the rank gets), `bind_env` (the PMIx server's folders),
`pid_env` (the rank's PID in its namespace) and `shared_shm` (the node's /dev/shm folder of
the job: made, held, removed by the last, a dead job's swept). No namespaces here:
tests/e2e/test_sandbox.py builds such sandboxes, tests/system/test_slurm.py under srun."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

import pytest

from pytest_commbench import nodes, sandbox, sandbox_init
from pytest_commbench.nodes import Launcher, Node, Placement


def test_the_launchers_variables_win_where_the_plan_says_so_and_nothing_else_comes_in():
    plan = {"env": {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "batch", "OMPI_MCA_btl": "self,tcp",
                    "PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0,1"},
            "inherit": sandbox.RANK_INHERIT}
    environ = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_TASK_PID": "4242",
               "PMIX_RANK": "1", "PMIX_SERVER_URI4": "tcp4://127.0.0.1:1",
               "OMPI_MCA_btl": "self,vader", "OMPI_COMM_WORLD_RANK": "1",
               "CUDA_VISIBLE_DEVICES": "1", "FLUX_TASK_RANK": "1",
               "PATH": "/elsewhere", "HOME": "/root", "SECRET_KEY": "x", "SLURMD_NODENAME": "n1"}
    env = sandbox_init.job_env(plan, environ)
    assert env["SLURM_STEP_ID"] == "0" and env["SLURM_JOB_ID"] == "7"  # the rank's, the plan's
    assert env["SLURM_PROCID"] == "1" and env["PMIX_RANK"] == "1"
    assert env["PMIX_SERVER_URI4"] == "tcp4://127.0.0.1:1" and env["FLUX_TASK_RANK"] == "1"
    assert env["SLURMD_NODENAME"] == "n1" and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["OMPI_MCA_btl"] == "self,tcp"  # the plan's Open MPI settings keep priority
    assert env["OMPI_COMM_WORLD_RANK"] == "1"  # one the plan has not: the launcher's
    assert env["PATH"] == "/usr/bin" and "HOME" not in env and "SECRET_KEY" not in env
    # a plan without `inherit` (every job of mpirun's) is its env alone, as ever
    assert sandbox_init.job_env({"env": {"A": "1"}}, environ) == {"A": "1"}
    assert sandbox_init.matches("SLURM_X", "SLURM_*") and not sandbox_init.matches(
        "SLURMX", "SLURM_*") and sandbox_init.matches("GPU_DEVICE_ORDINAL", "GPU_DEVICE_ORDINAL")
    assert not sandbox_init.matches("GPU_DEVICE_ORDINALS", "GPU_DEVICE_ORDINAL")


def test_the_folders_the_environment_names_are_bound_in_their_mode_and_only_real_ones(tmp_path):
    step = tmp_path / "spool" / "pmix.3.0"
    (step / "pmix_dstor_ds21_1").mkdir(parents=True)
    plan = {"bind_env": {"PMIX_SERVER_TMPDIR": "rw", "PMIX_DSTORE_21_BASE_PATH": "rw",
                         "PMIX_SYSTEM_TMPDIR": "ro", "A": "ro", "B": "ro", "C": "ro",
                         "D": "ro", "E": "rw"}}
    environ = {"PMIX_SERVER_TMPDIR": f"{step}/", "PMIX_DSTORE_21_BASE_PATH":
               f"{step}//pmix_dstor_ds21_1", "PMIX_SYSTEM_TMPDIR": str(tmp_path),
               "A": "relative/path", "B": "/", "C": str(tmp_path / "missing"),
               "D": str(tmp_path / "spool" / ".." / ".."), "E": str(step)}
    found = sandbox_init.env_binds(plan, environ)
    assert found == [(str(step), True), (str(step / "pmix_dstor_ds21_1"), True),
                     (str(tmp_path), False), (os.path.normpath(tmp_path.parent), False)]
    assert sandbox_init.env_binds({}, environ) == []
    # the rank plan binds the job step's PMIx folder read-only, never the system's tmpdir
    assert sandbox.RANK_BIND_ENV["PMIX_SERVER_TMPDIR"] == "ro"
    assert "PMIX_SYSTEM_TMPDIR" not in sandbox.RANK_BIND_ENV


def test_the_launchers_pid_is_the_first_number_the_plan_names():
    plan = {"pid_env": ["SLURM_TASK_PID", "OTHER"]}
    assert sandbox_init.launcher_pid(plan, {"SLURM_TASK_PID": "4242"}) == 4242
    assert sandbox_init.launcher_pid(plan, {"SLURM_TASK_PID": "x", "OTHER": " 17 "}) == 17
    assert sandbox_init.launcher_pid(plan, {"SLURM_TASK_PID": "1"}) is None  # PID 1 is ours
    assert sandbox_init.launcher_pid({}, {"SLURM_TASK_PID": "4242"}) is None
    assert sandbox_init.last_pid_file({}) is None  # nothing opened where none is asked


def _shm(tmp_path: Path, name: str = "commbench-shm-sol0-ab") -> Path:
    tmp_path.mkdir(exist_ok=True)
    return tmp_path / name


def test_the_shared_shm_folder_is_made_held_and_removed_by_the_last_sandbox(tmp_path):
    path = _shm(tmp_path)
    first = sandbox_init.SharedShm(str(path))
    assert path.is_dir() and (path.stat().st_mode & 0o777) == 0o700
    second = sandbox_init.SharedShm(str(path))  # another rank's sandbox of the node
    (path / "sm_segment.0").write_bytes(b"x" * 100)
    first.remove()
    assert (path / "sm_segment.0").exists()  # the second still runs
    second.remove()
    assert not path.exists()
    with pytest.raises(sandbox_init.SetupError):
        sandbox_init.SharedShm(str(tmp_path / "not-ours"))


def test_a_dead_jobs_shared_shm_folder_is_swept_and_a_live_or_fresh_one_kept(tmp_path):
    dead, live, fresh = (_shm(tmp_path, f"commbench-shm-{n}") for n in ("dead", "live", "fresh"))
    other = tmp_path / "someone-elses"
    for folder in (dead, live, fresh, other):
        folder.mkdir()
        (folder / "f").write_text("x")
    old = time.time() - 2 * sandbox_init.SHM_STALE_S
    for folder in (dead, live, other):
        os.utime(folder, (old, old))
    holder = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(holder, fcntl.LOCK_SH)  # a sandbox of that job still runs
    try:
        mine = sandbox_init.SharedShm(str(tmp_path / "commbench-shm-new"))
        assert not dead.exists()
        assert live.exists() and fresh.exists() and other.exists()
        mine.remove()
    finally:
        os.close(holder)


def test_the_rank_plan_is_the_jobs_view_with_the_rank_keys_in_the_jobs_ro(tmp_path):
    job = tmp_path / "job"
    (job / "ro").mkdir(parents=True)
    words = sandbox.rank_wrap(job)
    assert words[-2:] == [f"@{job / 'ro' / sandbox.RANK_PLAN}", "--"]
    assert words[:len(sandbox.unshare_argv())] == sandbox.unshare_argv()
    assert (job / "ro" / "sandbox_init.py").read_bytes() == sandbox.INIT.read_bytes()
    hidden = tmp_path / "references"
    hidden.mkdir()
    spec = sandbox.rank_plan(job, {"PATH": "/usr/bin"}, hide=[hidden])
    assert json.loads((job / "ro" / sandbox.RANK_PLAN).read_text()) == spec
    assert str(hidden) in spec["hide"] and spec["job"] == str(job)
    assert spec["inherit"] == sandbox.RANK_INHERIT and spec["pid_env"] == ["SLURM_TASK_PID"]
    assert spec["bind_env"] == sandbox.RANK_BIND_ENV
    assert spec["shared_shm"].startswith(f"{sandbox.SHM_ROOT}/commbench-shm-job-")
    assert spec["limits"]["cgroup"] is None and spec["limits"]["pids_max"] == sandbox.PIDS_MAX
    assert spec["env"]["PATH"] == "/usr/bin"
    assert set(spec["env"]) & {"OMPI_MCA_smsc", "OMPI_MCA_btl_vader_single_copy_mechanism"}
    # the user's own choice of single copy stays
    assert sandbox.no_single_copy({"OMPI_MCA_smsc": "xpmem"}, 5) == {}
    assert sandbox.no_single_copy({}, 5) == {"OMPI_MCA_smsc": "^cma"}
    assert sandbox.no_single_copy({}, 4) == {
        "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}


def test_a_sandboxed_placement_launches_with_srun_and_skips_flux_run():
    p = Placement((Node("a", 2),), Launcher("srun"), here="a", sandboxed=True)
    assert p.skip_reason(2, span=True) is None
    far = Placement((Node("b", 1), Node("c", 1)), Launcher("srun"), here="a", sandboxed=True)
    assert far.skip_reason(2, span=True) is None  # a sandbox per rank, wherever it runs
    flux = Placement((Node("a", 2),), Launcher("flux"), here="a", sandboxed=True)
    reason = flux.skip_reason(2, span=True)
    assert "flux run starts each rank through the Flux broker" in reason
    assert "--commbench-unsandboxed" in reason
    assert Placement((Node("a", 2),), Launcher("flux"), here="a",
                     sandboxed=False).skip_reason(2, span=True) is None
    assert nodes.KINDS["srun"] == "srun"


def test_srun_ranks_keep_the_jobs_library_path_behind_the_mpis(tmp_path, monkeypatch):
    """A sandboxed srun rank's environment is the job's (a GPU platform's NCCL folder on
    its LD_LIBRARY_PATH stays), the MPI's library folder first, as srun's own has it."""
    from pytest_commbench.engine.job import job_argv
    from pytest_commbench.engine.plan import Plan
    from pytest_commbench.platforms import make
    from pytest_commbench.settings import Settings

    platform = make("cpu")
    platform.node_placement = Placement((Node("n1"), Node("n2")), Launcher("srun", "srun", ()),
                                        1, "test", "n1", sandboxed=True)
    monkeypatch.setattr(type(platform), "launcher_libdirs", lambda self, launcher: ["/mpi/lib"])
    job = tmp_path / "job"
    (job / "ro").mkdir(parents=True)
    settings = Settings(seed=1, work=tmp_path / "w" / "item", cache=tmp_path / "cache",
                        references=tmp_path / "refs" / "r")
    plan = Plan(task=None, world=2, platform=platform, settings=settings, op=None, cases=[],
                deadline=0.0, nodes=["n1", "n2"])
    argv = job_argv(plan, job, job / "ro" / "job.json", {"LD_LIBRARY_PATH": "/nccl/lib"},
                    tmp_path / "out", None)
    assert "srun" in argv and sandbox.RANK_PLAN in " ".join(argv)
    spec = json.loads((job / "ro" / sandbox.RANK_PLAN).read_text())
    assert spec["env"]["LD_LIBRARY_PATH"] == "/mpi/lib:/nccl/lib"
    assert "SLURM_HOSTFILE" not in spec["env"]  # srun's own, not the ranks'
    monkeypatch.setenv("LD_LIBRARY_PATH", "/caller/lib")
    job_argv(plan, job, job / "ro" / "job.json", {}, tmp_path / "out", None)
    spec = json.loads((job / "ro" / sandbox.RANK_PLAN).read_text())
    assert spec["env"]["LD_LIBRARY_PATH"] == "/mpi/lib:/caller/lib"
