"""The run-time check of a task's `forbid` list for CUDA API calls (controller side).

The interposer (interposer.py) sees calls that go through the dynamic linker, and the build
sees the names a solution links. Neither sees a CUDA function whose address the solution found
on its own: by reading libcudart's symbol table from the file on disk, by walking the loaded
image's dynamic section, by scanning memory. CUPTI's callback API does: the CUDA runtime and
driver report every call of an API entry point to the subscriber, however the caller came by
the function's address.

`build_cupti_guard` resolves the task's patterns, at build time, to the CUPTI callback ids of
the runtime and driver API functions they name (from the toolkit's `cupti_runtime_cbid.h` and
`cupti_driver_cbid.h`: `CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020` is cudaMemcpyAsync) and
compiles `rank/cupti_guard.c` over that table into `libcommbench_cupti.so`, linked against
libcupti with its absolute folder as rpath. The rank harness loads it (ctypes.CDLL of the path
in $COMMBENCH_CUPTI_GUARD) and calls `commbench_guard_cupti_arm(solution_path)` before it
loads the solution; from then on, at the entry of any of those functions, the guard walks the
calling thread's stack and decides who made the call:

* a frame in the solution's object, or in code outside every loaded object (code the solution
  wrote into memory), makes it the solution's call;
* frames of the CUDA libraries themselves (libcudart, libcuda, libcupti) and of the C runtime
  (libc, libstdc++, libgcc_s, libffi, the dynamic loader, ...: code that only calls what it is
  given) say nothing and are walked past;
* a driver function called by libcudart is the runtime doing the work of a runtime function
  (cudaMalloc calls cuMemAlloc, and resolves driver entry points with cuGetProcAddress; CUPTI
  reports those driver calls too): allowed, since the runtime function the caller called had
  its own callback and was judged there;
* the first other frame is the caller: a library the task lets the solution use and that does
  forbidden calls itself (the `trusted` globs: NCCL copies with cudaMemcpy when the solution
  creates a communicator) makes the call that library's own; any other (the Python interpreter,
  cupy, MPI, ...) is the harness, unless a solution frame is found further out (the solution
  driving harness code, e.g. the interpreter through its C API);
* a stack with no frame but the CUDA libraries' and the C runtime's is the solution's too: a
  thread whose start routine is the forbidden function itself, or a host function
  (cudaLaunchHostFunc) that is one.

A call of the solution writes {"forbidden": "cudaMemcpyAsync", "detail": ...} to
$COMMBENCH_GUARD_REPORT ("%r" becomes the rank, as for the interposer) and ends the process
with exit code 86. The harness's own calls (cupy's uploads) pass.

`commbench_guard_cupti_check()` (call it after the solution's calls, at least after the last)
proves the guard still runs: it calls cuDriverGetVersion through the driver found at arming and
expects its own callback to see it, and asks CUPTI whether every forbidden callback is still
enabled for its subscriber. A solution that detached CUPTI (cuptiFinalize, cuptiUnsubscribe,
cuptiEnableCallback/Domain with the guard's handle) and left it so is reported the same way,
as {"forbidden": "cupti", ...}.

Limits (an in-process guard against an adversary in the same process):

* The stack is the evidence. A solution that calls the function with a crafted stack (sets up
  a fake frame whose return address lies in harness code, or switches to a stack of its own,
  and jumps into the function) can make the walk show only harness frames. A solution that
  disables the guard for one call and restores it before the check (it needs the guard's
  subscriber handle from the guard's memory), or that rewrites the guard's code or its
  read-only state page (mprotect), is not seen either.
* Only API entry points report. Internal functions of libcudart or libcuda that do the same
  work, reached by scanning their code, make no callback; and a driver call made from inside
  libcudart is taken as the runtime's own (above), so internal runtime code that calls a
  forbidden driver function, reached the same way, passes.
* The trusted libraries are trusted with everything they do: a solution that reaches an
  internal copy routine of NCCL gets that copy. Other libraries that do forbidden calls on the
  solution's behalf (cuBLAS's cublasSetVector is a cudaMemcpy) make the solution's call
  forbidden unless they are listed as trusted.
* A harness callback that the solution calls (ctx->allgather, ...) runs Python with the
  solution's frame further out: a forbidden CUDA call made there (a cupy object freed by the
  garbage collector then, say) counts as the solution's. The harness's callbacks make none.
* CUPTI takes one subscriber per process: where another one is there first (a profiler
  injected through CUDA_INJECTION64_PATH, say), arming fails and says so (nonzero, a line on
  stderr); the harness must then not run the solution as if guarded.
* The walk looks at 256 frames; a stack deeper than that, with no decision within them, is
  taken as the harness's when a harness frame was seen.

Only x86-64 Linux with glibc is supported (as for the interposer); where CUPTI, its headers,
cuda.h or a C compiler are missing, nothing is built and the reason is logged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from .rank.protocol import ENV_GUARD_REPORT, GUARD_EXIT

log = logging.getLogger(__name__)

RECIPE_VERSION = "cupti-2"
REPORT_HEADER = Path(__file__).parent / "rank" / "guard_report.h"  # included by it
SOURCE = Path(__file__).parent / "rank" / "cupti_guard.c"
LIBRARY_NAME = "libcommbench_cupti.so"
HEADER_NAME = "commbench_cupti.h"
GUARD_ENV = "COMMBENCH_CUPTI_GUARD"  # where the rank harness finds the library to load
REPORT_ENV = ENV_GUARD_REPORT  # the interposer's: one report file per rank for both
ARM_SYMBOL = "commbench_guard_cupti_arm"  # int (const char *solution_path); 0 when armed
CHECK_SYMBOL = "commbench_guard_cupti_check"  # int (void); 0 when the guard still runs

# Libraries a task may let the solution call that make forbidden CUDA calls of their own,
# by the task's library/requires: their objects' file names.
TRUSTED_BY_USE = {
    "nccl": ("libnccl.so*",),
    "nccl-device": ("libnccl.so*",),
    "nvshmem": ("libnvshmem*", "nvshmem_*"),
}

_CBID = re.compile(r"CUPTI_(RUNTIME|DRIVER)_TRACE_CBID_([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+)")
_NOT_FUNCTIONS = {"INVALID", "SIZE", "FORCE_INT"}
_SUFFIX = re.compile(r"_(v\d+|ptds|ptsz)\Z")
_FILE_GLOB = re.compile(r"[A-Za-z0-9_.*?+\[\]-]+\Z")


# -- callback ids -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Callback:
    """One API function CUPTI reports: its domain ("runtime" or "driver"), callback id and
    the name in the cbid header (`cudaMemcpyAsync_ptsz_v7000`, `cuMemcpyDtoD_v2`)."""

    domain: str
    cbid: int
    name: str

    @property
    def forms(self) -> tuple[str, ...]:
        """The names a pattern is compared with: the header's, then with each trailing
        `_vNNNN`, `_ptds` and `_ptsz` taken off in turn (cudaMemcpyAsync_ptsz_v7000,
        cudaMemcpyAsync_ptsz, cudaMemcpyAsync): the exported symbols and the API's name."""
        forms = [self.name]
        while True:
            shorter = _SUFFIX.sub("", forms[-1])
            if shorter == forms[-1] or not shorter:
                return tuple(forms)
            forms.append(shorter)

    @property
    def function(self) -> str:
        """The API function's name, every suffix off (what a report names)."""
        return self.forms[-1]


def parse_cbids(text: str) -> list[Callback]:
    """The API functions of a `cupti_runtime_cbid.h` / `cupti_driver_cbid.h` text."""
    found = []
    for domain, name, number in _CBID.findall(text):
        if name not in _NOT_FUNCTIONS:
            found.append(Callback(domain.lower(), int(number), name))
    return found


def read_cbids(include: Path) -> list[Callback]:
    """Every runtime and driver API function the CUPTI headers in `include` list."""
    out: list[Callback] = []
    for header in ("cupti_runtime_cbid.h", "cupti_driver_cbid.h"):
        out += parse_cbids((Path(include) / header).read_text(errors="replace"))
    return out


def matches(pattern: str, callback: Callback) -> bool:
    """Whether a forbid pattern names this API function (fnmatch, case-sensitive, against any
    of its forms: "cudaMemcpy*" covers cudaMemcpyPeerAsync_v4000, "cuMemcpyDtoD" covers
    cuMemcpyDtoD_v2, "cudaStreamWaitEvent" its per-thread-stream variant too)."""
    return any(fnmatchcase(form, pattern) for form in callback.forms)


def resolve(patterns: Iterable[str], callbacks: Iterable[Callback]) -> list[Callback]:
    """The callbacks any pattern names, by domain and id, without repeats."""
    patterns = tuple(patterns)
    chosen = {(c.domain, c.cbid): c for c in callbacks if any(matches(p, c) for p in patterns)}
    return [chosen[k] for k in sorted(chosen)]


def trusted_for(uses: Iterable[str]) -> tuple[str, ...]:
    """The trusted library globs for a task's library and requires."""
    out: list[str] = []
    for use in uses:
        out += TRUSTED_BY_USE.get(use, ())
    return tuple(dict.fromkeys(out))


# -- finding CUPTI ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cupti:
    include: Path  # cupti.h and the cbid headers
    includes: tuple[Path, ...]  # every folder the compiler needs (cuda.h too)
    library: Path  # libcupti.so[.N]

    @property
    def folder(self) -> Path:
        """The folder recorded as the guard's rpath."""
        return self.library.parent


def _cuda_homes() -> list[Path]:
    from .toolchains.nvidia import cuda_runtime_dir

    homes = []
    if os.environ.get("CUDA_HOME"):
        homes.append(Path(os.environ["CUDA_HOME"]))
    runtime = cuda_runtime_dir()  # the folder of the nvcc in use (its wrapper scripts resolved)
    if runtime is not None:
        for sub in ("lib64", "targets/x86_64-linux/lib", "lib"):
            if runtime.as_posix().endswith("/" + sub):
                homes.append(Path(runtime.as_posix()[: -len(sub) - 1]))
    homes.append(Path("/usr/local/cuda"))
    homes += sorted(Path("/usr/local").glob("cuda-*"), reverse=True)
    return list(dict.fromkeys(homes))


def _library_in(folder: Path) -> Path | None:
    if (folder / "libcupti.so").exists():
        return folder / "libcupti.so"
    versioned = sorted(folder.glob("libcupti.so.*"), key=lambda p: (len(p.name), p.name))
    return versioned[0] if versioned else None


def _has_cupti_headers(folder: Path) -> bool:
    return all((folder / h).is_file()
               for h in ("cupti.h", "cupti_runtime_cbid.h", "cupti_driver_cbid.h"))


def find_cupti() -> Cupti | None:
    """CUPTI's headers and library: the CUDA toolkit's ($CUDA_HOME, the nvcc in use,
    /usr/local/cuda*: include/ and lib64/, or extras/CUPTI/), then the nvidia-cuda-cupti Python
    package (`nvidia/cu13/` or `nvidia/cuda_cupti/`). cupti.h includes cuda.h: it is looked for
    next to CUPTI's headers, in the toolkit and in the nvidia-cuda-runtime package."""
    from .toolchains.nvidia import _package_dir

    places: list[tuple[list[Path], list[Path]]] = []  # (include folders, library folders)
    for home in _cuda_homes():
        places.append(([home / "include", home / "extras" / "CUPTI" / "include",
                        home / "targets" / "x86_64-linux" / "include"],
                       [home / "lib64", home / "extras" / "CUPTI" / "lib64",
                        home / "targets" / "x86_64-linux" / "lib", home / "lib"]))
    for name in ("cu13", "cuda_cupti", "cu12"):
        pkg = _package_dir(name)
        if pkg is not None:
            places.append(([pkg / "include"], [pkg / "lib", pkg / "lib64"]))
    cuda_h = [inc for incs, _ in places for inc in incs if (inc / "cuda.h").is_file()]
    runtime_pkg = _package_dir("cuda_runtime")
    if runtime_pkg is not None and (runtime_pkg / "include" / "cuda.h").is_file():
        cuda_h.append(runtime_pkg / "include")
    for includes, libs in places:
        include = next((i for i in includes if _has_cupti_headers(i)), None)
        library = next((lib for lib in (_library_in(f) for f in libs if f.is_dir()) if lib), None)
        if include is None or library is None:
            continue
        own = [i for i in includes if (i / "cuda.h").is_file()]
        header = (own or cuda_h or [None])[0]
        if header is None:
            continue
        return Cupti(include, tuple(dict.fromkeys([include, header])), library)
    return None


# -- building -----------------------------------------------------------------------------------

def _c_string(text: str) -> str:
    return json.dumps(text)  # a JSON string of plain ASCII is a valid C string literal


def guard_header(patterns: tuple[str, ...], callbacks: list[Callback],
                 trusted: tuple[str, ...] = ()) -> str:
    """The generated `commbench_cupti.h`: the forbidden callbacks and the trusted libraries."""
    domains = {"runtime": "CUPTI_CB_DOMAIN_RUNTIME_API", "driver": "CUPTI_CB_DOMAIN_DRIVER_API"}
    lines = ["/* generated by pytest_commbench/cupti_guard.py: do not edit */",
             "/* patterns: " + " ".join(patterns).replace("*/", "* /") + " */",
             "#define COMMBENCH_CBIDS(X) \\"]
    lines += [f"    X({domains[c.domain]}, {c.cbid}, {_c_string(c.function)}) \\"
              for c in callbacks]
    copies, sets = capabilities(callbacks) if not trusted else (False, False)
    lines += ["", f"#define COMMBENCH_NCBID {len(callbacks)}",
              "#define COMMBENCH_TRUSTED " + " ".join(f"{_c_string(t)}," for t in trusted),
              f"#define COMMBENCH_FORBID_COPIES {int(copies)}",
              f"#define COMMBENCH_FORBID_SETS {int(sets)}", ""]
    return "\n".join(lines)


def capabilities(callbacks: list[Callback]) -> tuple[bool, bool]:
    """What the forbidden functions stand for, enforced by what the device does rather than by
    the name used: (copies, sets). A task that forbids the plain copy functions (cudaMemcpy
    and cudaMemcpyAsync: the copy engine itself, not only some of its routes, as a task that
    moves data with cudaMemcpyAsync but forbids peer or 2D copies does) forbids copies by
    the copy engine by any route (a CUDA graph's memcpy nodes, a batch copy, a prefetch): every
    copy the device makes while the solution's call runs is the solution's (CUPTI's activity
    records); likewise memsets for the memset functions."""
    names = {c.function for c in callbacks}
    return ({"cudaMemcpy", "cudaMemcpyAsync"} <= names,
            {"cudaMemset", "cudaMemsetAsync"} <= names)


def build_cupti_guard(patterns: tuple[str, ...], cache_dir: Path,
                      trusted: tuple[str, ...] = ()) -> Path | None:
    """The CUDA API guard for these forbid patterns (cached by content), or None where nothing
    is to be guarded (no pattern names a CUDA runtime or driver function) or it cannot be built
    here (not x86-64, no C compiler, no CUPTI): the reason is logged.

    `trusted`: globs of file names of libraries that may make forbidden calls of their own
    while the solution calls them (`trusted_for({task.library, *task.requires})`).

    Put the returned path (staged where the job sees it) in the ranks' $COMMBENCH_CUPTI_GUARD,
    with $COMMBENCH_GUARD_REPORT set as for the interposer; the rank harness, for a CUDA
    solution, calls `ctypes.CDLL(path).commbench_guard_cupti_arm(solution_path.encode())`
    before it loads the solution (0: armed), and `commbench_guard_cupti_check()` after the
    solution's calls."""
    machine = platform.machine()
    if machine not in ("x86_64", "AMD64"):
        log.warning("CUDA API guard: not built on %s (x86-64 only)", machine)
        return None
    if any(not _FILE_GLOB.match(t) for t in trusted):
        raise ValueError(f"not a file-name glob: {[t for t in trusted if not _FILE_GLOB.match(t)]}")
    cupti = find_cupti()
    if cupti is None:
        log.warning("CUDA API guard: not built (no CUPTI: headers cupti.h, cupti_*_cbid.h, "
                    "cuda.h and libcupti.so were not found in $CUDA_HOME, the toolkit of nvcc, "
                    "/usr/local/cuda* or the nvidia-cuda-cupti package)")
        return None
    try:
        chosen = resolve(patterns, read_cbids(cupti.include))
        source = SOURCE.read_text() + REPORT_HEADER.read_text()
        st = os.stat(cupti.library)
    except OSError as exc:
        log.warning("CUDA API guard: not built (%s)", exc)
        return None
    if not chosen:
        log.info("CUDA API guard: no pattern names a CUDA runtime or driver function")
        return None
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        log.warning("CUDA API guard: not built (no C compiler: gcc)")
        return None
    header = guard_header(tuple(patterns), chosen, tuple(trusted))
    library = Path(os.path.realpath(cupti.library))
    stamp = f"{library}:{st.st_size}:{st.st_mtime_ns}"
    key = hashlib.sha256("\0".join([RECIPE_VERSION, *patterns, "|", *trusted, stamp,
                                    *map(str, cupti.includes), header, source]).encode()).hexdigest()[:16]
    folder = Path(cache_dir) / key
    target = folder / LIBRARY_NAME
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / HEADER_NAME).write_text(header)
    tmp = folder / f"{LIBRARY_NAME}.{os.getpid()}.tmp"
    cmd = [gcc, "-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-I", str(folder)]
    for inc in cupti.includes:
        cmd += ["-I", str(inc)]
    cmd += ["-o", str(tmp), str(SOURCE), str(cupti.library), "-ldl",
            f"-Wl,-rpath,{cupti.folder}", "-Wl,--disable-new-dtags"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("CUDA API guard: not built (%s)", exc)
        return None
    if done.returncode != 0:
        log.warning("CUDA API guard: not built, the compiler failed: %s", done.stderr[-2000:])
        tmp.unlink(missing_ok=True)
        return None
    tmp.replace(target)
    log.info("CUDA API guard: %d API functions watched (%s, CUPTI from %s)", len(chosen), target,
             cupti.folder)
    return target


__all__ = ["ARM_SYMBOL", "CHECK_SYMBOL", "Callback", "Cupti", "GUARD_ENV", "GUARD_EXIT",
           "REPORT_ENV", "TRUSTED_BY_USE", "build_cupti_guard", "capabilities", "find_cupti", "guard_header",
           "matches", "parse_cbids", "read_cbids", "resolve", "trusted_for"]
