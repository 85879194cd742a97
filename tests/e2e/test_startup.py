"""The user's own command: `pytest` from the repository root runs the suites; a run that
cannot do what it was asked is refused before any item runs (one line each, exit status 4);
kept replies are judged without a key; a contended host pays no extra timing rounds;
`commbench doctor`. (What a session says of itself on the fake runner: tests/unit/
test_session_says.py.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_pytest_from_the_repository_root_runs_the_suites():
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    items = [line for line in done.stdout.splitlines() if "task.toml::" in line]
    manifests = list((REPO / "suites").rglob("task.toml"))
    assert done.returncode == 0, done.stdout[-2000:]
    assert items and all(line.startswith("suites/") for line in items)
    assert {line.split("::")[0] for line in items} == {
        str(m.relative_to(REPO)) for m in manifests}
    assert not any(line.startswith("tests/") for line in done.stdout.splitlines())


def test_a_platform_without_its_devices_is_refused_before_any_item(bench):
    bench.add_task()
    result = bench.run("--platform=mi325x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "platform mi325x needs" in err and "none is visible on this machine" in err
    assert not list((bench.root / "runs").glob("*/results.jsonl"))  # nothing ran


def test_a_model_without_its_key_is_refused_naming_the_variable(bench, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    bench.add_task()
    result = bench.run("--commbench-model=openai:some-model")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "OPENAI_API_KEY, which is not set" in result.stderr.str()


def test_kept_replies_are_judged_without_a_key(bench, monkeypatch):
    """A model whose replies an earlier run kept needs no key to be judged again."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    bench.add_task()
    kept = bench.root / "runs" / "replies" / "openai_some-model" / "collective" / \
        "ring_allreduce" / "s0" / "r1"
    kept.mkdir(parents=True)
    (kept / "reply.md").write_text((REPO / "references" / "collective" / "ring_allreduce" /
                                    "solution.py").read_text())
    (kept / "usage.json").write_text(json.dumps({"tokens_in": 10, "tokens_out": 20}))
    result = bench.run("--commbench-model=openai:some-model")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-2000:]
    assert [r["verdict"] for r in bench.records()] == ["pass"]


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_a_contended_timing_adds_no_rounds(bench):
    """Two ranks and the observer on one CPU: contended whatever the rounds, so none are
    added past the minimum although the precision asked for is out of reach."""
    bench.timed().add_task()
    result = bench.pytester.run(
        "taskset", "-c", str(min(os.sched_getaffinity(0))), sys.executable, "-m", "pytest",
        "suites", "-p", "no:cacheprovider", "--commbench-timing-rounds=1",
        "--commbench-timing-max-rounds=5", "--commbench-timing-precision=0.000001")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-2000:]
    (record,) = bench.records()
    assert record["timing_trust"] == "contended"
    assert record["timing_rounds"] == 1 and record["timing_stopped"] == "contended"
    assert "timing stopped after 1 rounds" in result.stdout.str()


def _doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest_commbench.cli", "doctor",
                           str(REPO / "suites"), *args],
                          capture_output=True, text=True, timeout=300)


def _rows(out: str) -> set[str]:
    """The `what` column of doctor's table."""
    table = out.split("\n\n")[0].splitlines()[2:]
    return {line.split("  ")[0].strip() for line in table}


def test_doctor_says_what_is_found_and_what_can_run():
    from pytest_commbench.profiles import NAMES

    done = _doctor("--platform", "cpu")
    out = done.stdout
    assert {"mpiexec", "mpi4py", "job sandbox", "NVIDIA GPUs", "AMD GPUs"} <= _rows(out)
    assert "nvcc" not in _rows(out)  # the CPU platform builds nothing
    line = next(x for x in out.splitlines() if x.startswith("platform cpu:"))
    runnable = int(line.split(":")[1].split()[0])
    assert (done.returncode == 0) == (runnable > 0)
    assert "skipped" not in out or "task runs on" not in out  # other platforms' tasks: no gap
    hint = next(x for x in out.splitlines() if "--platform NAME lists" in x)
    assert all(name in hint for name in NAMES if name != "cpu")  # h200-hip included


def test_doctor_lists_what_each_vendors_platform_needs_and_what_builds_without_a_gpu():
    """`--platform mi325x`: the AMD rows (GPUs, ROCm, the HIP compiler and device libraries,
    HIP's runtime, RCCL, cupy's ROCm build), none of NVIDIA's, and how many answers
    --commbench-compile-only builds here for gfx942; `--platform h200`: NVIDIA's rows."""
    amd = _doctor("--platform", "mi325x")
    rows = _rows(amd.stdout)
    assert {"AMD GPUs", "ROCm", "HIP compiler", "HIP device libraries", "HIP runtime", "RCCL",
            "cupy for ROCm"} <= rows, amd.stdout
    assert not rows & {"NVIDIA GPUs", "nvcc", "NCCL", "NVSHMEM", "CUPTI", "MPS control"}
    line = next(x for x in amd.stdout.splitlines() if x.startswith("--commbench-compile-only"))
    assert "builds every answer for mi325x (gfx942)" in line and "no GPU needed" in line
    nvidia = _rows(_doctor("--platform", "h200").stdout)
    assert {"NVIDIA GPUs", "nvcc", "CUDA runtime", "NCCL", "NVSHMEM", "CUPTI",
            "MPS control"} <= nvidia
    assert not nvidia & {"AMD GPUs", "HIP compiler", "RCCL"}


def test_doctor_finds_amd_gpus_and_the_hip_build(monkeypatch):
    """The AMD rows read what the platform itself uses: its GPUs (here a fake KFD's two
    MI325X) and the compiler and libraries its recipe builds with."""
    from pytest_commbench import doctor
    from pytest_commbench.platforms import amd

    two = [amd.AmdGpu(node=i + 1, gpu_id=i + 7, gfx="gfx942", device_id=0x74A5, model="MI325X")
           for i in range(2)]
    monkeypatch.setattr(amd, "gpus", lambda: two)
    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    rows = {what: (state, detail) for what, state, detail in doctor.checks("mi325x")}
    assert rows["AMD GPUs"] == ("found", "MI325X (gfx942), MI325X (gfx942)")
    compiler = "found" if amd.rocm_path() or shutil.which("clang++-19") else "missing"
    assert rows["HIP compiler"][0] == compiler
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "")  # HIP shows the process no GPU
    assert dict((w, s) for w, s, _ in doctor.checks("mi325x"))["AMD GPUs"] == "missing"


def test_doctor_names_why_a_gpu_platform_cannot_run_here(monkeypatch):
    from pytest_commbench import doctor
    from pytest_commbench.platforms import nvidia as gpu

    monkeypatch.setattr(gpu, "nvidia_gpus", lambda: [])
    ok, skips, errors = doctor.runnable("h200", REPO / "suites")
    assert ok == 0 and not errors
    assert any("no H200 GPU on this machine" in why for why in skips)
    ok8, skips8, _ = doctor.runnable("h200", REPO / "suites", ranks_per_gpu=8)
    assert any("needs a GPU per rank" in why for why in skips8)
