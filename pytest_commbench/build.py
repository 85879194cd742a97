"""Hidden build recipes: the harness, never the model, turns a solution into something to run.

Python solutions are byte-compiled (a syntax error is `compile_error`) and the names the code
uses (from its syntax tree: loads, attributes, imports, string constants) are checked against the task's `forbid` patterns (`forbidden`). Results are cached by
the hash of the source and the recipe.
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




# -- CUDA C++ -----------------------------------------------------------------------------

CUDA_RECIPE_VERSION = "cu-2"
INCLUDE_DIR = Path(__file__).parent / "include"
# HIP on an NVIDIA GPU (platform h200-hip): the project's HIP->CUDA header, first on nvcc's
# include path; and, for AMD builds on a machine without RCCL's headers, declarations of the
# part of RCCL's API the tasks use (the library itself is then resolved where the task runs)
HIP_ON_CUDA_DIR = INCLUDE_DIR / "hip_on_cuda"
RCCL_DECLARATIONS_DIR = INCLUDE_DIR / "rccl_declarations"
COMPILE_TIMEOUT_S = 300
# NVLink multicast instructions: never allowed on these machines (a fault in them can take a
# shared GPU out of service); found in the device code the compiler generated, so no spelling
# of the source (macros, string concatenation in asm, a library header's template) hides them
DEVICE_FORBIDDEN = ("multimem.",)
DEVICE_FINDINGS = "device-forbidden.txt"  # beside a cached build: what its device code used
# ... and its host side: the driver's multicast objects, forbidden in every native build
MULTICAST = ("cuMulticast*",)
THUNDERKITTENS_ENV = "COMMBENCH_THUNDERKITTENS"


@functools.cache
def _headers_digest(folder: str) -> str:
    """What a folder of headers holds (names and contents), for build keys: the same headers
    give the same key wherever they lie."""
    parts = []
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            parts += [path.relative_to(folder).as_posix(), path.read_bytes().hex()]
    return digest(*parts)


def uses_thunderkittens(task: Task) -> bool:
    return "thunderkittens" in {task.library, *task.requires}


def thunderkittens_include() -> Path | None:
    """The ThunderKittens headers (`kittens.cuh`) named by COMMBENCH_THUNDERKITTENS (the
    repository's root or its include/ folder; --commbench-thunderkittens sets it), or None."""
    root = os.environ.get(THUNDERKITTENS_ENV)
    if not root:
        return None
    for folder in (Path(root) / "include", Path(root)):
        if (folder / "kittens.cuh").is_file():
            return folder.resolve()
    return None


@dataclass(frozen=True)
class CudaLibs:
    """Where NCCL and NVSHMEM headers and libraries are: the nvidia-* Python packages first,
    then the system."""

    nccl_include: Path | None
    nccl_lib: Path | None
    nccl_version: str
    nvshmem_include: Path | None
    nvshmem_lib: Path | None
    nvshmem_version: str


def _package_dir(name: str) -> Path | None:
    try:
        import importlib.util

        spec = importlib.util.find_spec(f"nvidia.{name}")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _define(header: Path, names: list[str]) -> str:
    try:
        text = header.read_text(errors="replace")
    except OSError:
        return "unknown"
    parts = []
    for n in names:
        m = re.search(rf"#define\s+{n}\s+(\d+)", text)
        parts.append(m.group(1) if m else "?")
    return ".".join(parts)


@functools.lru_cache(maxsize=1)
def find_cuda_libs() -> CudaLibs:
    nccl = _package_dir("nccl")
    nccl_inc = nccl / "include" if nccl and (nccl / "include" / "nccl.h").exists() else None
    if nccl_inc is None and Path("/usr/include/nccl.h").exists():
        nccl_inc = Path("/usr/include")
    nccl_lib = nccl / "lib" if nccl and (nccl / "lib").is_dir() else None
    shmem = _package_dir("nvshmem")
    shmem_inc = shmem / "include" if shmem and (shmem / "include").is_dir() else None
    shmem_lib = shmem / "lib" if shmem and (shmem / "lib").is_dir() else None
    return CudaLibs(
        nccl_inc, nccl_lib,
        _define(nccl_inc / "nccl.h", ["NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"]) if nccl_inc else "none",
        shmem_inc, shmem_lib,
        _define(shmem_inc / "non_abi" / "nvshmem_version.h",
                ["NVSHMEM_VENDOR_MAJOR_VERSION", "NVSHMEM_VENDOR_MINOR_VERSION",
                 "NVSHMEM_VENDOR_PATCH_VERSION"]) if shmem_inc else "none",
    )


@functools.lru_cache(maxsize=1)
def cuda_runtime_dir() -> Path | None:
    """The folder of libcudart.so of the nvcc in use (for the solution's rpath)."""
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]))
    nvcc = shutil.which(os.environ.get("COMMBENCH_NVCC", "nvcc"))
    if nvcc:
        real = Path(nvcc).resolve()
        try:  # a wrapper script: `exec /usr/local/cuda-X/bin/nvcc "$@"`
            m = re.search(r"exec\s+(\S+/bin/nvcc)", real.read_text(errors="ignore")[:4096])
            if m:
                real = Path(m.group(1)).resolve()
        except OSError:
            pass
        candidates.append(real.parent.parent)
    candidates += [Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"))]
    for home in candidates:
        for sub in ("lib64", "targets/x86_64-linux/lib", "lib"):
            if (home / sub / "libcudart.so").exists() or any((home / sub).glob("libcudart.so.*")):
                return home / sub
    return None


@functools.cache
def driver_library(soname: str) -> Path | None:
    """A library of the NVIDIA driver (libnvidia-ml.so.1, libcuda.so.1), from the loader cache
    or the usual driver folders; None where no driver is installed (CI)."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    m = re.search(re.escape(soname) + r" \(libc6,x86-64\) => (\S+)", out)
    if m:
        return Path(m.group(1))
    for folder in ("/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"):
        if (Path(folder) / soname).exists():
            return Path(folder) / soname
    return None


def nvml_library() -> Path | None:
    """The driver's libnvidia-ml.so.1."""
    return driver_library("libnvidia-ml.so.1")


def cuda_command(task: Task, source: Path, output: Path, arch: str) -> list[str]:
    """The hidden recipe: flags, include and library paths are the harness's, never the model's.
    A HIP task is compiled as CUDA with the HIP->CUDA header first on the include path."""
    libs = find_cuda_libs()
    uses = {task.library, *task.requires}
    std = "-std=c++17"
    tk = thunderkittens_include() if "thunderkittens" in uses else None
    if tk is not None:
        # ThunderKittens: C++20, the Hopper feature set (wgmma, TMA: sm_90a), its own macros
        std = "-std=c++20"
        arch = arch + "a" if arch == "sm_90" else arch
    cmd = [os.environ.get("COMMBENCH_NVCC", "nvcc"), "-O3", std, f"-arch={arch}",
           "-Xcompiler", "-fPIC", "-shared", "-cudart", "shared", "-lineinfo"]
    if task.language == "hip":
        cmd += ["-x", "cu", "-I", str(HIP_ON_CUDA_DIR)]
        uses = uses | ({"nccl"} if "rccl" in uses else set())
    cmd += ["-I", str(INCLUDE_DIR)]
    if tk is not None:
        cmd += ["-I", str(tk), "-DKITTENS_HOPPER", "--expt-relaxed-constexpr",
                "--expt-extended-lambda"]
        # TMA descriptors are made with the driver API: the driver's own library where there
        # is one; without a driver (CI) its symbols stay unresolved in the shared object
        cuda = driver_library("libcuda.so.1")
        if cuda:
            cmd += [f"-L{cuda.parent}", f"-l:{cuda.name}"]
    if libs.nccl_include:
        cmd += ["-I", str(libs.nccl_include)]
    if libs.nvshmem_include:
        cmd += ["-I", str(libs.nvshmem_include)]
    if "nvshmem" in uses:
        cmd += ["-rdc=true"]
    cmd += ["-o", str(output), str(source)]
    if uses & {"nccl", "nccl-device"} and libs.nccl_lib:
        cmd += ["-L", str(libs.nccl_lib), "-l:libnccl.so.2", f"-Xlinker=-rpath={libs.nccl_lib}"]
    if "nvshmem" in uses and libs.nvshmem_lib:
        cmd += ["-L", str(libs.nvshmem_lib), "-l:libnvshmem_host.so.3", "-lnvshmem_device",
                f"-Xlinker=-rpath={libs.nvshmem_lib}"]
    if "nvml" in uses:
        nvml = nvml_library()
        if nvml:  # the driver's copy; without a driver (CI) the symbols stay unresolved
            cmd += [f"-L{nvml.parent}", f"-l:{nvml.name}"]
    runtime = cuda_runtime_dir()
    if runtime:
        cmd += [f"-Xlinker=-rpath={runtime}"]
    return cmd


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


def build_cuda(task: Task, source: str, cache_dir: Path, arch: str) -> Artifact:
    header = "".join(p.read_text() for p in sorted(INCLUDE_DIR.glob("*.h")))
    tk = thunderkittens_include() if uses_thunderkittens(task) else None
    if uses_thunderkittens(task) and tk is None:
        raise Rejected(Verdict.INFRA_ERROR, "the ThunderKittens headers are not here: set "
                       f"{THUNDERKITTENS_ENV} (or --commbench-thunderkittens) to their folder")
    if task.language == "hip":
        header += "".join(p.read_text() for p in sorted(HIP_ON_CUDA_DIR.rglob("*.h")))
    key = digest(CUDA_RECIPE_VERSION, arch, task.relpath, task.language, task.library,
                 *task.requires, header, _headers_digest(str(tk)) if tk else "", source)
    folder = cache_dir / key

    def make(src: Path, tmp: Path, work: Path) -> None:
        keep = work / "keep"
        keep.mkdir()
        _compile([*cuda_command(task, src, tmp, arch), "--keep", "--keep-dir", str(keep)], work)
        (folder / DEVICE_FINDINGS).write_text("\n".join(device_forbidden(keep)))

    lib = _built(folder, "solution" + (".hip" if task.language == "hip" else ".cu"), source,
                 make)
    try:
        found = (folder / DEVICE_FINDINGS).read_text().split()
    except OSError:  # a build from before the device-code check: look again
        shutil.rmtree(folder, ignore_errors=True)
        return build_cuda(task, source, cache_dir, arch)
    if found:
        raise Rejected(Verdict.FORBIDDEN,
                       f"the device code uses NVLink multicast ({', '.join(found)}), which is "
                       f"never allowed", "PTX instructions forbidden on every task: "
                       + ", ".join(DEVICE_FORBIDDEN))
    patterns = native_forbid(task_forbid(task, on_cuda=True))
    bad = forbidden_uses(linked_names(lib), patterns)
    if bad:
        raise Rejected(Verdict.FORBIDDEN,
                       f"the built solution links what this task forbids: {', '.join(bad)}",
                       f"forbidden patterns: {', '.join(patterns)}")
    return Artifact(lib, key)


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


# -- HIP (AMD GPUs) -----------------------------------------------------------------------------
# Where ROCm is installed its compiler builds (ROCM_PATH, else /opt/rocm); elsewhere Debian's
# clang-19 with Debian's ROCm 5.2 device libraries, whose ISA bitcode stops at gfx940: the
# missing `oclc_isa_version_<arch>.bc` is assembled (one constant, the ISA version) beside
# links to the others, once per build cache.
HIP_RECIPE_VERSION = "hip-1"
DEBIAN_DEVICE_LIBS = Path("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode")


def rocm_path() -> Path | None:
    for root in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        if root and (Path(root) / "bin" / "amdclang++").exists():
            return Path(root)
    return None


def isa_version(arch: str) -> int:
    """gfx942 -> 9402, gfx90a -> 9010: major * 1000 + minor * 100 + stepping (hex digits)."""
    digits = arch[3:]
    return int(digits[:-2]) * 1000 + int(digits[-2], 16) * 100 + int(digits[-1], 16)


def hip_device_libs(arch: str, cache_dir: Path) -> Path:
    """A folder of Debian's device-library bitcode with the ISA file of `arch` (assembled with
    llvm-as-19 where Debian lacks it)."""
    folder = Path(cache_dir) / f"hip-device-libs-{arch}"
    isa = folder / f"oclc_isa_version_{arch[3:]}.bc"
    if isa.exists():
        return folder
    if not DEBIAN_DEVICE_LIBS.is_dir():
        raise Rejected(Verdict.INFRA_ERROR, "no HIP device libraries: install ROCm, or Debian's "
                       "rocm-device-libs with clang-19, clang-tools-19, lld-19, llvm-19 and "
                       "libamdhip64-dev")
    work = Path(tempfile.mkdtemp(prefix=".libs-", dir=cache_dir))
    try:
        for bc in DEBIAN_DEVICE_LIBS.glob("*.bc"):
            (work / bc.name).symlink_to(bc)
        if not (work / isa.name).exists():
            layout = subprocess.run(
                ["clang-19", "-target", "amdgcn-amd-amdhsa", "-nogpulib", "-x", "c", "-S",
                 "-emit-llvm", "-o", "-", "/dev/null"], capture_output=True, text=True,
                timeout=60).stdout
            line = next((x for x in layout.splitlines() if x.startswith("target datalayout")), "")
            (work / "isa.ll").write_text(
                f'{line}\ntarget triple = "amdgcn-amd-amdhsa"\n'
                f"@__oclc_ISA_version = linkonce_odr protected local_unnamed_addr addrspace(4) "
                f"constant i32 {isa_version(arch)}, align 4\n")
            _compile(["llvm-as-19", "isa.ll", "-o", isa.name], work)
            (work / "isa.ll").unlink()
        try:
            work.rename(folder)
        except OSError:  # another build put it in place first
            pass
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def hip_command(task: Task, source: Path, output: Path, arch: str, cache_dir: Path) -> list[str]:
    rocm = rocm_path()
    if rocm is not None:
        cmd = [str(rocm / "bin" / "amdclang++"), "-x", "hip", f"--offload-arch={arch}",
               f"--rocm-path={rocm}"]
    else:
        cmd = ["clang++-19", "-x", "hip", f"--offload-arch={arch}", "--rocm-path=/usr",
               f"--rocm-device-lib-path={hip_device_libs(arch, cache_dir)}"]
    cmd += ["-O3", "-std=c++17", "-fPIC", "-shared", "-I", str(INCLUDE_DIR)]
    if "rccl" in {task.library, *task.requires}:
        found = rccl_library(rocm)
        if found is None:  # build here, resolve RCCL where the task runs
            cmd += ["-I", str(RCCL_DECLARATIONS_DIR)]
        cmd += ["-o", str(output), str(source), "-lamdhip64"]
        if found is not None:
            cmd += [f"-L{found.parent}", "-lrccl", f"-Wl,-rpath,{found.parent}"]
        return cmd
    return [*cmd, "-o", str(output), str(source), "-lamdhip64"]


def rccl_library(rocm: Path | None) -> Path | None:
    """RCCL's library where its headers are installed too (ROCm's, else a distribution's)."""
    for root in ([rocm] if rocm else []) + [Path("/usr")]:
        if not (root / "include" / "rccl" / "rccl.h").exists():
            continue
        for lib in ("lib", "lib64", "lib/x86_64-linux-gnu"):
            if (root / lib / "librccl.so").exists():
                return root / lib / "librccl.so"
    return None


def build_hip(task: Task, source: str, cache_dir: Path, arch: str) -> Artifact:
    """A HIP solution as a shared object with a code object for `arch` (the harness's recipe);
    cached by everything that goes into it, forbidden symbols checked as for CUDA."""
    header = "".join(p.read_text() for p in sorted(INCLUDE_DIR.glob("*.h")))
    key = digest(HIP_RECIPE_VERSION, arch, "rocm" if rocm_path() else "debian", task.relpath,
                 task.library, *task.requires, header, source)
    def make(src: Path, tmp: Path, work: Path) -> None:
        _compile(hip_command(task, src, tmp, arch, Path(cache_dir)), work)
        data = tmp.read_bytes()  # (a solution of host code only, as an RCCL call, has none)
        if b"amdgcn-amd-amdhsa--" in data and f"amdgcn-amd-amdhsa--{arch}".encode() not in data:
            raise Rejected(Verdict.INFRA_ERROR, f"the build has no {arch} code object")

    lib = _built(Path(cache_dir) / key, "solution.hip", source, make)
    bad = forbidden_uses(linked_names(lib), native_forbid(task_forbid(task, on_cuda=False)))
    if bad:
        raise Rejected(Verdict.FORBIDDEN,
                       f"the built solution links what this task forbids: {', '.join(bad)}")
    return Artifact(lib, key)


def device_forbidden(keep: Path) -> list[str]:
    """The DEVICE_FORBIDDEN instructions in the PTX the compiler generated (its kept files)."""
    found = set()
    for ptx in keep.glob("*.ptx"):
        text = ptx.read_text(errors="replace")
        found.update(op for op in DEVICE_FORBIDDEN if op in text)
    return sorted(found)


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
