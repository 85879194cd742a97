"""The job sandbox, controller side: what a job may see, and the command that builds it.

Every job (launcher and ranks) runs in fresh user, mount and PID namespaces built by
`sandbox_init.py` (util-linux `unshare` does the unsharing). This module decides the plan:
which trees are hidden (the package, the references, the runs and scratch roots with every
other item's and job's files, the project tree), which are kept (the Python environment and
the MPI in use), and which folder of the job is writable. `probe()` says once per process
whether namespaces work here; where they do not, an item is `infra_error` with the reason
unless the user passed `--commbench-unsandboxed`.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

INIT = Path(__file__).with_name("sandbox_init.py")
SETUP_FAILED = 125  # sandbox_init's exit code when the sandbox could not be built
PACKAGE = Path(__file__).resolve().parent


def unshare_argv() -> list[str] | None:
    exe = shutil.which("unshare")
    if exe is None:
        return None
    return [exe, "--user", "--map-root-user", "--mount", "--pid", "--fork", "--kill-child",
            "--mount-proc"]


def python_roots() -> list[str]:
    """Trees the ranks' Python needs: the interpreter's prefixes and site-packages."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(path)
    return sorted(str(Path(r).resolve()) for r in roots if r)


def plan(job_dir: Path, argv: list[str], env: dict[str, str], hide: list[Path],
         keep: list[Path] = ()) -> dict:
    """The JSON plan `sandbox_init.py` builds the job's view from."""
    hidden = {str(PACKAGE), *(str(Path(h).resolve()) for h in hide)}
    kept = set(python_roots()) | {str(Path(k).resolve()) for k in keep}
    return {"job": str(job_dir.resolve()), "argv": argv, "env": env,
            "hide": sorted(hidden), "keep": sorted(kept)}


def wrap(job_dir: Path, argv: list[str], env: dict[str, str], hide: list[Path],
         keep: list[Path] = ()) -> list[str]:
    """The command that runs `argv` inside the job's sandbox."""
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
        job = Path(tmp) / "job"
        (job / "ro").mkdir(parents=True)
        hidden = Path(tmp) / "hidden"
        hidden.mkdir()
        (hidden / "secret").write_text("x")
        check = (f"import os,sys; assert not os.path.exists({str(hidden / 'secret')!r}); "
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
