"""Placement over nodes without a cluster: node lists as batch systems write them, the
allocation read from a given environment, each rank's node, the launchers' commands that
name it, where ranks landed against where they were asked, and the manifest's `nodes`."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from pytest_commbench import nodes
from pytest_commbench.nodes import Launcher, Node, Placement, PlacementError, away
from pytest_commbench.platforms import make
from pytest_commbench.tasks import ManifestError, load_suite, load_task, marker_names

REPO = Path(__file__).resolve().parents[2]


# -- node lists ------------------------------------------------------------------------------

def test_hostlists_expand_as_slurm_and_flux_write_them():
    assert nodes.expand_hostlist("node[01-03,07],gpu5") == [
        "node01", "node02", "node03", "node07", "gpu5"]
    assert nodes.expand_hostlist("r[1-2]n[8-9]") == ["r1n8", "r1n9", "r2n8", "r2n9"]
    assert nodes.expand_hostlist("a,b") == ["a", "b"]
    assert nodes.expand_hostlist("x[9-11]") == ["x9", "x10", "x11"]
    for bad in ("n[1-", "n]1[", "n[3-1]", "n[a-b]", "n[0-99999]"):
        with pytest.raises(PlacementError):
            nodes.expand_hostlist(bad)


def test_slurm_tasks_per_node_are_one_count_per_node():
    assert nodes.slurm_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert nodes.slurm_tasks_per_node("4") == [4]
    with pytest.raises(PlacementError):
        nodes.slurm_tasks_per_node("2(y3)")


def test_hostfiles_of_open_mpi_mpich_and_pbs_give_nodes_and_slots_in_order():
    text = "# two nodes\nb slots=4 max_slots=8\na:2\n\n10.0.0.3\n"
    assert nodes.parse_hostfile(text) == (Node("b", 4), Node("a", 2), Node("10.0.0.3"))
    # a nodefile names a node once per slot
    assert nodes.parse_hostfile("n2\nn2\nn1\nn2\n") == (Node("n2", 3), Node("n1"))
    with pytest.raises(PlacementError, match="names no node"):
        nodes.parse_hostfile("# nothing\n")
    with pytest.raises(PlacementError, match="line 1"):
        nodes.parse_hostfile("a slots=x\n")


# -- the allocation --------------------------------------------------------------------------

def test_a_slurm_allocation_gives_its_nodes_and_their_tasks():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[01-02]",
           "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_NTASKS_PER_NODE": "4"}
    found = nodes.from_environment(env)
    assert found.nodes == (Node("gpu01", 4), Node("gpu02", 4))
    assert found.source == "SLURM_JOB_NODELIST" and found.ranks_per_node == 4
    # counts that do not match the nodes are not used
    env = {"SLURM_JOB_NODELIST": "a,b", "SLURM_TASKS_PER_NODE": "3"}
    assert nodes.from_environment(env).nodes == (Node("a"), Node("b"))


def test_a_pbs_allocation_is_read_from_its_nodefile(tmp_path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("c1\nc1\nc2\nc2\n")
    found = nodes.from_environment({"PBS_JOBID": "1", "PBS_NODEFILE": str(nodefile)})
    assert found.nodes == (Node("c1", 2), Node("c2", 2)) and found.source == "PBS_NODEFILE"


def test_an_lsf_allocation_gives_its_hosts_with_their_slots():
    env = {"LSB_JOBID": "3", "LSB_MCPU_HOSTS": "hA 4 hB 2", "LSB_HOSTS": "ignored"}
    assert nodes.from_environment(env).nodes == (Node("hA", 4), Node("hB", 2))
    assert nodes.from_environment({"LSB_HOSTS": "hA hA hB"}).nodes == (Node("hA", 2),
                                                                      Node("hB"))
    with pytest.raises(PlacementError, match="pairs"):
        nodes.from_environment({"LSB_MCPU_HOSTS": "hA 4 hB"})


def test_a_flux_allocation_asks_flux_for_its_nodes():
    asked = []

    def run(argv):
        asked.append(argv)
        return "fx[1-2]\n"

    found = nodes.from_environment({"FLUX_JOB_ID": "f123", "SLURM_JOB_NODELIST": "outer"},
                                   run=run)
    assert found.nodes == (Node("fx1"), Node("fx2")) and found.source == "flux resource list"
    assert asked and asked[0][:3] == ["flux", "resource", "list"]


def test_outside_an_allocation_there_is_none():
    assert nodes.from_environment({"HOME": "/root"}) is None


# -- options and the run's placement ---------------------------------------------------------

def test_launchers_are_named_with_arguments_of_their_own():
    assert nodes.parse_launcher("mpirun") == Launcher("mpirun")
    assert nodes.parse_launcher("mpiexec --mca btl tcp,self") == Launcher(
        "mpirun", None, ("--mca", "btl", "tcp,self"))
    assert nodes.parse_launcher("/opt/rig/bin/mpirun -x") == Launcher(
        "mpirun", "/opt/rig/bin/mpirun", ("-x",))
    assert nodes.parse_launcher("srun --mpi=pmix") == Launcher("srun", "srun", ("--mpi=pmix",))
    assert nodes.parse_launcher("flux run -o cpu-affinity=off") == Launcher(
        "flux", "flux", ("-o", "cpu-affinity=off"))
    for bad, why in (("torchrun", "not a launcher"), ("flux submit", "flux run"),
                     ("", "no launcher"), ("srun 'x", "cannot read")):
        with pytest.raises(PlacementError, match=why):
            nodes.parse_launcher(bad)


def test_without_options_or_an_allocation_of_several_nodes_jobs_stay_here():
    assert nodes.resolve(None, None, None, {}) is None
    assert nodes.resolve(None, None, None, {"SLURM_JOB_NODELIST": "only1"}) is None
    found = nodes.resolve(None, None, None, {"SLURM_JOB_NODELIST": "n[1-2]"}, here="n1")
    assert [n.name for n in found.nodes] == ["n1", "n2"] and found.launcher.kind == "mpirun"


def test_an_option_alone_places_jobs_on_the_allocation_or_this_host(tmp_path):
    found = nodes.resolve("srun", None, None, {"SLURM_JOB_NODELIST": "solo"}, here="solo")
    assert found.nodes == (Node("solo"),) and found.launcher.kind == "srun"
    found = nodes.resolve(None, None, 2, {}, here="box")
    assert found.nodes == (Node("box"),) and found.source == "this host"
    hostfile = tmp_path / "hosts"
    hostfile.write_text("h1 slots=2\nh2 slots=2\n")
    found = nodes.resolve(None, str(hostfile), None, {"SLURM_JOB_NODELIST": "x[1-4]"})
    assert [n.name for n in found.nodes] == ["h1", "h2"]  # the hostfile outranks
    with pytest.raises(PlacementError, match="cannot read the hostfile"):
        nodes.resolve(None, str(tmp_path / "missing"), None, {})


def _placement(*names: str, per_node: int | None = None, slots: int | None = None,
               here: str = "controller", sandboxed: bool = False) -> Placement:
    return Placement(tuple(Node(n, slots) for n in names), Launcher("mpirun"), per_node,
                     "test", here, None, sandboxed)


def test_ranks_fill_the_nodes_in_order():
    p = _placement("a", "b", "c", per_node=2)
    assert p.layout(5, span=True) == ["a", "a", "b", "b", "c"]
    assert p.layout(2, span=True) == ["a", "a"]
    # the hosts' slots where every node has the same, else the ranks spread evenly
    assert _placement("a", "b", slots=3).layout(4, span=True) == ["a", "a", "a", "b"]
    assert _placement("a", "b").layout(4, span=True) == ["a", "a", "b", "b"]
    assert _placement("a", "b").layout(3, span=True) == ["a", "a", "b"]


def test_a_task_that_may_not_span_nodes_keeps_its_ranks_on_the_controllers_node():
    assert _placement("a", "b", per_node=1, here="b.cluster").layout(3, span=False) == [
        "b", "b", "b"]
    assert _placement("a", "b", per_node=1).layout(3, span=False) == ["a", "a", "a"]


def test_an_item_that_needs_more_nodes_than_there_are_is_skipped_saying_why():
    p = _placement("a", "b", per_node=2)
    assert p.skip_reason(4, span=True) is None
    reason = p.skip_reason(6, span=True)
    assert "needs 3 nodes at 2 ranks per node" in reason and "has 2" in reason
    assert p.skip_reason(6, span=False) is None  # all on one node


def test_a_sandboxed_job_goes_to_other_nodes_with_mpirun_or_srun_only():
    p = _placement("a", "b", per_node=1, here="a", sandboxed=True)
    assert p.skip_reason(1, span=True) is None  # only here
    assert p.skip_reason(2, span=True) is None  # mpirun: a sandbox on each node
    srun = dataclasses.replace(p, launcher=Launcher("srun"))
    assert srun.skip_reason(2, span=True) is None  # srun: a sandbox for each rank
    other = dataclasses.replace(p, launcher=Launcher("flux"))
    reason = other.skip_reason(2, span=True)
    assert "would run on b" in reason and "not with flux run" in reason
    assert "starts each rank through the Flux broker, outside the job's sandbox" in reason
    assert "--commbench-unsandboxed" in reason
    # on this node alone too: the ranks are still its daemon's, never the sandbox's
    here = other.skip_reason(1, span=True)
    assert here and "would run on" not in here and "not with flux run" in here
    assert dataclasses.replace(other, sandboxed=False).skip_reason(2, span=True) is None
    assert _placement("localhost", per_node=1, here="a", sandboxed=True).skip_reason(
        2, span=False) is None


def test_the_nodes_away_from_this_host_are_those_of_other_names():
    assert away(["a", "a", "b.cluster", "c", "b"], "a.cluster") == ["b.cluster", "c", "b"]
    assert away(["localhost", "127.0.0.1", "h1"], "h1") == []


# -- the launchers' commands -----------------------------------------------------------------

PROGRAM = ["python", "-m", "commbench_rank", "/j/ro/job.json"]


def test_mpirun_names_each_nodes_ranks_and_maps_them_by_slot():
    argv = nodes.launch_command(Launcher("mpirun", None, ("--bind-to", "none")),
                                ["h1", "h1", "h2"], PROGRAM, "/j/ro/ranks.hosts",
                                mpiexec="/venv/bin/mpiexec", output=("--output", ":raw"))
    assert argv == ["/venv/bin/mpiexec", "--output", ":raw", "--bind-to", "none", "-n", "3",
                    "--host", "h1:2,h2:1", "--map-by", "slot", *PROGRAM]
    mpich = nodes.launch_command(Launcher("mpirun"), ["a", "b"], PROGRAM, "f",
                                 mpiexec="mpiexec", flavour="mpich")
    assert mpich == ["mpiexec", "-n", "2", "-hosts", "a:1,b:1", *PROGRAM]
    # the user's own output option is kept, and a layout must be blocks
    own = nodes.launch_command(Launcher("mpirun", "/x/mpirun", ("--output=tag",)), ["a"],
                               PROGRAM, "f", output=("--output", ":raw"))
    assert own[:2] == ["/x/mpirun", "--output=tag"]
    with pytest.raises(PlacementError, match="block"):
        nodes.launch_command(Launcher("mpirun"), ["a", "b", "a"], PROGRAM, "f", mpiexec="m")


def test_srun_gets_each_ranks_node_from_its_hostfile_in_arbitrary_order():
    """Each task's node, repeats included, in the node list as in SLURM_HOSTFILE: a real srun
    refuses "2 tasks but hostlist specified 1 nodes" otherwise (tests/system/test_slurm.py)."""
    argv = nodes.launch_command(Launcher("srun", "srun", ()), ["n1", "n1", "n2"], PROGRAM,
                                "/j/ro/ranks.hosts")
    assert argv == ["env", "SLURM_HOSTFILE=/j/ro/ranks.hosts", "srun", "--mpi=pmix", "-n", "3",
                    "-N", "2", "--nodelist=n1,n1,n2", "--distribution=arbitrary", *PROGRAM]
    assert nodes.ranks_text(["n1", "n1", "n2"]) == "n1\nn1\nn2\n"
    own = nodes.launch_command(Launcher("srun", "srun", ("--mpi=pmi2",)), ["n1"], PROGRAM, "f")
    assert "--mpi=pmix" not in own and "--mpi=pmi2" in own


def test_ranks_a_batch_systems_daemons_start_find_the_mpi_library(monkeypatch):
    """srun's and flux run's ranks are started by slurmd and the Flux broker, not by mpirun
    (which puts its own library folder on its ranks' path): the MPI's library folder goes
    first on their LD_LIBRARY_PATH, before the caller's."""
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/x")
    argv = nodes.launch_command(Launcher("srun", "srun", ()), ["n1"], PROGRAM, "f",
                                libdirs=["/venv/lib"])
    assert argv[:3] == ["env", "SLURM_HOSTFILE=f", "LD_LIBRARY_PATH=/venv/lib:/usr/local/x"]
    argv = nodes.launch_command(Launcher("flux", "flux", ()), ["f1"], PROGRAM, "f",
                                libdirs=["/venv/lib"])
    assert argv[:4] == ["env", "LD_LIBRARY_PATH=/venv/lib:/usr/local/x", "flux", "run"]
    monkeypatch.delenv("LD_LIBRARY_PATH")
    argv = nodes.launch_command(Launcher("srun", "srun", ()), ["n1"], PROGRAM, "f",
                                libdirs=["/venv/lib"])
    assert "LD_LIBRARY_PATH=/venv/lib" in argv


def test_flux_run_maps_ranks_to_hosts_through_its_hostfile_taskmap():
    argv = nodes.launch_command(Launcher("flux", "flux", ()), ["f1", "f2"], PROGRAM,
                                "/j/ro/ranks.hosts")
    assert argv == ["flux", "run", "-o", "pmi=pmix", "-n", "2", "-N", "2",
                    "--requires=host:f1,f2", "--taskmap=hostfile:/j/ro/ranks.hosts", *PROGRAM]


AGENT = ["python", "-m", "commbench_rank.agent", "/j/ro/agent.json"]


def test_the_agent_step_starts_one_agent_per_node_with_the_launchers_own_options():
    argv = nodes.agent_command(Launcher("mpirun", None, ("--bind-to", "none")), ["h1", "h2"],
                               AGENT, "/j/ro/agents.hosts", mpiexec="/venv/bin/mpiexec",
                               output=("--output", ":raw"))
    assert argv == ["/venv/bin/mpiexec", "--output", ":raw", "--bind-to", "none", "-n", "2",
                    "--host", "h1:1,h2:1", "--map-by", "slot", *AGENT]
    mpich = nodes.agent_command(Launcher("mpirun"), ["a", "b"], AGENT, "f", mpiexec="m",
                                flavour="mpich")
    assert mpich == ["m", "-n", "2", "-hosts", "a:1,b:1", *AGENT]
    # srun: a step beside the ranks' (--overlap), one task a node, no PMI (no MPI program)
    srun = nodes.agent_command(Launcher("srun", "srun", ("--mpi=pmix", "-p", "gpu")),
                               ["n1", "n2"], AGENT, "f")
    assert srun == ["srun", "-p", "gpu", "--overlap", "--mpi=none", "-n", "2", "-N", "2",
                    "--ntasks-per-node=1", "--nodelist=n1,n2", *AGENT]
    flux = nodes.agent_command(Launcher("flux", "flux", ()), ["f1", "f2"], AGENT, "/j/h")
    assert flux == ["flux", "run", "-n", "2", "-N", "2", "--tasks-per-node=1",
                    "--requires=host:f1,f2", "--taskmap=hostfile:/j/h", *AGENT]


def test_a_platform_with_a_placement_launches_through_it_and_writes_the_ranks_file(tmp_path):
    platform = make("cpu")
    job = tmp_path / "ro" / "job.json"
    job.parent.mkdir()
    assert platform.launch_argv(2, job)[2:4] == ["2", "--oversubscribe"]  # as ever
    platform.node_placement = Placement((Node("n1"), Node("n2")),
                                        nodes.parse_launcher("srun"), 1, "test", "n1")
    argv = platform.launch_argv(2, job, nodes=["n1", "n2"])
    assert argv[:2] == ["env", f"SLURM_HOSTFILE={job.parent / 'ranks.hosts'}"]
    # the MPI's library folder for the ranks slurmd starts (here: the one mpi4py loads)
    assert argv[2].startswith("LD_LIBRARY_PATH=") and argv[3] == "srun"
    assert argv[-4:] == [sys.executable, "-m", "commbench_rank", str(job)]
    assert (job.parent / "ranks.hosts").read_text() == "n1\nn2\n"


# -- where the ranks landed ------------------------------------------------------------------

def test_ranks_that_landed_where_asked_are_fine():
    assert nodes.misplaced(["h1", "h2"], ["h1", "h2"], here="x") is None
    assert nodes.misplaced(["node1.cluster", "node2"], ["NODE1", "node2.cluster"]) is None
    assert nodes.misplaced(["localhost", "localhost"], ["box", "box"], here="box") is None
    assert nodes.misplaced(["h1", "h2"], ["h1", None], here="x") is None  # not said: unknown


def test_ranks_that_landed_elsewhere_say_where():
    said = nodes.misplaced(["h1", "h2"], ["h1", "h1"], here="x")
    assert said and "ran on h1: ranks 0-1" in said and "asked: h1: rank 0; h2: rank 1" in said
    # addresses are held to their peers: asked apart, they must land apart
    assert nodes.misplaced(["h1", "10.0.0.2"], ["h1", "h1"], here="x")
    assert nodes.misplaced(["10.0.0.1", "10.0.0.2"], ["h1", "h2"], here="x") is None
    assert nodes.misplaced(["10.0.0.1", "10.0.0.1"], ["h1", "h2"], here="x")


# -- the manifest ----------------------------------------------------------------------------

def _manifest(tmp_path: Path, extra: str) -> Path:
    src = REPO / "suites" / "p2p" / "pingpong"
    task = tmp_path / "suites" / "p2p" / "t"
    task.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file():
            (task / f.name).write_bytes(f.read_bytes())
    lines = [ln for ln in (task / "task.toml").read_text().splitlines()
             if not ln.startswith("nodes")]
    (task / "task.toml").write_text("\n".join([*extra.splitlines(), *lines]) + "\n")
    return task / "task.toml"


def test_a_task_says_whether_its_ranks_may_span_nodes_and_is_marked_so(tmp_path):
    roots = tmp_path / "suites"
    one = load_task(_manifest(tmp_path / "a", ""), tmp_path / "a" / "suites")
    assert one.nodes == "one" and not one.spans_nodes and "span_nodes" not in one.markers()
    anyn = load_task(_manifest(tmp_path / "b", 'nodes = "any"'), tmp_path / "b" / "suites")
    assert anyn.spans_nodes and "span_nodes" in anyn.markers()
    assert "span_nodes" in marker_names()
    with pytest.raises(ManifestError, match="'nodes'.*'many' is not one of one, any"):
        load_task(_manifest(tmp_path / "c", 'nodes = "many"'), roots)


def test_a_task_that_shares_memory_between_ranks_may_not_span_nodes(tmp_path):
    for i, extra in enumerate(('nodes = "any"\nrequires = ["cuda-ipc"]',
                               'nodes = "any"\nfixtures = ["ipc"]',
                               'nodes = "any"\nworkspace = 4096')):
        root = tmp_path / str(i)
        with pytest.raises(ManifestError, match="only one node has"):
            load_task(_manifest(root, extra), root / "suites")


#: what lets a task's ranks span nodes: they talk through MPI or a network library only
SPANNING_LIBRARIES = {"mpi", "nccl", "cupy", "torch", "rccl"}


def test_the_suites_mark_every_task_that_may_span_nodes_and_no_other():
    tasks, errors = load_suite(REPO / "suites")
    assert not errors
    for task in tasks:
        shares = ({*task.requires} & {"cuda-ipc", "hip-ipc", "nvlink", "nvshmem"}
                  or "ipc" in task.fixtures or task.workspace)
        expected = task.library in SPANNING_LIBRARIES and not shares
        assert task.spans_nodes == expected, task.relpath
    assert sum(t.spans_nodes for t in tasks) >= 20


# -- the options, in a run ---------------------------------------------------------------------

def test_a_launcher_the_placement_does_not_know_is_a_usage_error_naming_the_option(bench):
    bench.add_task("p2p/pingpong", ranks=2)
    result = bench.run_fake("--platform=cpu", "--commbench-launcher=torchrun --nproc 2")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--commbench-launcher: 'torchrun' is not a launcher this "
                                 "knows (mpirun, mpiexec, srun, flux)*"])
    assert not bench.records()


def test_a_sandboxed_item_whose_ranks_would_run_on_other_nodes_is_skipped_saying_why(bench):
    bench.add_task("p2p/pingpong", ranks=2)
    hostfile = bench.root / "hosts"
    hostfile.write_text("elsewhere1 slots=1\nelsewhere2 slots=1\n")
    result = bench.run_fake("--platform=cpu", "--commbench-hostfile=hosts", "-rs",
                            "--commbench-launcher=flux run")
    result.stdout.fnmatch_lines(["*its ranks would run on elsewhere1, elsewhere2, not on this "
                                 "host*flux run starts each rank through the Flux broker*"
                                 "not with flux run*--commbench-unsandboxed*"])
    (record,) = bench.records()
    assert record["verdict"] == "skipped"
    # a task that may not span nodes asks for one node alone, never another's slots
    result = bench.run_fake("--platform=cpu", "--commbench-hostfile=hosts", "-m", "span_nodes",
                       "--collect-only", "-q")
    assert "pingpong" in result.stdout.str()
