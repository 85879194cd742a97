"""The CUDA API guard (cupti_guard.py, rank/cupti_guard.c): forbid patterns resolved to CUPTI
callback ids, the generated header, the library's build (needs CUPTI and gcc, not a GPU), the
cheat it exists for (builds and passes the static check: only the run-time guard can catch
it), and, on a machine with an NVIDIA GPU, the guard itself: a solution's forbidden call ends
the process with a report however the function was found, the harness's own calls pass."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_commbench import cupti_guard
from pytest_commbench.cupti_guard import (
    Callback,
    build_cupti_guard,
    find_cupti,
    guard_header,
    parse_cbids,
    read_cbids,
    resolve,
    trusted_for,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
CHEAT = REPO / "fixtures" / "cheats-gpu" / "memcpy_from_elf"
CUPTI = find_cupti()
GCC = shutil.which("gcc") or shutil.which("cc")

needs_cupti = pytest.mark.skipif(CUPTI is None, reason="no CUPTI (headers and libcupti) here")
needs_build = pytest.mark.skipif(CUPTI is None or GCC is None,
                                 reason="no CUPTI or no C compiler here")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


def _nvidia_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU " in out.stdout


needs_gpu = pytest.mark.skipif(
    CUPTI is None or GCC is None or not _nvidia_gpu(),
    reason="needs an NVIDIA GPU, CUPTI and gcc")

SYNTHETIC = """
typedef enum CUpti_runtime_api_trace_cbid_enum {
    CUPTI_RUNTIME_TRACE_CBID_INVALID                            = 0,
    CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020                   = 20,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020                   = 31,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020              = 41,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyPeerAsync_v4000          = 161,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000         = 225,
    CUPTI_RUNTIME_TRACE_CBID_cudaStreamWaitEvent_v3020          = 147,
    CUPTI_RUNTIME_TRACE_CBID_cudaStreamWaitEvent_ptsz_v7000     = 234,
    CUPTI_RUNTIME_TRACE_CBID_SIZE                               = 500,
    CUPTI_RUNTIME_TRACE_CBID_FORCE_INT                          = 0x7fffffff
} CUpti_runtime_api_trace_cbid;
typedef enum CUpti_driver_api_trace_cbid_enum {
    CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2                       = 245,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD                        = 47,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2                     = 280,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DBatchAsync_v2_ptsz        = 799,
} CUpti_driver_api_trace_cbid;
"""


# -- names and patterns (no CUDA needed) ---------------------------------------------------------

def test_a_callback_name_gives_the_function_and_its_exported_forms():
    c = Callback("runtime", 225, "cudaMemcpyAsync_ptsz_v7000")
    assert c.forms == ("cudaMemcpyAsync_ptsz_v7000", "cudaMemcpyAsync_ptsz", "cudaMemcpyAsync")
    assert c.function == "cudaMemcpyAsync"
    d = Callback("driver", 799, "cuMemcpy3DBatchAsync_v2_ptsz")
    assert d.forms[-1] == "cuMemcpy3DBatchAsync" and "cuMemcpy3DBatchAsync_v2" in d.forms
    assert Callback("driver", 2, "cuDriverGetVersion").forms == ("cuDriverGetVersion",)


def test_the_cbid_headers_parse_to_functions_only():
    found = parse_cbids(SYNTHETIC)
    assert {c.name for c in found} >= {"cudaMemcpy_v3020", "cuMemcpyDtoD_v2"}
    assert not any(c.name in ("INVALID", "SIZE", "FORCE_INT") for c in found)
    assert {c.domain for c in found} == {"runtime", "driver"}
    assert Callback("runtime", 41, "cudaMemcpyAsync_v3020") in found


def test_patterns_resolve_to_the_callbacks_of_their_functions():
    cbs = parse_cbids(SYNTHETIC)

    def ids(*patterns):
        return {(c.domain, c.cbid) for c in resolve(patterns, cbs)}

    assert ids("cudaMemcpy*") == {("runtime", 31), ("runtime", 41), ("runtime", 161),
                                  ("runtime", 225)}
    assert ids("cuMemcpy*") == {("driver", 47), ("driver", 280), ("driver", 799)}
    # an exact name covers its versions and its per-thread-default-stream variant
    assert ids("cudaStreamWaitEvent") == {("runtime", 147), ("runtime", 234)}
    assert ids("cuMemcpyDtoD") == ids("cuMemcpyDtoD_v2") | {("driver", 47)}
    # names of other libraries, and the MPI families, name no CUDA function
    assert ids("nccl*", "libnccl*", "MPI_*", "Allreduce*", "dlopen", "dlsym", "*TF32*") == set()
    # resolved once each, sorted by domain (driver first, as CUPTI numbers them) and id
    out = resolve(("cudaMemcpy*", "cudaMemcpyAsync", "cu*"), cbs)
    keys = [(c.domain, c.cbid) for c in out]
    assert keys == sorted(set(keys)) and keys[0][0] == "driver"


@needs_cupti
def test_the_toolkits_cbid_headers_resolve_the_tasks_families():
    cbs = read_cbids(CUPTI.include)
    memcpy = resolve(("cudaMemcpy*",), cbs)
    names = {c.function for c in memcpy}
    assert {"cudaMemcpy", "cudaMemcpyAsync", "cudaMemcpyPeer", "cudaMemcpyPeerAsync",
            "cudaMemcpy2DAsync", "cudaMemcpy3DPeerAsync", "cudaMemcpyToSymbol"} <= names
    assert all(n.startswith("cudaMemcpy") for n in names) and "cudaMalloc" not in names
    assert {c.domain for c in memcpy} == {"runtime"}
    driver = resolve(("cuMemcpy*",), cbs)
    assert {"cuMemcpyDtoD_v2", "cuMemcpyDtoDAsync_v2", "cuMemcpyPeerAsync",
            "cuMemcpyHtoD_v2"} <= {c.name for c in driver}
    assert {c.domain for c in driver} == {"driver"}
    assert not any(c.function.startswith(("cuMemAlloc", "cudaMemcpy")) for c in driver)
    # a whole manifest: flag_pingpong's list names events, waits and host functions too
    task = tomllib.loads((REPO / "suites" / "p2p" / "flag_pingpong" / "task.toml").read_text())
    flag = {c.function for c in resolve(tuple(task["forbid"]), cbs)}
    assert {"cudaEventRecord", "cudaLaunchHostFunc", "cudaIpcOpenMemHandle",
            "cuStreamWaitValue32", "cudaStreamWaitEvent", "cudaMemsetAsync"} <= flag
    assert not flag & {"cudaLaunchKernel", "cudaMalloc", "cudaStreamSynchronize",
                       "cuDriverGetVersion"}


def test_the_generated_header_lists_domain_id_and_function():
    cbs = resolve(("cudaMemcpy*", "cuMemcpyDtoD"), parse_cbids(SYNTHETIC))
    text = guard_header(("cudaMemcpy*", "cuMemcpyDtoD"), cbs, ("libnccl.so*",))
    assert '    X(CUPTI_CB_DOMAIN_DRIVER_API, 280, "cuMemcpyDtoD") \\' in text
    assert '    X(CUPTI_CB_DOMAIN_RUNTIME_API, 225, "cudaMemcpyAsync") \\' in text
    assert f"#define COMMBENCH_NCBID {len(cbs)}" in text
    assert '#define COMMBENCH_TRUSTED "libnccl.so*",' in text
    assert "/* patterns: cudaMemcpy* cuMemcpyDtoD */" in text
    lines = [x for x in text.splitlines() if x.startswith("    X(")]
    assert lines.index(next(x for x in lines if "DRIVER" in x)) == 0  # the table is sorted
    # a pattern cannot close the comment it is quoted in
    assert "*/ */" not in guard_header(("a*/b",), [], ())


def test_forbidden_copy_functions_forbid_what_the_device_does_unless_a_library_is_trusted():
    """A task that forbids the copy (memset) functions has the guard watch the device's copies
    (memsets) by CUPTI's activity records; not where a trusted library may make its own."""
    copies = resolve(("cudaMemcpy*", "cuMemcpy*"), parse_cbids(SYNTHETIC))
    text = guard_header(("cudaMemcpy*",), copies)
    assert "#define COMMBENCH_FORBID_COPIES 1" in text
    assert "#define COMMBENCH_FORBID_SETS 0" in text
    trusted = guard_header(("cudaMemcpy*",), copies, ("libnccl.so*",))
    assert "#define COMMBENCH_FORBID_COPIES 0" in trusted
    other = resolve(("cuMemAlloc*",), parse_cbids(SYNTHETIC))
    assert cupti_guard.capabilities(other) == (False, False)
    # some routes of the copy engine forbidden, the copy engine itself the task's method
    # (p2p/d2h_bounce_copy forbids driver and peer copies, copies with cudaMemcpyAsync)
    routes = resolve(("cuMemcpy*", "cudaMemcpyPeer*"), parse_cbids(SYNTHETIC))
    assert routes and cupti_guard.capabilities(routes) == (False, False)


def test_libraries_trusted_with_their_own_calls_follow_the_task():
    assert trusted_for({"cuda-runtime", "cuda-ipc"}) == ()
    assert trusted_for(["nccl-device", "nccl"]) == ("libnccl.so*",)
    assert set(trusted_for({"nvshmem"})) == {"libnvshmem*", "nvshmem_*"}


# -- building (CUPTI and gcc, no GPU) -----------------------------------------------------------

def _readelf(lib: Path) -> str:
    return subprocess.run(["readelf", "-dW", str(lib)], capture_output=True, text=True).stdout


@needs_build
def test_the_guard_compiles_against_cupti_with_its_folder_as_rpath(tmp_path):
    lib = build_cupti_guard(("cudaMemcpy*", "cuMemcpy*", "nccl*", "dlopen"), tmp_path,
                            ("libnccl.so*",))
    assert lib is not None and lib.name == "libcommbench_cupti.so" and lib.exists()
    exports = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                             text=True).stdout
    assert cupti_guard.ARM_SYMBOL in exports and cupti_guard.CHECK_SYMBOL in exports
    dynamic = _readelf(lib)
    assert "libcupti.so" in dynamic and f"[{CUPTI.folder}]" in dynamic
    header = (lib.parent / cupti_guard.HEADER_NAME).read_text()
    assert '"cudaMemcpyAsync"' in header and '"cuMemcpyDtoD"' in header
    assert not [x for x in header.splitlines() if x.startswith("    X(") and "nccl" in x]
    # cached by content: the same inputs give the same file, untouched
    stamp = lib.stat().st_mtime_ns
    assert build_cupti_guard(("cudaMemcpy*", "cuMemcpy*", "nccl*", "dlopen"), tmp_path,
                             ("libnccl.so*",)) == lib
    assert lib.stat().st_mtime_ns == stamp
    assert build_cupti_guard(("cudaMemcpy*",), tmp_path) != lib


@needs_build
def test_nothing_is_built_when_no_pattern_names_a_cuda_function(tmp_path, caplog):
    caplog.set_level("INFO")
    assert build_cupti_guard(("nccl*", "MPI_*", "dlopen"), tmp_path) is None
    assert "no pattern names a CUDA" in caplog.text
    assert not any(tmp_path.iterdir())


def test_without_cupti_nothing_is_built_and_the_reason_is_logged(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(cupti_guard, "find_cupti", lambda: None)
    assert build_cupti_guard(("cudaMemcpy*",), tmp_path) is None
    assert "no CUPTI" in caplog.text or "x86-64 only" in caplog.text


def test_a_trusted_glob_is_a_file_name_glob(tmp_path):
    with pytest.raises(ValueError):
        build_cupti_guard(("cudaMemcpy*",), tmp_path, ('lib"; evil',))


# -- the cheat: only the run-time guard can catch it ----------------------------------------------

@needs_nvcc
def test_the_elf_cheat_merges_builds_and_passes_the_static_check(tmp_path):
    from pytest_commbench import regions
    from pytest_commbench.build import linked_names
    from pytest_commbench.tasks import load_task
    from pytest_commbench.toolchains.nvidia import build_cuda

    spec = tomllib.loads((CHEAT / "cheat.toml").read_text())
    assert spec["expect"] == ["forbidden"]
    task = load_task(REPO / "suites" / spec["task"] / "task.toml", REPO / "suites")
    assert "cudaMemcpy*" in task.forbid
    template = (REPO / "suites" / spec["task"] / "template.cu").read_text()
    source = regions.merge_reply(template, (CHEAT / spec["task"] / "solution.cu").read_text())
    artifact = build_cuda(task, source, tmp_path, "sm_90")  # raises Rejected if refused
    names = linked_names(artifact.path)
    assert not any(n.startswith(("cudaMemcpy", "cuMemcpy", "dl")) for n in names), names


# -- on the GPU -------------------------------------------------------------------------------------

PROBE = r"""
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commbench.h"

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(3); } } while (0)

static size_t n = 1 << 20;

static void CUDART_CB host_fn(void *p) { (*(int *)p)++; }

static void *harness_thread(void *arg) {  /* the harness's own thread: its calls pass */
    void *d = NULL;
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc(&d, n));
    CHECK(cudaMemcpy(d, arg, n, cudaMemcpyDeviceToDevice));
    CHECK(cudaFree(d));
    return NULL;
}

/* argv: mode guard [solution]. "harness": the harness's calls only; "fixture": the solution's
 * commbench_run; else a function of that name in the solution. */
int main(int argc, char **argv) {
    const char *mode = argv[1], *solution = argc > 3 ? argv[3] : "/nonexistent/libsolution.so";
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(0));
    void *guard = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!guard) { fprintf(stderr, "%s\n", dlerror()); return 4; }
    int (*arm)(const char *) = (int (*)(const char *))dlsym(guard, "commbench_guard_cupti_arm");
    int (*check)(void) = (int (*)(void))dlsym(guard, "commbench_guard_cupti_check");
    if (arm(solution) != 0) return 5;

    char *host = calloc(1, n);
    void *a = NULL, *b = NULL;
    cudaStream_t s;
    cudaEvent_t ev;
    int count = 0;
    CHECK(cudaMalloc(&a, n));
    CHECK(cudaMalloc(&b, n));
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemcpy(a, host, n, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s));
    CHECK(cudaMemsetAsync(b, 0, n, s));
    CHECK(cudaEventCreate(&ev));
    CHECK(cudaEventRecord(ev, s));
    CHECK(cudaLaunchHostFunc(s, host_fn, &count));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaEventSynchronize(ev));
    pthread_t t;
    pthread_create(&t, NULL, harness_thread, a);
    pthread_join(t, NULL);
    if (check() != 0) return 6;
    if (strcmp(mode, "harness") == 0) {
        printf("harness calls passed (%d)\n", count);
        return 0;
    }
    void *lib = dlopen(solution, RTLD_NOW | RTLD_GLOBAL);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 7; }
    int r;
    if (strcmp(mode, "fixture") == 0) {
        commbench_ctx ctx;
        memset(&ctx, 0, sizeof ctx);
        ctx.world_size = 1;
        ctx.stream = s;
        ctx.num_buffers = 2;
        ctx.buffers[0] = ctx.peer_buffers[0][0] = a;
        ctx.buffers[1] = ctx.peer_buffers[0][1] = b;
        ctx.buffer_bytes[0] = ctx.buffer_bytes[1] = n;
        int (*run)(const commbench_ctx *) = (int (*)(const commbench_ctx *))dlsym(lib, "commbench_run");
        r = run(&ctx);
    } else {
        int (*go)(void *, void *, size_t, void *) =
            (int (*)(void *, void *, size_t, void *))dlsym(lib, mode);
        if (!go) { fprintf(stderr, "no %s\n", mode); return 8; }
        r = go(b, a, n, s);
    }
    CHECK(cudaDeviceSynchronize());
    check();
    printf("%s returned %d and was not stopped\n", mode, r);
    return 0;
}
"""

# Test solutions: each finds a forbidden function some way (here simply with dlsym: the static
# check is not what is tested) and calls it.
SOLUTION = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct query { const char *prefix; char path[4096]; };

static int visit(struct dl_phdr_info *info, size_t size, void *data) {
    struct query *q = data;
    const char *base = strrchr(info->dlpi_name, '/');
    (void)size;
    base = base ? base + 1 : info->dlpi_name;
    if (strncmp(base, q->prefix, strlen(q->prefix)) != 0) return 0;
    strncpy(q->path, info->dlpi_name, sizeof q->path - 1);
    return 1;
}

/* `name` in the loaded library whose file name starts with `prefix` */
static void *in_library(const char *prefix, const char *name) {
    struct query q = {prefix, ""};
    dl_iterate_phdr(visit, &q);
    void *h = q.path[0] ? dlopen(q.path, RTLD_LAZY | RTLD_NOLOAD) : NULL;
    return h ? dlsym(h, name) : NULL;
}

typedef int (*copy_fn)(void *, const void *, size_t, int, void *);

int runtime_copy(void *dst, void *src, size_t n, void *s) {
    copy_fn f = (copy_fn)in_library("libcudart.so", "cudaMemcpyAsync");
    return f ? f(dst, src, n, 3, s) : -1;
}

int driver_copy(void *dst, void *src, size_t n, void *s) {
    int (*f)(uint64_t, uint64_t, size_t) =
        (int (*)(uint64_t, uint64_t, size_t))in_library("libcuda.so", "cuMemcpyDtoD_v2");
    (void)s;
    return f ? f((uint64_t)(uintptr_t)dst, (uint64_t)(uintptr_t)src, n) : -1;
}

static void *copier(void *arg) {
    void **p = arg;
    *(int *)p[4] = runtime_copy(p[0], p[1], (size_t)(uintptr_t)p[2], p[3]);
    return NULL;
}

int own_thread(void *dst, void *src, size_t n, void *s) {
    int r = -1;
    void *args[5] = {dst, src, (void *)(uintptr_t)n, s, &r};
    pthread_t t;
    pthread_create(&t, NULL, copier, args);
    pthread_join(t, NULL);
    return r;
}

int thread_start(void *dst, void *src, size_t n, void *s) {
    /* a thread whose start routine is the forbidden function (one pointer argument) */
    static void *event;
    void *(*start)(void *) = (void *(*)(void *))in_library("libcudart.so", "cudaEventCreate");
    pthread_t t;
    (void)dst; (void)src; (void)n; (void)s;
    if (!start || pthread_create(&t, NULL, start, &event) != 0) return -1;
    pthread_join(t, NULL);
    return 0;
}

int runtime_alloc(void *dst, void *src, size_t n, void *s) {
    /* an allowed runtime function that calls a forbidden driver function to do its work */
    int (*alloc)(void **, size_t) = (int (*)(void **, size_t))in_library("libcudart.so", "cudaMalloc");
    int (*release)(void *) = (int (*)(void *))in_library("libcudart.so", "cudaFree");
    void *p = NULL;
    (void)dst; (void)src; (void)s;
    if (!alloc || !release || alloc(&p, n) != 0) return -1;
    return release(p);
}

int driver_alloc(void *dst, void *src, size_t n, void *s) {
    int (*alloc)(uint64_t *, size_t) =
        (int (*)(uint64_t *, size_t))in_library("libcuda.so", "cuMemAlloc_v2");
    uint64_t p = 0;
    (void)dst; (void)src; (void)s;
    return alloc ? alloc(&p, n) : -1;
}

int through_library(void *dst, void *src, size_t n, void *s) {
    int (*f)(void *, const void *, size_t) =
        (int (*)(void *, const void *, size_t))in_library("libnccl.so", "lib_copy");
    (void)s;
    return f ? f(dst, src, n) : -1;
}

int switch_off(void *dst, void *src, size_t n, void *s) {
    int (*finalize)(void) = (int (*)(void))in_library("libcupti.so", "cuptiFinalize");
    (void)dst; (void)src; (void)n; (void)s;
    return finalize ? finalize() : -1;
}
"""

# A stand-in for a library the task lets the solution use that copies with cudaMemcpy itself.
LIBRARY = r"""
#include <cuda_runtime_api.h>
int lib_copy(void *dst, const void *src, size_t n) {
    return cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice);
}
"""

PATTERNS = ("cudaMemcpy*", "cuMemcpy*", "cudaEvent*", "cudaMemset*", "cudaLaunchHostFunc",
            "nccl*", "dlopen", "dlsym")


@pytest.fixture(scope="module")
def gpu_kit(tmp_path_factory):
    """The probe, the test solutions and the stand-in library, built once."""
    from pytest_commbench.build import INCLUDE_DIR
    from pytest_commbench.toolchains.nvidia import cuda_runtime_dir

    root = tmp_path_factory.mktemp("cupti_kit")
    runtime = cuda_runtime_dir()
    if runtime is None:
        pytest.skip("no libcudart (the CUDA toolkit) found")
    inc = [f"-I{i}" for i in CUPTI.includes]
    link = [f"-L{runtime}", "-lcudart", f"-Wl,-rpath,{runtime}"]
    for name, text in (("probe.c", PROBE), ("solution.c", SOLUTION), ("library.c", LIBRARY)):
        (root / name).write_text(text)
    (root / "trusted").mkdir()
    steps = [
        [GCC, "-O1", *inc, f"-I{INCLUDE_DIR}", "-o", str(root / "probe"), str(root / "probe.c"),
         *link, "-ldl", "-lpthread"],
        [GCC, "-O1", "-shared", "-fPIC", "-o", str(root / "libsolution.so"),
         str(root / "solution.c"), "-ldl", "-lpthread"],
        [GCC, "-O1", "-shared", "-fPIC", *inc, "-o", str(root / "trusted" / "libnccl.so.2"),
         str(root / "library.c"), *link],
    ]
    for cmd in steps:
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, (cmd, done.stderr)
    return root


def _probe(kit: Path, guard: Path, mode: str, solution: Path | None, tmp_path: Path,
           preload: Path | None = None) -> tuple[int, str, dict | None]:
    import os

    report = tmp_path / "guard_r%r.json"
    env = {**os.environ, "COMMBENCH_GUARD_REPORT": str(report), "OMPI_COMM_WORLD_RANK": "3"}
    if preload is not None:
        env["LD_PRELOAD"] = str(preload)
    cmd = [str(kit / "probe"), mode, str(guard)] + ([str(solution)] if solution else [])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    written = tmp_path / "guard_r3.json"
    first = written.read_text().splitlines()[0] if written.exists() else None
    return done.returncode, done.stdout + done.stderr, json.loads(first) if first else None


@needs_gpu
def test_the_harness_calls_pass_with_every_cuda_function_forbidden(gpu_kit, tmp_path):
    guard = build_cupti_guard(("cuda*", "cu*"), tmp_path / "cache")
    rc, out, report = _probe(gpu_kit, guard, "harness", None, tmp_path)
    assert (rc, report) == (0, None), out


@needs_gpu
@needs_nvcc
def test_the_elf_cheat_is_stopped_at_its_copy(gpu_kit, tmp_path):
    """The fixture as the harness builds it: cudaMemcpyAsync found in libcudart's file."""
    from pytest_commbench import regions
    from pytest_commbench.build import expand_forbid, native_forbid
    from pytest_commbench.tasks import load_task
    from pytest_commbench.toolchains.nvidia import build_cuda

    spec = tomllib.loads((CHEAT / "cheat.toml").read_text())
    task = load_task(REPO / "suites" / spec["task"] / "task.toml", REPO / "suites")
    template = (REPO / "suites" / spec["task"] / "template.cu").read_text()
    source = regions.merge_reply(template, (CHEAT / spec["task"] / "solution.cu").read_text())
    artifact = build_cuda(task, source, tmp_path / "build", "sm_90")
    guard = build_cupti_guard(native_forbid(expand_forbid(task.forbid)), tmp_path / "cache")
    rc, out, report = _probe(gpu_kit, guard, "fixture", artifact.path, tmp_path)
    assert rc == cupti_guard.GUARD_EXIT, out
    assert report["forbidden"] == "cudaMemcpyAsync", report
    assert "libsolution.so" in report["detail"]


@needs_gpu
@pytest.mark.parametrize("mode, function", [
    ("runtime_copy", "cudaMemcpyAsync"),       # found in libcudart by the solution
    ("driver_copy", "cuMemcpyDtoD"),           # the driver's copy, found in libcuda
    ("own_thread", "cudaMemcpyAsync"),         # from a thread the solution started
    ("thread_start", "cudaEventCreate"),       # a thread that starts in the forbidden function
])
def test_a_forbidden_call_of_the_solution_ends_the_process_with_a_report(
        gpu_kit, tmp_path, mode, function):
    guard = build_cupti_guard(PATTERNS, tmp_path / "cache")
    rc, out, report = _probe(gpu_kit, guard, mode, gpu_kit / "libsolution.so", tmp_path)
    assert rc == cupti_guard.GUARD_EXIT, out
    assert report is not None and report["forbidden"] == function, (report, out)


@needs_gpu
def test_the_runtimes_own_driver_calls_are_not_the_solutions(gpu_kit, tmp_path):
    """cudaMalloc allocates with cuMemAlloc (and looks driver functions up with
    cuGetProcAddress): with those forbidden, the solution's cudaMalloc passes, its own
    cuMemAlloc does not."""
    guard = build_cupti_guard(("cuMemAlloc*", "cuMemFree*", "cuGetProcAddress*"),
                              tmp_path / "cache")
    solution = gpu_kit / "libsolution.so"
    rc, out, report = _probe(gpu_kit, guard, "runtime_alloc", solution, tmp_path)
    assert (rc, report) == (0, None), out
    rc, out, report = _probe(gpu_kit, guard, "driver_alloc", solution, tmp_path)
    assert rc == cupti_guard.GUARD_EXIT and report["forbidden"] == "cuMemAlloc", (report, out)


@needs_gpu
def test_a_trusted_librarys_own_call_passes_and_an_untrusted_ones_does_not(gpu_kit, tmp_path):
    lib = gpu_kit / "trusted" / "libnccl.so.2"
    solution = gpu_kit / "libsolution.so"
    trusted = build_cupti_guard(PATTERNS, tmp_path / "cache", ("libnccl.so*",))
    rc, out, report = _probe(gpu_kit, trusted, "through_library", solution, tmp_path,
                             preload=lib)
    assert (rc, report) == (0, None), out
    plain = build_cupti_guard(PATTERNS, tmp_path / "cache")
    rc, out, report = _probe(gpu_kit, plain, "through_library", solution, tmp_path,
                             preload=lib)
    assert rc == cupti_guard.GUARD_EXIT and report["forbidden"] == "cudaMemcpy", (report, out)


@needs_gpu
def test_a_guard_switched_off_is_reported_at_the_check(gpu_kit, tmp_path):
    guard = build_cupti_guard(PATTERNS, tmp_path / "cache")
    rc, out, report = _probe(gpu_kit, guard, "switch_off", gpu_kit / "libsolution.so", tmp_path)
    assert rc == cupti_guard.GUARD_EXIT, out
    assert report["forbidden"] == "cupti", report


CUPY_HARNESS = r"""
import ctypes, gc, sys, threading
import cupy, numpy
guard = ctypes.CDLL(sys.argv[1])
assert guard.commbench_guard_cupti_arm(b"/nonexistent/libsolution.so") == 0
x = cupy.asarray(numpy.arange(1 << 20, dtype=numpy.float32))
y = (x * 2 + 1).sum()
s = cupy.cuda.Stream(non_blocking=True)
with s:
    z = cupy.empty_like(x)
    z.set(numpy.ones(1 << 20, dtype=numpy.float32), stream=s)
    e = cupy.cuda.Event()
    e.record(s)
e.synchronize()
cupy.cuda.runtime.memcpy(z.data.ptr, x.data.ptr, x.nbytes, cupy.cuda.runtime.memcpyDefault)
out = z.get()
def work():
    w = cupy.ones(1024); w.get()
t = threading.Thread(target=work); t.start(); t.join()
del e, z
gc.collect()
cupy.cuda.runtime.deviceSynchronize()
assert guard.commbench_guard_cupti_check() == 0
print("cupy harness passed", float(y))
"""


@needs_gpu
def test_cupy_as_the_harness_uses_it_passes(tmp_path):
    probe = subprocess.run([sys.executable, "-c", "import cupy"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cupy is not installed for this Python")
    guard = build_cupti_guard(("cuda*", "cu*"), tmp_path / "cache")
    import os

    env = {**os.environ, "COMMBENCH_GUARD_REPORT": str(tmp_path / "guard_r%r.json")}
    done = subprocess.run([sys.executable, "-c", CUPY_HARNESS, str(guard)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not list(tmp_path.glob("guard_r*.json"))


CUPY_PROXY = r"""
import ctypes, sys
import cupy, numpy
guard = ctypes.CDLL(sys.argv[1])
assert guard.commbench_guard_cupti_arm(b"/nonexistent/libsolution.so") == 0
x = cupy.asarray(numpy.arange(1 << 20, dtype=numpy.float32))
z = cupy.empty_like(x)
cupy.cuda.runtime.memcpy(z.data.ptr, x.data.ptr, x.nbytes, cupy.cuda.runtime.memcpyDefault)
guard.commbench_guard_cupti_window(1)  # the solution's call runs: the harness calls nothing
# the interpreter as the solution's proxy (a native answer that replaced a harness function
# and drives cupy through it): the same call, inside the window
cupy.cuda.runtime.memcpy(z.data.ptr, x.data.ptr, x.nbytes, cupy.cuda.runtime.memcpyDefault)
print("the copy inside the window passed")
"""


@needs_gpu
def test_inside_the_call_window_no_frame_is_the_harness(tmp_path):
    """The interpreter as a proxy: a forbidden call made through cupy passes outside the call
    window (the harness's own) and is the solution's inside it, whatever the stack shows."""
    probe = subprocess.run([sys.executable, "-c", "import cupy"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cupy is not installed for this Python")
    guard = build_cupti_guard(("cudaMemcpy*",), tmp_path / "cache")
    import os

    env = {**os.environ, "COMMBENCH_GUARD_REPORT": str(tmp_path / "guard_r%r.json"),
           "OMPI_COMM_WORLD_RANK": "0"}
    done = subprocess.run([sys.executable, "-c", CUPY_PROXY, str(guard)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == cupti_guard.GUARD_EXIT, done.stdout + done.stderr
    assert "passed" not in done.stdout
    report = json.loads((tmp_path / "guard_r0.json").read_text().splitlines()[0])
    assert report["forbidden"] == "cudaMemcpy", report
    assert "while the solution's call ran" in report["detail"], report


CUPY_GRAPH = r"""
import ctypes, sys
import cupy, numpy
guard = ctypes.CDLL(sys.argv[1])
assert guard.commbench_guard_cupti_arm(b"/nonexistent/libsolution.so") == 0
x = cupy.asarray(numpy.arange(1 << 20, dtype=numpy.float32))
z = cupy.empty_like(x)
s = cupy.cuda.Stream(non_blocking=True)
s.begin_capture()  # the copy function is called here, outside the window: the harness's
z.data.copy_from_device_async(x.data, x.nbytes, stream=s)
graph = s.end_capture()
graph.launch(stream=s)  # outside the window: a copy of the harness's
s.synchronize()
assert guard.commbench_guard_cupti_check() == 0
print("outside the window: passed", flush=True)
guard.commbench_guard_cupti_window(1)
graph.launch(stream=s)  # a memcpy node, no copy function called
s.synchronize()
guard.commbench_guard_cupti_window(0)
guard.commbench_guard_cupti_check()
print("inside the window: passed")
"""


@needs_gpu
def test_a_copy_the_device_made_in_the_call_window_is_forbidden_by_any_route(tmp_path):
    """The task forbids the copy functions: a CUDA graph's memcpy node launched while the
    solution's call runs is a forbidden copy (CUPTI's activity records), the same graph
    launched outside the window passes."""
    probe = subprocess.run([sys.executable, "-c", "import cupy"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cupy is not installed for this Python")
    guard = build_cupti_guard(("cudaMemcpy*", "cuMemcpy*"), tmp_path / "cache")
    import os

    env = {**os.environ, "COMMBENCH_GUARD_REPORT": str(tmp_path / "guard_r%r.json"),
           "OMPI_COMM_WORLD_RANK": "0"}
    done = subprocess.run([sys.executable, "-c", CUPY_GRAPH, str(guard)], capture_output=True,
                          text=True, timeout=300, env=env)
    out = done.stdout + done.stderr
    assert "outside the window: passed" in done.stdout, out
    assert done.returncode == cupti_guard.GUARD_EXIT, out
    assert "inside the window: passed" not in done.stdout, out
    report = json.loads((tmp_path / "guard_r0.json").read_text().splitlines()[0])
    assert report["forbidden"] == "copy-engine", report
