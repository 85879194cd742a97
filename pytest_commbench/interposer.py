"""The run-time check of a task's `forbid` list at the library boundary (controller side).

`build_interposer` turns the task's patterns into families of exported functions of the
communication libraries the job uses (libmpi, libnccl, libnvshmem_host) and compiles
`rank/interpose.c` over them into an LD_PRELOAD library: its functions forward to the real
ones until the rank harness calls `commbench_guard_arm()`, and after that any call of them
from outside the library's own installation writes a report ({"forbidden": "MPI_Allreduce",
...}) to $COMMBENCH_GUARD_REPORT ("%r" becomes the rank) and ends the rank with exit code 86.

Calls from inside a library's own installation (its folder, and Open MPI's `openmpi*` component
folders under it) are forwarded after arming too: Open MPI calls PMPI_Allreduce and ROMIO
MPI_Bcast themselves. `dlsym` is interposed as well: a lookup of a covered name with any
handle (dlopen("libmpi.so") then dlsym) gets the checking trampoline, not the real function.

A pattern names a family, not one symbol: the MPI_/PMPI_ and nccl/pnccl prefixes, a
nonblocking `I` and the persistent/large-count `_init`/`_c` suffixes are stripped from both
sides and the rest is compared case-insensitively, so "Allreduce" (or mpi4py's "allreduce")
covers MPI_Allreduce, PMPI_Allreduce, MPI_Iallreduce, MPI_Allreduce_init and MPI_Allreduce_c,
and "Neighbor_*" covers MPI_Neighbor_allgather and MPI_Ineighbor_alltoallv_init. A pattern
with a library prefix and nothing after it but wildcards ("nccl*", "MPI_*") covers the whole
library (aliases included); the alias prefixes alone ("pnccl*", "PMPI_*") only their aliases.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
from fnmatch import fnmatchcase
from pathlib import Path

from . import jobfiles
from .rank.protocol import ENV_GUARD_REPORT, GUARD_EXIT

log = logging.getLogger(__name__)

RECIPE_VERSION = "interpose-1"
REPORT_HEADER = Path(__file__).parent / "rank" / "guard_report.h"  # included by it
SOURCE = Path(__file__).parent / "rank" / "interpose.c"
LIBRARY_NAME = "libcommbench_guard.so"
REPORT_ENV = ENV_GUARD_REPORT  # (rank/protocol.py: the job's contract)

# library prefix -> (library, is the alias prefix); longest first
_PREFIXES = (("PMPI_", "mpi", True), ("MPI_", "mpi", False),
             ("pnccl", "nccl", True), ("nccl", "nccl", False))
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


# -- families -----------------------------------------------------------------------------------

def _split(name: str) -> tuple[str | None, bool, str]:
    """(library, alias?, the rest) of a symbol or a pattern."""
    for prefix, library, alias in _PREFIXES:
        if name.startswith(prefix) and len(name) > len(prefix):
            return library, alias, name[len(prefix):]
    return None, False, name


def _core(rest: str) -> str:
    """The operation a name is about: no nonblocking I, no _init / _c, any case."""
    core = rest.lower()
    changed = True
    while changed:
        changed = False
        for suffix in ("_c", "_init"):
            if core.endswith(suffix) and len(core) > len(suffix):
                core, changed = core[: -len(suffix)], True
    if len(core) > 1 and core[0] == "i" and core[1].isalpha():
        core = core[1:]
    return core


def _primary(name: str) -> str:
    """PMPI_X -> MPI_X, pncclX -> ncclX: the name an alias stands for."""
    if name.startswith("PMPI_"):
        return name[1:]
    if name.startswith("pnccl"):
        return name[1:]
    return name


def matches(pattern: str, symbol: str) -> bool:
    """Whether a forbidden pattern covers an exported symbol (see the module's docstring)."""
    if fnmatchcase(symbol, pattern):
        return True
    p_lib, p_alias, p_rest = _split(pattern)
    s_lib, _s_alias, s_rest = _split(symbol)
    if s_lib is None:  # not an API entry point of a known library: the pattern as written
        return False
    if p_lib is not None and p_lib != s_lib:
        return False
    if not p_rest.strip("*?"):  # "nccl*", "MPI_*": the whole library, but "pnccl*" its aliases
        return not p_alias and fnmatchcase(_primary(symbol), pattern)
    return fnmatchcase(_core(s_rest), _core(p_rest))


def family(patterns: tuple[str, ...], symbols: list[str]) -> list[str]:
    """The symbols any pattern covers, in the given order."""
    return [s for s in symbols if any(matches(p, s) for p in patterns)]


# -- ELF dynamic exports ------------------------------------------------------------------------

def exported_functions(path: Path) -> list[str]:
    """Defined, default-visibility function symbols of a 64-bit little-endian ELF's .dynsym."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names: list[str] = []
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if kind != 11:  # SHT_DYNSYM
            continue
        strtab = sections[link]
        str_off, str_size = strtab[4], strtab[5]
        for at in range(offset + entsize, offset + size, entsize):  # entry 0 is the null symbol
            st_name, st_info, st_other, st_shndx = struct.unpack_from("<IBBH", data, at)
            binding, typ, visibility = st_info >> 4, st_info & 0xF, st_other & 0x3
            if st_shndx == 0 or typ not in (2, 10) or binding not in (1, 2) or visibility not in (0, 3):
                continue  # undefined, not a function (FUNC, GNU_IFUNC), local, hidden/internal
            end = data.index(b"\0", str_off + st_name, str_off + str_size)
            names.append(data[str_off + st_name:end].decode("ascii", "replace"))
    return names


# -- finding the libraries ------------------------------------------------------------------------

def find_libmpi(mpiexec: str | None = None) -> Path | None:
    """The libmpi the ranks load: next to the launcher (`<bin>/../lib`), else the one mpi4py
    loads in a child process (without initializing MPI), read from its /proc/self/maps."""
    if mpiexec:
        lib = Path(os.path.realpath(mpiexec)).parent.parent / "lib"
        for name in ("libmpi.so.40", "libmpi.so.12", "libmpi.so"):
            if (lib / name).exists():
                return lib / name
    probe = ("import mpi4py; mpi4py.rc.initialize = mpi4py.rc.finalize = False\n"
             "from mpi4py import MPI\n"
             "for line in open('/proc/self/maps'):\n"
             "    path = line.split()[-1]\n"
             "    if '/libmpi.so' in path or '/libmpich.so' in path:\n"
             "        print(path); break\n")
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = done.stdout.strip()
    return Path(found) if found else None


def default_libraries(mpiexec: str | None = None, *, nccl: bool = False,
                      nvshmem: bool = False) -> list[Path]:
    """libmpi, and libnccl.so.2 / libnvshmem_host.so.3 where the task uses them."""
    libs = [p for p in [find_libmpi(mpiexec)] if p is not None]
    if nccl or nvshmem:
        from .toolchains.nvidia import find_cuda_libs

        cuda = find_cuda_libs()
        wanted = [(nccl, cuda.nccl_lib, "libnccl.so.2"), (nvshmem, cuda.nvshmem_lib, "libnvshmem_host.so.3")]
        for use, folder, name in wanted:
            if not use:
                continue
            for candidate in ([folder / name] if folder else []) + [Path("/usr/lib/x86_64-linux-gnu") / name]:
                if candidate.exists():
                    libs.append(candidate)
                    break
    return libs


def mpi4py_folders() -> tuple[str, ...]:
    """The folder of the mpi4py package the ranks import (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("mpi4py")
    if spec is None or not spec.submodule_search_locations:
        return ()
    return tuple(str(Path(p).resolve()) for p in spec.submodule_search_locations)


# -- building ---------------------------------------------------------------------------------------

def _c_string(text: str) -> str:
    return json.dumps(text)  # a JSON string of plain paths is a valid C string literal


def _trusted_folders(libraries: list[Path], extra: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """Where a library's own code lives: its folder (objects directly in it) and, any depth,
    its `openmpi*` component folders (Open MPI's plugins, ROMIO)."""
    dirs, trees = [f"{os.path.realpath(e).rstrip('/')}/" for e in extra], []
    for lib in libraries:
        folder = Path(os.path.realpath(lib)).parent
        dirs.append(f"{folder}/")
        for sub in sorted(folder.glob("openmpi*")):
            if sub.is_dir():
                trees.append(f"{sub.resolve()}/")
    return sorted(set(dirs)), sorted(set(trees))


@functools.lru_cache(maxsize=64)
def _covered(patterns: tuple[str, ...], library: str, _size: int, _mtime_ns: int) -> tuple[str, ...]:
    """The library's exports the patterns cover and the stubs may name (a library of
    thousands of exports against dozens of patterns takes a second or two: every job of a
    run asks the same, so it is worked out once per library file as it is on disk)."""
    return tuple(name for name in family(patterns, exported_functions(Path(library)))
                 if _IDENT.match(name) and not name.startswith("commbench_"))


def stubs_header(patterns: tuple[str, ...], libraries: list[Path],
                 trusted: tuple[str, ...] = ()) -> tuple[str, list[str]]:
    """The generated `commbench_stubs.h` and the names it covers."""
    chosen: dict[str, int] = {}
    for index, lib in enumerate(libraries):
        st = os.stat(lib)
        for name in _covered(patterns, os.path.realpath(lib), st.st_size, st.st_mtime_ns):
            chosen.setdefault(name, index)
    dirs, trees = _trusted_folders(libraries, trusted)
    lines = ["/* generated by pytest_commbench/interposer.py: do not edit */",
             "/* patterns: " + " ".join(patterns).replace("*/", "* /") + " */",
             "#define COMMBENCH_SYMBOLS(X) \\"]
    lines += [f"    X({i}, {name}, {lib}) \\" for i, (name, lib) in enumerate(sorted(chosen.items()))]
    lines += ["", f"#define COMMBENCH_NSYM {len(chosen)}",
              "#define COMMBENCH_LIBRARIES " + " ".join(f"{_c_string(os.path.realpath(p))}," for p in libraries),
              "#define COMMBENCH_TRUSTED_DIRS " + " ".join(f"{_c_string(d)}," for d in dirs),
              "#define COMMBENCH_TRUSTED_TREES " + " ".join(f"{_c_string(t)}," for t in trees), ""]
    return "\n".join(lines), sorted(chosen)


def build_interposer(patterns: tuple[str, ...], libraries: list[Path], cache_dir: Path,
                     trusted: tuple[str, ...] = ()) -> Path | None:
    """The preload library for these patterns over these libraries (cached), or None where it
    cannot be built here (not x86-64, no gcc, a library unreadable): the reason is logged.

    Put the returned path in the ranks' LD_PRELOAD; the harness arms it with
    `ctypes.CDLL(None).commbench_guard_arm()` before it loads the solution."""
    machine = platform.machine()
    if machine not in ("x86_64", "AMD64"):
        log.warning("run-time guard: no interposer on %s (its trampolines are x86-64 only)", machine)
        return None
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        log.warning("run-time guard: no interposer (gcc is not installed)")
        return None
    try:
        header, names = stubs_header(tuple(patterns), [Path(p) for p in libraries], trusted)
        stats = [f"{os.path.realpath(p)}:{os.stat(p).st_size}:{os.stat(p).st_mtime_ns}" for p in libraries]
        source = SOURCE.read_text() + REPORT_HEADER.read_text()
    except (OSError, ValueError) as exc:
        log.warning("run-time guard: no interposer (%s)", exc)
        return None
    key = hashlib.sha256("\0".join([RECIPE_VERSION, *patterns, *stats, header, source]).encode()).hexdigest()[:16]
    folder = Path(cache_dir) / key
    target = folder / LIBRARY_NAME
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "commbench_stubs.h").write_text(header)
    tmp = folder / f"{LIBRARY_NAME}.{os.getpid()}.tmp"
    cmd = [gcc, "-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-I", str(folder),
           "-o", str(tmp), str(SOURCE), "-ldl"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("run-time guard: no interposer (%s)", exc)
        return None
    if done.returncode != 0:
        log.warning("run-time guard: no interposer, gcc failed: %s", done.stderr[-2000:])
        tmp.unlink(missing_ok=True)
        return None
    tmp.replace(target)
    log.info("run-time guard: %d names interposed (%s)", len(names), target)
    return target


# -- reading a report -------------------------------------------------------------------------------

REPORT_BYTES = 64 * 1024  # of a guard report file read at most (a report is one short line)


def guard_report(path: Path | str) -> dict | None:
    """The first report in a guard report file (the interposer's or the audit hook's), or None
    where there is none (no file, empty, not a report). The file is a job's: its folder is
    taken as the caller's own, the name is read as `jobfiles` reads a job's files (never
    through a link, never a FIFO or anything but a regular file, REPORT_BYTES at most)."""
    path = Path(path)
    data = jobfiles.read(path.parent, path.name, REPORT_BYTES)
    if data is None:
        return None
    for line in data.decode(errors="replace").splitlines():
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict) and isinstance(report.get("forbidden"), str):
            return report
    return None


__all__ = ["GUARD_EXIT", "REPORT_ENV", "build_interposer", "default_libraries", "exported_functions",
           "family", "find_libmpi", "guard_report", "matches"]
