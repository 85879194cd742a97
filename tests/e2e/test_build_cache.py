"""The build cache shared between runs (`--commbench-build-cache`, `commbench compile --cache`):
a source is built once however many threads or runs ask for it at the same time, a second
run finds it again, a build leaves nothing half-written behind, and a build's key (its folder)
is made of the same inputs from one version of the harness to the next."""

from __future__ import annotations

import os
import shutil
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pytest_commbench import build
from pytest_commbench.tasks import load_task
from pytest_commbench.toolchains import amd, nvidia
from pytest_commbench.toolchains.nvidia import DEVICE_FINDINGS, build_cuda

REPO = Path(__file__).resolve().parents[2]
TASK = "p2p/flag_pingpong"

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


@pytest.fixture
def compiler(tmp_path, monkeypatch) -> Path:
    """A stand-in for nvcc that builds an empty shared object where `-o` says, slowly enough
    for builds to overlap, and counts its calls (one line each)."""
    calls = tmp_path / "calls"
    fake = tmp_path / "nvcc"
    fake.write_text(f"""#!/bin/sh
out=""
while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out=$2; shift; done
echo call >> {calls}
sleep 0.3
exec cc -shared -x c /dev/null -o "$out"
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("COMMBENCH_NVCC", str(fake))
    return calls


def _task():
    return load_task(REPO / "suites" / TASK / "task.toml", REPO / "suites")


def test_threads_building_one_source_share_one_library(tmp_path, compiler):
    task, source = _task(), (REPO / "references" / TASK / "solution.cu").read_text()
    cache = tmp_path / "cache"
    with ThreadPoolExecutor(4) as pool:
        artifacts = list(pool.map(lambda _: build_cuda(task, source, cache, "sm_90"), range(4)))
    assert len({a.path for a in artifacts}) == 1
    (folder,) = cache.iterdir()
    # the library and what its device code was found to use; no .build-* folder left
    assert sorted(p.name for p in folder.iterdir()) == [DEVICE_FINDINGS, "libsolution.so"]
    built = len(compiler.read_text().splitlines())
    assert 1 <= built <= 4
    # found again: no further compiler call
    again = build_cuda(task, source, cache, "sm_90")
    assert again.path == artifacts[0].path
    assert len(compiler.read_text().splitlines()) == built


def test_a_failed_build_leaves_no_library_and_no_work_folder(tmp_path, compiler, monkeypatch):
    from pytest_commbench.verdicts import Rejected, Verdict

    broken = tmp_path / "broken-nvcc"
    broken.write_text("#!/bin/sh\necho 'solution.cu(3): error: expected a ;' >&2\nexit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("COMMBENCH_NVCC", str(broken))
    cache = tmp_path / "cache"
    with pytest.raises(Rejected) as info:
        build_cuda(_task(), "int main(", cache, "sm_90")
    assert info.value.verdict is Verdict.COMPILE_ERROR
    assert "expected a ;" in info.value.message
    (folder,) = cache.iterdir()
    assert list(folder.iterdir()) == []


def test_a_second_run_reuses_the_build_cache(bench, tmp_path):
    bench.add_task("collective/ring_allreduce")
    cache = tmp_path / "shared-build"
    first = bench.run("--platform=cpu", "--commbench-model=reference",
                      f"--commbench-build-cache={cache}")
    first.assert_outcomes(passed=1)
    kept = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    assert kept, "nothing was built into the cache"
    second = bench.run("--platform=cpu", "--commbench-model=reference",
                       f"--commbench-build-cache={cache}")
    second.assert_outcomes(passed=1)
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()} == kept
    # the runs' own folders hold no build of their own
    assert not list((bench.root / "runs").glob("*/build"))


def test_an_unwritable_build_cache_is_a_usage_error(bench, tmp_path):
    bench.add_task("collective/ring_allreduce")
    blocked = tmp_path / "file"
    blocked.write_text("")
    result = bench.run("--platform=cpu", "--commbench-model=reference",
                       f"--commbench-build-cache={blocked / 'cache'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "build cache" in result.stderr.str()
    assert os.path.exists(blocked)


@pytest.mark.parametrize("platform, arch, cls", [
    ("h200", None, "nvidia.NvidiaPlatform"), ("mi325x", "gfx90a", "amd.AmdPlatform"),
    ("h200-hip", None, "nvidia.NvidiaPlatform")])
def test_commbench_compile_builds_through_the_platforms_own_door(monkeypatch, capsys, platform,
                                                                 arch, cls, tmp_path):
    """`commbench compile` builds each source as an item would: the platform's `build` (its
    vendor's toolchain, for the profile's architecture or `--arch`), never a toolchain the
    command picks itself; without `--cache` into a throw-away folder that is gone afterwards."""
    import importlib
    import tempfile

    from pytest_commbench.cli import main

    module, name = cls.split(".")
    kind = getattr(importlib.import_module(f"pytest_commbench.platforms.{module}"), name)
    seen, caches = [], set()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def build(self, task, source, cache):
        (cache / task.relpath.replace("/", "_")).write_text(source)  # what a build leaves
        caches.add(cache)
        seen.append((self.name, self.profile.arch, task.language))
    monkeypatch.setattr(kind, "build", build)
    select = "flag_pingpong_hip" if platform != "h200" else "d2h_bounce_copy"
    args = ["compile", "suites", "--references", "references", "--platform", platform,
            "-k", select, "-j", "1"] + (["--arch", arch] if arch else [])
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert main(args) == 0
    want_arch = arch or {"h200": "sm_90", "h200-hip": "sm_90", "mi325x": "gfx942"}[platform]
    assert len(seen) >= 3 and {s[:2] for s in seen} == {(platform, want_arch)}, seen
    assert "0 failed" in capsys.readouterr().out
    (cache,) = caches
    assert cache.parent == tmp_path and not cache.exists() and not list(tmp_path.iterdir())


class _Keyed(Exception):
    """A build stopped where it names its cached folder (the folder's name is the build key)."""


@pytest.fixture
def build_keys(monkeypatch):
    """Builds that stop before any compiler runs, and the keys they asked for, in order."""
    seen = []

    def stop(folder, name, source, make):
        seen.append(folder.name)
        raise _Keyed

    monkeypatch.setattr(nvidia, "_built", stop)
    monkeypatch.setattr(amd, "_built", stop)
    return seen


def _keyed(build_keys, recipe, *args) -> str:
    with pytest.raises(_Keyed):
        recipe(*args)
    return build_keys.pop()


SOURCE = "extern \"C\" int commbench_run(const void*) { return 0; }\n"


def test_build_keys_are_made_of_the_same_inputs(build_keys, tmp_path, monkeypatch):
    """A build's key (its folder in a shared cache) is the digest of the recipe's version and
    of everything that goes into the build, in this order: keys kept by an earlier version of
    the harness still name the same builds. The recipe versions change only on purpose (every
    cached build is then made again)."""
    assert (build.RECIPE_VERSION, nvidia.CUDA_RECIPE_VERSION, amd.HIP_RECIPE_VERSION) \
        == ("py-2", "cu-2", "hip-1")
    digest = build.digest
    header = "".join(p.read_text() for p in sorted(build.INCLUDE_DIR.glob("*.h")))
    on_cuda = "".join(p.read_text() for p in sorted(nvidia.HIP_ON_CUDA_DIR.rglob("*.h")))

    def task(relpath):
        return load_task(REPO / "suites" / relpath / "task.toml", REPO / "suites")

    cuda, hip, tk = task(TASK), task(TASK + "_hip"), task("collective/tk_allgather")
    assert _keyed(build_keys, nvidia.build_cuda, cuda, SOURCE, tmp_path, "sm_90") == digest(
        "cu-2", "sm_90", TASK, "cuda", cuda.library, *cuda.requires, header, "", SOURCE)
    # a HIP task through the HIP->CUDA header
    assert _keyed(build_keys, nvidia.build_cuda, hip, SOURCE, tmp_path, "sm_90") == digest(
        "cu-2", "sm_90", TASK + "_hip", "hip", hip.library, *hip.requires, header + on_cuda,
        "", SOURCE)
    # ThunderKittens: what its headers hold, wherever they lie
    kittens = tmp_path / "kittens"
    kittens.mkdir()
    (kittens / "kittens.cuh").write_text("// kittens\n")
    monkeypatch.setenv(nvidia.THUNDERKITTENS_ENV, str(kittens))
    assert _keyed(build_keys, nvidia.build_cuda, tk, SOURCE, tmp_path, "sm_90") == digest(
        "cu-2", "sm_90", tk.relpath, "cuda", tk.library, *tk.requires, header,
        digest("kittens.cuh", b"// kittens\n".hex()), SOURCE)
    toolchain = "rocm" if amd.rocm_path() else "debian"
    assert _keyed(build_keys, amd.build_hip, hip, SOURCE, tmp_path, "gfx942") == digest(
        "hip-1", "gfx942", toolchain, TASK + "_hip", hip.library, *hip.requires, header, SOURCE)
    python = task("collective/binomial_bcast")
    assert build.build_python(python, "x = 1\n", tmp_path).digest == digest(
        "py-2", "collective/binomial_bcast", "x = 1\n")
