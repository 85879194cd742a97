"""A task's `forbid` list binds the solution, never the harness: with the run-time guard of
every task's patterns preloaded (not yet armed, as while the rank harness sets up), the rank
harness's own MPI (mpi4py, under mpiexec) still loads and communicates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_commbench import interposer
from pytest_commbench.build import ALWAYS_FORBIDDEN_C, expand_forbid
from pytest_commbench.launch import find_mpiexec, mpi_abi, mpi_env
from pytest_commbench.tasks import load_task

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((REPO / "suites").glob("*/*/task.toml"))
HARNESS = ("from mpi4py import MPI\n"
           "w = MPI.COMM_WORLD\n"
           "assert w.allreduce(1) == w.Get_size()\n"
           "print('harness mpi ok', w.Get_rank())\n")

pytestmark = pytest.mark.skipif(find_mpiexec() is None, reason="no mpiexec")


def _patterns(manifest: Path) -> tuple[str, ...]:
    task = load_task(manifest, REPO / "suites")
    return tuple(dict.fromkeys((*expand_forbid(task.forbid), *ALWAYS_FORBIDDEN_C)))


def _guard(patterns: tuple[str, ...], cache: Path) -> Path:
    libs = interposer.default_libraries(find_mpiexec())
    if not libs:
        pytest.skip("no libmpi found for the run-time guard")
    lib = interposer.build_interposer(patterns, libs, cache)
    if lib is None:
        pytest.skip("the run-time guard cannot be built here")
    return lib


def _run_harness(preload: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**env, "LD_PRELOAD": str(preload)}
    return subprocess.run([find_mpiexec(), "-n", "2", "--oversubscribe", sys.executable, "-c",
                           HARNESS], capture_output=True, text=True, timeout=180, env=env)


def _distinct_pattern_sets() -> dict[tuple[str, ...], str]:
    sets: dict[tuple[str, ...], str] = {}
    for manifest in MANIFESTS:
        sets.setdefault(_patterns(manifest), manifest.parent.name)
    return sets


PATTERN_SETS = _distinct_pattern_sets()


@pytest.mark.parametrize("patterns", list(PATTERN_SETS), ids=list(PATTERN_SETS.values()))
def test_the_harness_mpi_works_under_every_tasks_guard(tmp_path, patterns):
    done = _run_harness(_guard(patterns, tmp_path), mpi_env())
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert done.stdout.count("harness mpi ok") == 2


def test_whole_mpi_forbidden_broke_mpi4py_without_its_abi_named(tmp_path):
    """What the fix is for: with every MPI name preloaded, mpi4py (built for several ABIs)
    took the preload for MPICH and looked for libmpi.so.12; `mpi_env` names the ABI."""
    if mpi_abi() != "openmpi":
        pytest.skip("the mix-up needs Open MPI under an mpi4py built for several ABIs")
    preload = _guard(("MPI_*", "libmpi*"), tmp_path)
    env = {k: v for k, v in mpi_env().items() if k != "MPI4PY_MPIABI"}
    broken = _run_harness(preload, env)
    if broken.returncode == 0:
        pytest.skip("this mpi4py does not pick its ABI from the loaded symbols")
    assert "libmpi.so.12" in broken.stdout + broken.stderr
    fixed = _run_harness(preload, mpi_env())
    assert fixed.returncode == 0, (fixed.stdout + fixed.stderr)[-3000:]


ARMED = ("import ctypes, sys\n"
         "import mpi4py\n"
         "if sys.argv[1] == 'harness':\n"
         "    mpi4py.rc.finalize = False\n"
         "from mpi4py import MPI\n"
         "w = MPI.COMM_WORLD\n"
         "rank = w.Get_rank()\n"
         "w.Barrier()\n"
         "ctypes.CDLL(None).commbench_guard_arm()\n"
         "w.Barrier()  # the harness's host helpers, through mpi4py, after arming\n"
         "if sys.argv[1] == 'harness':\n"
         "    MPI.Finalize()\n"
         "print('armed and finalized', rank)\n")


def test_a_native_tasks_harness_keeps_its_mpi_after_arming_and_finalizes_cleanly(tmp_path):
    """With MPI_* forbidden (flag_pingpong, ipc_barrier) and the guard armed, the harness's own
    MPI calls come from mpi4py (trusted for native tasks) and it finalizes through mpi4py; an
    MPI_Finalize left to the interpreter's exit handlers comes from no library and was judged
    the solution's forbidden call."""
    libs = interposer.default_libraries(find_mpiexec())
    if not libs:
        pytest.skip("no libmpi found for the run-time guard")
    lib = interposer.build_interposer(("MPI_*", "libmpi*"), libs, tmp_path,
                                      interposer.mpi4py_folders())
    if lib is None:
        pytest.skip("the run-time guard cannot be built here")
    env = {**mpi_env(), "LD_PRELOAD": str(lib),
           "COMMBENCH_GUARD_REPORT": str(tmp_path / "guard_r%r.json")}

    def run(mode: str) -> subprocess.CompletedProcess:
        return subprocess.run([find_mpiexec(), "-n", "2", "--oversubscribe", sys.executable,
                               "-c", ARMED, mode], capture_output=True, text=True, timeout=180,
                              env=env)

    done = run("harness")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert done.stdout.count("armed and finalized") == 2
    left = run("exit-handlers")
    if left.returncode == 0:
        pytest.skip("this mpi4py finalizes from its own code at exit")
    assert "MPI_Finalize" in left.stdout + left.stderr
