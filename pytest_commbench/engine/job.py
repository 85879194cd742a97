"""Running one job: its folder staged (its own copy of the rank code and of the built
solution, its guards), its ranks launched (in their sandbox), every case of the plan driven
by the observer, and the outcome judged with who is to blame for a failure."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path

import numpy as np

from .. import build, cluster, cupti_guard, interposer, jobfiles, nodes, observer, sandbox
from ..build import ALWAYS_FORBIDDEN_C, native_forbid, task_forbid
from ..launch import SINGLE_NODE_BTL, Job, JobResult, find_mpiexec, mpi_env
from ..rank import protocol
from ..settings import Settings
from ..tasks import Task
from ..verdicts import Verdict
from .blame import blame, killed_outside
from .plan import Outcome, Plan

MAX_MESSAGES = 5  # a wrong answer's messages kept in its outcome
END_GRACE_S = 30.0  # seconds the ranks have to end after their last call

RANK_CODE = Path(__file__).parent.parent / "rank"


def stage(job_dir: Path, artifact: Path) -> tuple[Path, Path]:
    """The job's read-only part: its own copy of the rank code and of the built solution
    (the package and the build cache are not visible in the sandbox)."""
    code = job_dir / "ro" / "code" / "commbench_rank"
    code.mkdir(parents=True)
    for src in RANK_CODE.glob("*.py"):
        shutil.copyfile(src, code / src.name)
    solution = job_dir / "ro" / artifact.name
    shutil.copyfile(artifact, solution)
    return code.parent, solution


def hidden(settings: Settings) -> list[Path]:
    """What a job must not see: the references and the project around them, the build
    cache, every item's and run's files (the job's own folder is brought back)."""
    trees = [settings.references, settings.references.parent, settings.cache,
             settings.work.parent, *settings.hide]
    return [t for t in trees if t and Path(t).resolve() != Path("/")]


#: what of the controller's environment a jailed compiler gets (its toolkit's, the locale)
COMPILE_ENV = ("PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", *sandbox.PREFIX_VARS)
COMPILE_ENV_PREFIXES = ("CUDA", "NVCC", "COMMBENCH_NVCC", "HIP", "ROCM", "HSA")
#: the memory each process of a jailed build may take (RLIMIT_DATA): a source can make a
#: compiler read an endless file (`#include "/dev/zero"`) or instantiate without end
COMPILE_DATA_BYTES = 8 << 30


def compile_jail(settings: Settings) -> build.Jail | None:
    """The sandbox an answer's compilers run in (`build.jailed`): a job's view of the machine
    (the references, the project, the build cache and every item's files hidden), the
    build's own folder its only writable place, and besides the system only the folders the
    recipe's command names. None where jobs run without a sandbox."""
    if settings.unsandboxed:
        return None
    hide = hidden(settings)

    def wrap(cmd: list[str], work: Path) -> list[str]:
        env = {k: v for k, v in os.environ.items()
               if k in COMPILE_ENV or k.startswith(COMPILE_ENV_PREFIXES)}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        (work / "ro").mkdir(exist_ok=True)  # a job folder's read-only part (empty here)
        limits = {"data_bytes": min(COMPILE_DATA_BYTES, sandbox.memory_bytes() // 2)}
        return sandbox.wrap(work, cmd, env, hide=hide, limits=limits,
                            also_keep=build.paths_named(cmd, work))

    return build.Jail(wrap, sandbox.SETUP_FAILED, sandbox.LIMIT_EXIT)


def interposer_for(task: Task, settings: Settings, on_cuda: bool = True) -> Path | None:
    """The preloaded library that ends a rank calling what the task forbids (None where the
    task forbids nothing or the machine cannot build it); `on_cuda`: the job runs on a CUDA
    device (a HIP task's HIP names are then CUDA's)."""
    uses = {task.library, *task.requires}
    nccl = bool(uses & {"nccl", "nccl-device"}) or ("rccl" in uses and on_cuda)
    libs = interposer.default_libraries(find_mpiexec(), nccl=nccl, nvshmem="nvshmem" in uses)
    patterns = tuple(dict.fromkeys((*task_forbid(task, on_cuda), *ALWAYS_FORBIDDEN_C)))
    # a compiled solution cannot call mpi4py (the Python C API is forbidden to it): MPI calls
    # from mpi4py's extension are the harness's own (its host helpers, its own set-up)
    trusted = interposer.mpi4py_folders() if task.language in ("cuda", "hip") else ()
    return interposer.build_interposer(patterns, libs, settings.cache / "guard", trusted)


def cupti_guard_for(task: Task, settings: Settings) -> Path | None:
    """The library each rank of a CUDA task arms before loading the solution: a CUDA runtime
    or driver function the task forbids, called from the solution's code however its address
    was found, ends the rank (None where the task forbids none or CUPTI is missing)."""
    if task.language not in ("cuda", "hip") or not task.forbid:
        return None
    patterns = native_forbid(task_forbid(task, on_cuda=True))
    return cupti_guard.build_cupti_guard(
        patterns, settings.cache / "cupti",
        trusted=cupti_guard.trusted_for({task.library, *task.requires}))


def job_seed(seed: int, job_dir: Path) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{job_dir.name}".encode()).digest()[:8],
                          "little")


def sanitizer_findings(out: Path, world: int, tool: str) -> tuple[str, str] | None:
    """(message, detail) of the first rank whose memory checker reported an error: the
    report's first lines and the rank's count; None where every rank's summary says 0. The
    logs lie in the job's folder: read as any file a job wrote (jobfiles: no link, no FIFO,
    bounded, so a flood of reports costs nothing)."""
    for rank in range(world):
        data = jobfiles.read(out.parent, f"{out.name}/{protocol.SANITIZER_LOG.format(rank=rank)}",
                             1 << 20)
        if data is None:
            continue
        text = data.decode("utf-8", "replace")
        m = re.search(r"ERROR SUMMARY: (\d+) errors?", text)
        if not m or int(m.group(1)) == 0:
            continue
        lines = [ln.removeprefix("=========").rstrip() for ln in text.splitlines()
                 if ln.startswith("=========") and "COMPUTE-SANITIZER" not in ln]
        first: list[str] = []
        for ln in lines:
            if not ln.strip():
                if first:
                    break
                continue
            first.append(ln.strip())
        return (f"compute-sanitizer {tool} found {m.group(1)} error(s) on rank {rank}: "
                f"{first[0] if first else 'see detail'}", "\n".join(first[1:12]))
    return None


def run_job(plan: Plan, artifact: Path, job_dir: Path, timed: bool,
            trials: bool = True, sanitize: str | None = None) -> Outcome:
    """The job runner: one job of ranks running every case of the plan (see `JobRunner`)."""
    # ranks on several nodes: through a node agent on each node (cluster.py), which draws its
    # ranks' inputs from their recipes (rank/draws.py: no input crosses the network)
    spanning = nodes.spans(plan.nodes)
    name = cluster.job_name(job_dir) if spanning else None
    out, code, job_file = write_job(plan, artifact, job_dir, trials, sanitize, name)
    env = job_env(plan, job_dir, out, code, sanitize)
    argv = job_argv(plan, job_dir, job_file, env, out, sanitize)
    outcome = Outcome(Verdict.PASS)
    failure: Exception | None = None
    misplaced: str | None = None  # where the ranks landed, where not where they were asked
    began = time.monotonic()
    obs = job_observer(plan, job_dir, timed, trials, sanitize, name)
    job: Job | None = None
    agents: Job | None = None
    try:
        if spanning:
            agents = start_agents(plan, job_dir, code, obs.rk)
        job = Job(argv, job_dir, plan.deadline, env=env)
        obs.connect(job)
        sandbox.ranks_up(job.proc, argv)  # a broker of remote starts starts no more
        connected = time.monotonic()
        misplaced = nodes.misplaced(plan.nodes, obs.hosts) if plan.nodes else None
        if misplaced:  # the launcher's doing, whatever the ranks did since
            raise observer.JobEnded(Verdict.INFRA_ERROR, misplaced)
        _run_cases(plan, obs, job, outcome, (began, connected))
    except observer.WrongAnswer as exc:
        _wrong_answer(outcome, exc)
    except observer.JobEnded as exc:
        _job_ended(outcome, exc, plan.nodes)
    except Exception as exc:  # judged below, once every rank's last words are read
        failure = exc
    finally:
        result = _end_job(plan, obs, job, out, agents)
    # an agent that ended is a fact outside the solution's reach, whatever the ranks said
    outside = misplaced or getattr(obs.rk, "broken", None)
    _judge_ending(outcome, failure, obs.loaded, result, plan.deadline, outside)
    if spanning and getattr(obs.rk, "broken", None):  # what the agents said of their end
        outcome.detail = "\n".join(filter(None, [outcome.detail, _agents_said(job_dir)]))
    outcome.output, outcome.seconds = result.output, result.seconds
    outcome.batches = obs.batches
    outcome.hosts = list(obs.hosts)
    if spanning:
        outcome.clock_skew_us = obs.rk.clock_skew_us()
    return _with_evidence(outcome, result, out, plan, obs.loaded, sanitize)


def write_job(plan: Plan, artifact: Path, job_dir: Path, trials: bool,
              sanitize: str | None, agent_name: str | None = None) -> tuple[Path, Path, Path]:
    """A fresh job folder: the solution staged, the job's spec written for its ranks; its
    outputs' folder, the code folder and the job file. `agent_name`: a job over several
    nodes, its ranks served by node agents (their node-local socket named after it)."""
    task, platform, settings = plan.task, plan.platform, plan.settings
    if job_dir.exists():
        shutil.rmtree(job_dir)
    out, scratch = job_dir / "out", job_dir / "scratch"
    out.mkdir(parents=True)
    scratch.mkdir()
    code, solution = stage(job_dir, artifact)
    libs = platform.nccl_lib()
    spec = protocol.JobSpec(
        solution=str(solution), entry=task.entry, language=task.language,
        fixtures=list(task.fixtures), workspace_bytes=task.workspace, backend=platform.backend,
        out=str(out), scratch=str(scratch), job_dir=str(job_dir.resolve()), nccl_lib=libs,
        deadline_s=plan.deadline, ranks_per_gpu=platform.ranks_per_gpu,
        spans_nodes=nodes.spans(plan.nodes),
        agent_socket=cluster.agent_socket(job_dir) if agent_name else None,
        stress=trials and settings.stress > 1 and not sanitize,
        cases=[{"id": c.id, "args": c.args, "params": c.params} for c in plan.cases])
    job_file = job_dir / "ro" / protocol.JOB_FILE
    job_file.write_text(spec.to_json())
    return out, code, job_file


def job_env(plan: Plan, job_dir: Path, out: Path, code: Path,
            sanitize: str | None) -> dict[str, str]:
    """The ranks' environment: MPI's, the platform's, the lease's, and the guards each rank
    loads (the MPI interposer, the CUDA run-time guard), copied into the job's folder."""
    task, platform, settings = plan.task, plan.platform, plan.settings
    scratch = job_dir / "scratch"
    env = {**mpi_env(), **platform.env(), **plan.lease_env, "PYTHONPATH": str(code),
           protocol.ENV_GUARD_REPORT: str(out / protocol.GUARD_REPORT), "TMPDIR": "/tmp",
           # compile caches of the job's own (a shared one could carry a solution's kernels
           # into the reference's jobs); the rest of the filesystem is read-only
           "CUPY_CACHE_DIR": str(scratch / ".cupy"), "CUDA_CACHE_PATH": str(scratch / ".nv")}
    on_cuda = platform.cuda_api
    preload = interposer_for(task, settings, on_cuda)
    if preload is not None:
        staged = job_dir / "ro" / preload.name
        shutil.copyfile(preload, staged)
        env["LD_PRELOAD"] = ":".join(p for p in (str(staged), env.get("LD_PRELOAD")) if p)
    # the memory checker's job runs without the CUDA run-time guard (both sit on CUPTI, and
    # the checker refuses a second subscriber): it can only add a failure to an answer whose
    # guarded check job passed, never pass what the guard would stop
    watch = cupti_guard_for(task, settings) if on_cuda and not sanitize else None
    if watch is not None:  # loaded and armed by each rank, before the solution
        staged = job_dir / "ro" / watch.name
        shutil.copyfile(watch, staged)
        env[cupti_guard.GUARD_ENV] = str(staged)
    return env


def job_argv(plan: Plan, job_dir: Path, job_file: Path, env: dict[str, str], out: Path,
             sanitize: str | None) -> list[str]:
    """What starts the ranks: the platform's launcher (under the memory checker where asked,
    on the plan's nodes), inside the job's sandbox unless unsandboxed (srun outside, each
    rank in a sandbox of its own: `sandbox.rank_wrap`). A job over several nodes drops the
    single-node transports from `env`."""
    platform, settings = plan.platform, plan.settings
    wrap = platform.sanitizer(sanitize, out) if sanitize else None
    if sanitize and wrap is None:
        raise RuntimeError(f"platform {platform.name} has no memory checker for {sanitize}")
    placed = {"nodes": plan.nodes} if plan.nodes else {}  # each rank's node, named
    # srun's ranks are started by slurmd: each in a sandbox of its own, srun outside
    placement = platform.node_placement
    per_rank = bool(not settings.unsandboxed and plan.nodes and placement is not None
                    and placement.launcher.kind == "srun")
    if per_rank:
        wrap = [*sandbox.rank_wrap(job_dir), *(wrap or ())]
    argv = platform.launch_argv(plan.world, job_file, tuple(wrap or ()), **placed)
    if nodes.spans(plan.nodes):  # ranks on other nodes need the network's transports
        if env.get("OMPI_MCA_btl") == SINGLE_NODE_BTL:
            del env["OMPI_MCA_btl"]
        if env.get("NCCL_SOCKET_IFNAME") == "lo":  # (shared GPUs: NCCL's sockets on loopback)
            env.pop("NCCL_SOCKET_IFNAME")  # NCCL's choice, or the caller's NCCL_SOCKET_IFNAME
            if os.environ.get("NCCL_SOCKET_IFNAME"):
                env["NCCL_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"]
    if settings.unsandboxed:
        return argv
    if per_rank:  # the job's environment, the MPI's libraries first (as srun's own has them)
        assert placement is not None
        paths = [*platform.launcher_libdirs(placement.launcher),
                 env.get("LD_LIBRARY_PATH") or os.environ.get("LD_LIBRARY_PATH", "")]
        ranks_env = {**env, "LD_LIBRARY_PATH": ":".join(filter(None, paths))}
        if not ranks_env["LD_LIBRARY_PATH"]:
            del ranks_env["LD_LIBRARY_PATH"]
        sandbox.rank_plan(job_dir, ranks_env, hide=hidden(settings))
        return argv
    far = nodes.away(plan.nodes, placement.here if placement and placement.here
                     else socket.gethostname()) if plan.nodes else []
    if far:  # a sandbox on each node: mpirun's here, its daemon's on each other node
        return sandbox.wrap_over_nodes(job_dir, argv, env, hide=hidden(settings), remote=far)
    return sandbox.wrap(job_dir, argv, env, hide=hidden(settings))


def job_observer(plan: Plan, job_dir: Path, timed: bool, trials: bool,
                 sanitize: str | None, agent_name: str | None = None) -> observer.Observer:
    """The observer of the job's ranks, with the plan's timing settings and inputs drawn from
    the job's own seed; `agent_name`: a job over several nodes, its ranks reached through
    their nodes' agents (`cluster.RemoteRanks`)."""
    task, platform, settings = plan.task, plan.platform, plan.settings
    obs_settings = observer.Settings(
        reps=settings.reps, max_reps=settings.max_reps, timing_budget=settings.timing_budget,
        warmup=settings.warmup, wall_s=settings.timing_wall, rtol=task.check.rtol,
        atol=task.check.atol,
        stress=settings.stress if task.check.stress and not sanitize else 0)
    if sanitize:  # the trials only: a checked rank runs many times slower
        obs_settings = dataclasses.replace(obs_settings, reps=0, max_reps=0)
    rng = np.random.default_rng(job_seed(settings.seed, job_dir))
    # batches of calls: Python solutions on the host backend; on a GPU (a device buffer set,
    # a compiled solution's context and its IPC mappings per call) where asked for
    batch = platform.batches(task, settings.gpu_batch)
    remote = None
    if agent_name:
        def remote(obs):
            return cluster.RemoteRanks(obs, job_dir, plan.world, platform.staged, plan.nodes,
                                       agent_name)
    return observer.Observer(job_dir, plan.world, plan.op, obs_settings, rng,
                             staged=platform.staged, timed=timed, trials=trials,
                             batch=batch,
                             batches=dict(plan.batches) if plan.batches else None,
                             remote=remote)


#: seconds the node agents have to connect and prove the job's key
AGENTS_START_S = 60.0


def agent_argv(plan: Plan, agent_file: Path) -> list[str]:
    """The agent step: one node agent per node of the plan's layout, started by the job's
    launcher with the options the rank step gets (`nodes.agent_command`)."""
    from ..launch import mpi_version, output_options

    placement = plan.platform.node_placement or nodes.Placement(
        tuple(nodes.Node(n) for n in dict.fromkeys(plan.nodes)))
    flavour = "mpich" if re.search(r"HYDRA|MPICH", mpi_version(), re.I) else "openmpi"
    program = [sys.executable, "-m", "commbench_rank.agent", str(agent_file)]
    names = list(dict.fromkeys(plan.nodes))
    (agent_file.parent / "agents.hosts").write_text(nodes.ranks_text(names))
    return nodes.agent_command(placement.launcher, list(dict.fromkeys(plan.nodes)), program,
                               agent_file.parent / "agents.hosts", mpiexec=find_mpiexec(),
                               flavour=flavour, output=output_options())


def start_agents(plan: Plan, job_dir: Path, code: Path, hub: cluster.RemoteRanks) -> Job:
    """Start the agent step (outside any sandbox: the agents reach the controller and their
    node's ranks) and wait until every agent has connected and proved the job's key; the
    key travels in the step's environment alone. JobEnded (infra_error) where they do not."""
    agent_file = hub.write_spec()
    env = {**mpi_env(), "PYTHONPATH": str(code), **hub.agent_env()}
    if env.get("OMPI_MCA_btl") == SINGLE_NODE_BTL:
        del env["OMPI_MCA_btl"]
    agents = Job(agent_argv(plan, agent_file), job_dir, plan.deadline + AGENTS_START_S,
                 env=env, log=job_dir / "agents.log")
    try:
        hub.meet_agents(agents, time.monotonic() + AGENTS_START_S)
    except observer.JobEnded as exc:  # what the agents' step said, for the message's detail
        hub.close()
        ended = agents.finish()
        raise observer.JobEnded(exc.verdict, exc.message, ended.output[-3000:]) from None
    except BaseException:
        hub.close()
        agents.finish()
        raise
    return agents


def _run_cases(plan: Plan, obs: observer.Observer, job: Job, outcome: Outcome,
               started: tuple[float, float]) -> None:
    """Every case of the plan, then the ranks' clean end (a JobEnded where they do not end
    cleanly); the phases' seconds: connecting, calling, ending."""
    began, connected = started
    for index, case in enumerate(plan.cases, start=1):
        outcome.times[case.id] = obs.run_case(case)
        obs.end(index)
    called = time.monotonic()
    job.end = min(job.end, time.monotonic() + END_GRACE_S)
    job.wait()
    outcome.phases_s = (round(connected - began, 3), round(called - connected, 3),
                        round(time.monotonic() - called, 3))
    if job.alive() or job.proc.returncode != 0:
        raise observer.JobEnded(Verdict.RUNTIME_ERROR, "the ranks did not end cleanly "
                                                       "after their last call")


def _wrong_answer(outcome: Outcome, exc: observer.WrongAnswer) -> None:
    outcome.verdict = Verdict.WRONG_ANSWER
    outcome.message = exc.errors[0]
    more = exc.errors[1:MAX_MESSAGES]
    outcome.detail = "\n".join(more + ([f"... {len(exc.errors) - MAX_MESSAGES} more"]
                                       if len(exc.errors) > MAX_MESSAGES else []))


def _agents_said(job_dir: Path, limit: int = 3000) -> str:
    """The tail of the node agents' output (their step's log in the job's folder)."""
    try:
        text = (job_dir / "agents.log").read_text(errors="replace").strip()
    except OSError:
        return ""
    return f"the node agents' output (its end):\n{text[-limit:]}" if text else ""


def _job_ended(outcome: Outcome, exc: observer.JobEnded, placed: list[str] | None) -> None:
    outcome.verdict, outcome.message, outcome.detail = exc.verdict, exc.message, exc.detail
    if nodes.spans(placed) and "never reached the observer" in exc.message:
        outcome.detail = "\n".join(filter(None, [outcome.detail, (
            "the ranks were placed on nodes " + ", ".join(dict.fromkeys(placed)) +
            ": a rank on another node reaches the observer only through a filesystem "
            "the nodes share (the job's folder) on one kernel, as simulated hosts do; "
            "docs/cluster-design.md says what serves ranks on real nodes")]))


def _end_job(plan: Plan, obs: observer.Observer, job: Job | None, out: Path,
             agents: Job | None = None) -> JobResult:
    """The job ended (killed where it lingers) and every rank's last words read; its result.
    A job over several nodes: then its node agents told to stop, their step ended too."""
    try:
        obs.end(len(plan.cases))
    except observer.JobEnded:  # an agent already gone: nothing to tell it
        pass
    if job is not None:
        result = job.finish()
    else:  # the agents never all came: no rank was started
        result = JobResult(None, False, 0.0, "")
    try:
        # whether a rank began to load the solution decides who is to blame: read all
        # the ranks said before the job ended, not only what the observer had read
        obs.settle()
    finally:
        obs.close()
        if agents is not None:
            agents.end = min(agents.end, time.monotonic() + AGENTS_END_S)
            agents.wait()
            ended = agents.finish()
            if job is None:
                result = ended
        if plan.settings.unsandboxed:  # a sandbox's daemons die with it; here one may be left
            plan.platform.reap(out)
    return result


AGENTS_END_S = 5.0  # seconds the agents have to end after STOP


def _judge_ending(outcome: Outcome, failure: Exception | None, loaded: bool, result: JobResult,
                  deadline: float, misplaced: str | None) -> None:
    """Whose fault the job's end is: an observer's failure is re-raised unless a rank began
    to load the solution (then the solution's); an infrastructure error likewise."""
    if failure is not None:
        # after a rank began to load the solution, whatever made the observer fail came
        # through the solution's reach (its outputs, its messages, its processes): its fault
        if not loaded:
            raise failure
        outcome.verdict = Verdict.RUNTIME_ERROR
        outcome.message = (f"the job made the observer fail ({type(failure).__name__}: "
                           f"{str(failure)[:300]})")
    elif outcome.verdict is Verdict.INFRA_ERROR and loaded and not misplaced:
        # the observer said "not loaded yet" before it had read every rank's word: a rank
        # had begun to load the solution, so the job's end is the solution's
        outcome.verdict = Verdict.TIMEOUT if result.timed_out else Verdict.RUNTIME_ERROR
        outcome.message = (f"the job did not finish within {deadline:g} s and was killed"
                           if result.timed_out else "the job ended early")


def _with_evidence(outcome: Outcome, result: JobResult, out: Path, plan: Plan, loaded: bool,
                   sanitize: str | None) -> Outcome:
    """The memory checker's findings, which outrank however the job ended; else the blame of
    a runtime error or timeout (a kill from outside the job, the rank that failed)."""
    if sanitize and loaded:
        found = sanitizer_findings(out, plan.world, sanitize)
        if found:  # the checker's evidence outranks however the job ended
            outcome.verdict, (outcome.message, outcome.detail) = Verdict.WRONG_ANSWER, found
            return outcome
    if outcome.verdict is Verdict.RUNTIME_ERROR and not plan.settings.unsandboxed:
        killed_outside(result)
    if outcome.verdict in (Verdict.RUNTIME_ERROR, Verdict.TIMEOUT):
        blame(outcome, result, out, plan.world, loaded)
    return outcome
