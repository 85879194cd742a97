"""The build machinery every recipe shares: the harness, never the model, turns a solution into
something to run.

Python solutions are byte-compiled here (a syntax error is `compile_error`) and the names the
code uses (from its syntax tree: loads, attributes, imports, string constants) are checked
against the task's `forbid` patterns (`forbidden`). Native recipes live with their vendor
(`toolchains.nvidia`: nvcc, CUDA and HIP through the HIP->CUDA header; `toolchains.amd`:
HIP with ROCm's or Debian's clang) and build on what is here: build keys (`digest`), the
cached build folder (`_built`), the compile jail (`jailed`), the compiler run and its log
(`_compile`), the symbols a library links (`linked_names`) and what every native build
forbids (`native_forbid`). Results are cached by the hash of the source and the recipe.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import NamedTuple

from .tasks import Task
from .verdicts import Rejected, Verdict

RECIPE_VERSION = "py-2"
# No task needs processes of its own beyond the job's ranks: MPI's dynamic processes would run
# code outside the guard (helpers that do a forbidden collective for the ranks). Forbidden in
# every task, by name in Python sources and at run time (the interposer's families).
ALWAYS_FORBIDDEN_PY = ("Spawn*", "Comm_spawn*", "Open_port", "Publish_name", "Lookup_name")
ALWAYS_FORBIDDEN_C = ("Comm_spawn*", "Comm_connect", "Comm_accept", "Comm_join", "Open_port",
                      "Publish_name", "Lookup_name")


@dataclass(frozen=True)
class Artifact:
    path: Path  # what the ranks load
    digest: str


def digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def used_names(tree: ast.AST) -> set[str]:
    """Every name the code uses (loaded names, attributes, imports, keyword arguments) and every
    string constant (so getattr(comm, "Allreduce") counts); names it defines do not count."""
    names: set[str] = set()
    docstrings = {id(n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.update(node.name.split("."))
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update(node.module.split("."))
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings):  # docstrings and bare strings do nothing
            names.add(node.value)
    return names


# Groups a manifest's `forbid` may name instead of listing members (a list that forgets one
# collective is a hole): every MPI collective, blocking, nonblocking, persistent and
# neighbourhood; every one-sided (RMA) operation.
GROUPS = {
    "@mpi-collectives": (
        "Allgather*", "allgather", "Iallgather*", "Allreduce*", "allreduce", "Iallreduce*",
        "Alltoall*", "alltoall", "Ialltoall*", "Barrier*", "barrier", "Ibarrier*",
        "Bcast*", "bcast", "Ibcast*", "Exscan*", "exscan", "Iexscan*", "Gather*", "gather",
        "Igather*", "Reduce*", "reduce*", "Ireduce*", "Scan*", "scan", "Iscan*", "Scatter*",
        "scatter", "Iscatter*", "Neighbor_*", "neighbor_*", "Ineighbor_*"),
    "@mpi-rma": (
        "Win*", "Put", "Get", "Accumulate", "Get_accumulate", "Fetch_and_op",
        "Compare_and_swap", "Rput", "Rget", "Raccumulate", "Rget_accumulate"),
}


def expand_forbid(patterns) -> tuple[str, ...]:
    """A manifest's patterns with its groups (`@mpi-collectives`, ...) spelt out."""
    out: list[str] = []
    for p in patterns:
        out.extend(GROUPS.get(p, (p,)))
    return tuple(dict.fromkeys(out))


def hip_on_cuda_forbid(patterns: tuple[str, ...]) -> tuple[str, ...]:
    """A HIP task's forbid patterns as they read once the HIP->CUDA header has turned its HIP
    and RCCL names into CUDA's and NCCL's (`hipMemcpy*` forbids `cudaMemcpy*` too): the
    built solution links, and the guards see, only the CUDA names."""
    out = list(patterns)
    for p in patterns:
        for hip, cuda in (("hip", "cuda"), ("rccl", "nccl"), ("librccl", "libnccl"),
                          ("libamdhip64", "libcudart")):
            if p.startswith(hip):
                out.append(cuda + p[len(hip):])
    return tuple(dict.fromkeys(out))


def task_forbid(task: Task, on_cuda: bool) -> tuple[str, ...]:
    """The task's forbid patterns (groups spelt out) for a build or a job on a CUDA device
    (`on_cuda`) or elsewhere."""
    patterns = expand_forbid(task.forbid)
    return hip_on_cuda_forbid(patterns) if task.language == "hip" and on_cuda else patterns


def forbidden_uses(names: set[str], patterns: tuple[str, ...]) -> list[str]:
    return sorted({n for n in names for p in patterns if fnmatchcase(n, p)})


def build_python(task: Task, source: str, cache_dir: Path) -> Artifact:
    key = digest(RECIPE_VERSION, task.relpath, source)
    try:
        tree = ast.parse(source, f"{task.relpath}/solution.py")
        compile(tree, f"{task.relpath}/solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        line = getattr(exc, "lineno", None)
        raise Rejected(Verdict.COMPILE_ERROR,
                       f"the solution does not compile: {exc.__class__.__name__}: {exc}",
                       f"line {line}" if line else "") from None
    patterns = (*expand_forbid(task.forbid), *ALWAYS_FORBIDDEN_PY)
    bad = forbidden_uses(used_names(tree), patterns)
    if bad:
        raise Rejected(Verdict.FORBIDDEN,
                       f"the solution uses what this task forbids: {', '.join(bad)}",
                       f"forbidden patterns: {', '.join(patterns)}")
    folder = cache_dir / key
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "solution.py"
    if not path.exists():
        tmp = folder / f"solution.{id(source)}.tmp"
        tmp.write_text(source)
        tmp.replace(path)
    return Artifact(path, key)


# -- what the native recipes share ------------------------------------------------------------

# the project's headers (commbench.h: the harness's side of a solution), on every native
# recipe's include path
INCLUDE_DIR = Path(__file__).parent / "include"
COMPILE_TIMEOUT_S = 300
# NVLink multicast's host side, the driver's multicast objects: forbidden in every native
# build (its device side: toolchains.nvidia.DEVICE_FORBIDDEN)
MULTICAST = ("cuMulticast*",)


@functools.cache
def _headers_digest(folder: str) -> str:
    """What a folder of headers holds (names and contents), for build keys: the same headers
    give the same key wherever they lie."""
    parts = []
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            parts += [path.relative_to(folder).as_posix(), path.read_bytes().hex()]
    return digest(*parts)


def linked_names(lib: Path) -> set[str]:
    """Undefined dynamic symbols and NEEDED libraries of a built shared object."""
    names: set[str] = set()
    nm = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True,
                        text=True, timeout=60)
    for line in nm.stdout.splitlines():
        parts = line.split()
        if parts:
            names.add(parts[-1].split("@")[0])
    elf = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, timeout=60)
    names.update(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", elf.stdout))
    return names


def _built(folder: Path, name: str, source: str,
           make: Callable[[Path, Path, Path], None]) -> Path:
    """The library of a cached build folder, made by `make(source file, library, work folder)`
    where it is not there yet: in a work folder of this build's own (runs and threads sharing a
    cache build side by side, and the first to finish puts the library in place)."""
    lib = folder / "libsolution.so"
    if lib.exists():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=folder))
    try:
        src, tmp = work / name, work / "libsolution.so"
        src.write_text(source)
        make(src, tmp, work)
        tmp.replace(lib)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return lib


class Jail(NamedTuple):
    """How the compilers of the current build are confined."""

    wrap: Callable[[list[str], Path], list[str]]  # (command, work folder) -> sandboxed command
    setup_failed: int  # the sandbox's exit code where it could not be built
    limit_exit: int  # its exit code where the build went past a limit


_JAIL: ContextVar[Jail | None] = ContextVar("commbench_compile_jail", default=None)


@contextmanager
def jailed(jail: Jail | None) -> Iterator[None]:
    """Builds made inside run their compilers through `jail` (None: as they are). A model's
    answer is compiled so: a compiler reads any file its source names (`#include`, `.incbin`,
    `#embed`), so it must not see the references, the build cache or other items' files."""
    token = _JAIL.set(jail)
    try:
        yield
    finally:
        _JAIL.reset(token)


def paths_named(cmd: list[str], inside: Path) -> list[str]:
    """The absolute paths a recipe's command names (include and library folders, device
    libraries, an rpath), less those in `inside` (the build's own folder): what a jailed
    compiler must see besides the system."""
    found = []
    for arg in cmd:
        for path in re.findall(r"(/[^\s,=:]+)", arg):
            if not (path == str(inside) or path.startswith(str(inside) + "/")) \
                    and os.path.exists(path):
                found.append(path if os.path.isdir(path) else os.path.dirname(path))
    return list(dict.fromkeys(found))


COMPILER_LOG = ".compiler.log"  # a build's compiler output, in its own folder
LOG_HEAD, LOG_TAIL = 64 << 10, 6000  # what of it is read: a first error line, the last words


def _compiler_output(log: Path) -> tuple[str, str]:
    """(the head, the tail) of a compiler's output, read from its file: however much a source
    makes a compiler print, the controller reads a bounded part of it."""
    try:
        with open(log, "rb") as f:
            head = f.read(LOG_HEAD)
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - LOG_TAIL))
            tail = f.read(LOG_TAIL)
    except OSError:
        return "", ""
    return head.decode(errors="replace").strip(), tail.decode(errors="replace").strip()


def _run_compiler(argv: list[str], out, work: Path) -> int:
    """A compiler as a job: a session of its own that dies with this process (the parent's
    death signal: kill -9 of pytest or of an xdist worker ends the jail's PID namespace and
    every compiler in it), listed among the live jobs the stop handler ends (SIGTERM,
    SIGHUP), killed with its session on Ctrl-C or past its limit."""
    from types import SimpleNamespace

    from .launch import LIVE, die_with_parent, kill_session

    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                            stderr=subprocess.STDOUT, cwd=work, start_new_session=True,
                            preexec_fn=functools.partial(die_with_parent, os.getpid()))
    LIVE[proc.pid] = SimpleNamespace(proc=proc)
    try:
        return proc.wait(timeout=COMPILE_TIMEOUT_S)
    except BaseException:  # past its limit, or this process interrupted: the build goes too
        kill_session(proc.pid, grace=1.0)
        proc.wait()
        raise
    finally:
        LIVE.pop(proc.pid, None)


def _compile(cmd: list[str], work: Path) -> None:
    """Run a compiler in `work` (jailed where a build is, see `jailed`), its output into a
    file there; its failure as the verdict it is (the solution's compile error, or the
    machine's missing compiler or sandbox)."""
    jail = _JAIL.get()
    argv = jail.wrap(cmd, work) if jail is not None else cmd
    log = Path(work) / COMPILER_LOG
    try:
        with open(log, "wb") as out:
            returncode = _run_compiler(argv, out, work)
    except subprocess.TimeoutExpired:
        raise Rejected(Verdict.COMPILE_ERROR,
                       f"the compiler ran past {COMPILE_TIMEOUT_S} s") from None
    except FileNotFoundError as exc:
        raise Rejected(Verdict.INFRA_ERROR, f"no compiler: {exc}") from None
    done = subprocess.CompletedProcess(argv, returncode)
    head, tail = _compiler_output(log)
    log.unlink(missing_ok=True)
    if jail is not None and done.returncode == jail.setup_failed:
        raise Rejected(Verdict.INFRA_ERROR,
                       "the compiler's sandbox could not be set up: " + tail[-500:])
    if jail is not None and done.returncode == jail.limit_exit:
        raise Rejected(Verdict.COMPILE_ERROR,
                       "the compiler went past the build's limits: " + tail[-500:])
    if done.returncode != 0:
        first = next((x for x in head.splitlines() if "error" in x), head[:200])
        raise Rejected(Verdict.COMPILE_ERROR, f"the solution does not compile: {first}", tail)


# Ways around a symbol check that no task needs: loading a library or looking a function up
# at run time (a forbidden function is then never named), and the run-time guard's own entry.
LOOKUPS = ("dlopen", "dlmopen", "dlsym", "dlvsym", "__libc_dl*", "_dl_*",
           "cuGetProcAddress*", "cudaGetDriverEntryPoint*", "cudaGetDriverEntryPointByVersion*")


def native_forbid(patterns: tuple[str, ...]) -> tuple[str, ...]:
    """A task's forbid patterns for a native build: where it forbids anything, the run-time
    look-ups too (the guard's entry point always)."""
    extra = LOOKUPS if patterns else ()
    # CUPTI is the run-time guard's own instrument: a solution that could reach it could
    # switch the guard off (the guard also checks, after the calls, that it is still on);
    # the Python C API would reach the harness's own Python (its mpi4py, its modules)
    return tuple(dict.fromkeys((*patterns, *extra, *(f"MPI_{p}" for p in ALWAYS_FORBIDDEN_C),
                                "commbench_guard_*", "cupti*", "libcupti*", "Py*", "_Py*",
                                *MULTICAST)))
