"""The job sandbox, controller side: what a job may see, and the command that builds it.

Every job (launcher and ranks) runs in fresh user, mount and PID namespaces built by
`sandbox_init.py` (util-linux `unshare` does the unsharing). The job's root is an empty
tmpfs into which only an allow-list is bound: the system trees (`SYSTEM_TREES`), the Python
environment (`python_roots()`), the trees a job's libraries need (`keep`, by default
`system_keep()`), /dev, /sys, a /proc of the job's own, fresh /tmp, /var/tmp, /dev/shm and
/run, and the job's folder. Nothing else of the host's filesystem exists inside. What `hide`
names (the package, the references, the runs and scratch roots with every other item's and
job's files, the project tree) is subtracted where it lies inside a kept tree. `probe()`
says once per process whether namespaces work here; where they do not, an item is
`infra_error` with the reason unless the user passed `--commbench-unsandboxed`.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from pathlib import Path

from .launch import find_mpiexec

INIT = Path(__file__).with_name("sandbox_init.py")
SETUP_FAILED = 125  # sandbox_init's exit code when the sandbox could not be built
PACKAGE = Path(__file__).resolve().parent
# what any program needs (bound read-only where they exist; a symbolic link, e.g. /bin ->
# usr/bin on a merged-/usr system, is made again as a link)
SYSTEM_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
# variables that name where a toolkit or MPI lives
PREFIX_VARS = ("CUDA_HOME", "CUDA_PATH", "OPAL_PREFIX", "MPI_HOME", "NCCL_HOME",
               "NVSHMEM_HOME", "UCX_HOME")


def unshare_argv() -> list[str] | None:
    exe = shutil.which("unshare")
    if exe is None:
        return None
    return [exe, "--user", "--map-root-user", "--mount", "--pid", "--fork", "--kill-child",
            "--mount-proc"]


def _abs(path: str | os.PathLike) -> str:
    """Absolute, without resolving symbolic links (the sandbox makes them again)."""
    return os.path.abspath(os.fspath(path))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def python_roots() -> list[str]:
    """Trees the ranks' Python needs: the interpreter's prefixes and site-packages."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(path)
    return sorted(_abs(r) for r in roots if r)


def _loader_folders(conf: str = "/etc/ld.so.conf", depth: int = 0) -> list[str]:
    """The library folders the dynamic loader is configured with (its cache names their
    libraries, so a job must see them)."""
    found: list[str] = []
    try:
        lines = Path(conf).read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line.startswith("include") and depth < 3:
            pattern = line.split(None, 1)[1] if len(line.split(None, 1)) > 1 else ""
            pattern = pattern if pattern.startswith("/") else os.path.join(
                os.path.dirname(conf), pattern)
            for sub in sorted(glob.glob(pattern)):
                found += _loader_folders(sub, depth + 1)
        elif line.startswith("/"):
            found.append(line)
    return found


def system_keep(env: Mapping[str, str] | None = None) -> list[str]:
    """The trees besides the system's own that a job usually needs on this machine, where
    they exist: the CUDA toolkits and driver folders under /usr/local, /usr/local/lib and
    /usr/local/bin, the prefix of the MPI in use (its `mpiexec`, daemons, components and
    help files), the prefixes the job's environment names (CUDA_HOME, OPAL_PREFIX, ...),
    the folders of the job's LD_LIBRARY_PATH and those the dynamic loader is configured
    with (/etc/ld.so.conf: e.g. /opt/amazon/efa/lib for NCCL's network plugin)."""
    env = os.environ if env is None else env
    found = ["/usr/local/bin", "/usr/local/lib", "/usr/local/nvidia",
             *sorted(glob.glob("/usr/local/cuda*"))]
    mpiexec = find_mpiexec()
    if mpiexec:
        found.append(str(Path(mpiexec).resolve().parent.parent))
    found += [env[v] for v in PREFIX_VARS if env.get(v)]
    found += [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    found += _loader_folders()
    kept = [_abs(p) for p in found if os.path.isabs(p) and os.path.exists(p)]
    return [p for p in dict.fromkeys(kept) if os.path.realpath(p) != "/"]


def plan(job_dir: Path, argv: list[str], env: dict[str, str], hide: Iterable[Path],
         keep: Iterable[Path | str] | None = None) -> dict:
    """The JSON plan `sandbox_init.py` builds the job's view from.

    `keep`: trees bound read-only besides the system trees and the Python environment; None
    means `system_keep(env)` less what of it lies in a hidden tree (a library folder inside
    the project stays hidden). What `keep` names and the Python environment stay visible
    inside a hidden tree (a virtual environment inside the project); what `hide` names is
    hidden where it lies inside a kept tree."""
    hidden = sorted({str(PACKAGE), *(os.path.realpath(h) for h in hide)})
    if keep is None:
        extra = [k for k in system_keep(env)
                 if not any(_inside(os.path.realpath(k), h) for h in hidden)]
    else:
        extra = [_abs(k) for k in keep]
    kept = [t for t in SYSTEM_TREES if os.path.lexists(t)]
    kept += [k for k in dict.fromkeys([*python_roots(), *extra]) if k not in kept]
    return {"job": _abs(job_dir), "argv": argv, "env": env, "hide": hidden, "keep": kept}


def wrap(job_dir: Path, argv: list[str], env: dict[str, str], hide: Iterable[Path],
         keep: Iterable[Path | str] | None = None) -> list[str]:
    """The command that runs `argv` inside the job's sandbox (see `plan` for `keep`)."""
    prefix = unshare_argv()
    if prefix is None:
        raise RuntimeError("unshare (util-linux) is not installed")
    spec = plan(job_dir, argv, env, hide, keep)
    return [*prefix, sys.executable, "-I", "-S", str(INIT), json.dumps(spec)]


@functools.lru_cache(maxsize=1)
def probe() -> str | None:
    """None when sandboxes work on this machine, else the reason they do not."""
    if sys.platform != "linux":
        return f"job sandboxes need Linux namespaces (this is {sys.platform})"
    prefix = unshare_argv()
    if prefix is None:
        return "unshare (util-linux) is not installed"
    import tempfile

    with tempfile.TemporaryDirectory(prefix="commbench-probe-") as tmp:
        job = Path(tmp).resolve() / "job"
        (job / "ro").mkdir(parents=True)
        hidden = Path(tmp).resolve() / "hidden"
        hidden.mkdir()
        (hidden / "secret").write_text("x")
        check = (f"import os,sys; assert not os.path.exists({str(hidden / 'secret')!r}); "
                 f"assert os.getcwd() == {str(job)!r}, os.getcwd(); "
                 f"open({str(job / 'w')!r}, 'w').write('ok'); "
                 "assert os.getpid() <= 3, os.getpid()")
        argv = wrap(job, [sys.executable, "-I", "-S", "-c", check], {"PATH": "/usr/bin:/bin"},
                    hide=[hidden])
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"the sandbox probe failed: {exc}"
        if done.returncode != 0 or not (job / "w").exists():
            why = (done.stderr or done.stdout).strip().splitlines()
            return ("user/mount/PID namespaces are not usable here: "
                    f"{why[-1] if why else f'exit code {done.returncode}'}")
    return None
