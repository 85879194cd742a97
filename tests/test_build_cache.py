"""The build cache shared between runs (`--commbench-build-cache`, `commbench compile --cache`):
a source is built once however many threads or runs ask for it at the same time, a second
run finds it again, and a build leaves nothing half-written behind."""

from __future__ import annotations

import os
import shutil
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pytest_commbench.build import DEVICE_FINDINGS, build_cuda
from pytest_commbench.tasks import load_task

REPO = Path(__file__).parent.parent
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
                                                                 arch, cls):
    """`commbench compile` builds each source as an item would: the platform's `build` (its
    vendor's toolchain, for the profile's architecture or `--arch`), never a toolchain the
    command picks itself."""
    import importlib

    from pytest_commbench.cli import main

    module, name = cls.split(".")
    kind = getattr(importlib.import_module(f"pytest_commbench.platforms.{module}"), name)
    seen = []
    monkeypatch.setattr(kind, "build", lambda self, task, source, cache: seen.append(
        (self.name, self.profile.arch, task.language)))
    select = "flag_pingpong_hip" if platform != "h200" else "d2h_bounce_copy"
    args = ["compile", "suites", "--references", "references", "--platform", platform,
            "-k", select, "-j", "1"] + (["--arch", arch] if arch else [])
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    assert main(args) == 0
    want_arch = arch or {"h200": "sm_90", "h200-hip": "sm_90", "mi325x": "gfx942"}[platform]
    assert len(seen) >= 3 and {s[:2] for s in seen} == {(platform, want_arch)}, seen
    assert "0 failed" in capsys.readouterr().out
