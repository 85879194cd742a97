"""An answer's compilers run in a job's sandbox: a compiler reads whatever file its source names
(`#include`, `.incbin`, `#embed`), so a native answer could otherwise build the hidden
reference into itself, or quote it back in its compile errors. Checked with the C compiler
(every machine) and end to end with a HIP task built for gfx942 (where Debian's toolchain
is)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_commbench import build, sandbox
from pytest_commbench.build import DEBIAN_DEVICE_LIBS, jailed, paths_named, rocm_path
from pytest_commbench.engine.job import compile_jail
from pytest_commbench.settings import RunSettings, Settings
from pytest_commbench.verdicts import Rejected, Verdict

CC = next((c for c in ("cc", "gcc", "clang-19", "clang") if shutil.which(c)), None)
needs_sandbox = pytest.mark.skipif(sandbox.probe() is not None, reason=str(sandbox.probe()))
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler here")


def test_the_jail_keeps_the_folders_the_recipe_names_and_not_the_builds_own(tmp_path):
    work, inc, lib = tmp_path / "work", tmp_path / "inc", tmp_path / "lib"
    for d in (work, inc, lib):
        d.mkdir()
    (lib / "libx.so").write_text("")
    cmd = ["nvcc", "-I", str(inc), f"-L{lib}", f"-Xlinker=-rpath={lib}", "-o",
           str(work / "libsolution.so"), str(work / "solution.cu"), "-l:libx.so",
           f"--rocm-device-lib-path={inc}", str(lib / "libx.so"), "/no/such/folder"]
    assert paths_named(cmd, work) == [str(inc), str(lib)]


def _settings(tmp_path: Path, unsandboxed: bool = False) -> Settings:
    refs = tmp_path / "project" / "references"
    refs.mkdir(parents=True)
    return Settings.for_item(RunSettings(unsandboxed=unsandboxed), seed=1,
                             work=tmp_path / "runs" / "r" / "item", cache=tmp_path / "cache",
                             references=refs)


@needs_sandbox
@needs_cc
def test_a_jailed_compiler_cannot_read_the_references_but_reads_the_recipes_folders(tmp_path):
    settings = _settings(tmp_path)
    secret = settings.references / "collective" / "t" / "solution.cu"
    secret.parent.mkdir(parents=True)
    secret.write_text("the reference\n")
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "given.h").write_text("#define GIVEN 1\n")

    def compile_(source: str, jail) -> None:
        work = settings.cache / "k" / ".build-x"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        (work / "s.c").write_text(source)
        with jailed(jail):
            build._compile([CC, "-fPIC", "-shared", "-I", str(inc), "-o", str(work / "lib.so"),
                            str(work / "s.c")], work)

    leak = f'#include "given.h"\n__asm__(".section .rodata\\n.incbin \\"{secret}\\"\\n.previous");\n'
    compile_(leak, None)  # without the jail the reference is built into the answer
    with pytest.raises(Rejected) as caught:
        compile_(leak, compile_jail(settings))
    assert caught.value.verdict == Verdict.COMPILE_ERROR
    assert "the reference" not in (caught.value.detail or "") + caught.value.message
    for source in (f'#include "{secret}"\n', f'#if __has_include("{secret}")\n#error seen\n#endif\n'
                   "int x;\n"):
        if source.startswith("#include"):
            with pytest.raises(Rejected, match="does not compile"):
                compile_(source, compile_jail(settings))
        else:
            compile_(source, compile_jail(settings))  # the file is not there to be seen
    compile_('#include "given.h"\nint given = GIVEN;\n', compile_jail(settings))
    assert compile_jail(_settings(tmp_path / "u", unsandboxed=True)) is None


HIP_TASK = "p2p/flag_pingpong_hip"


@needs_sandbox
@pytest.mark.skipif(rocm_path() is None and not (shutil.which("clang++-19")
                                                 and DEBIAN_DEVICE_LIBS.is_dir()),
                    reason="no HIP compiler here (ROCm, or Debian's clang-19 and ROCm packages)")
def test_an_answer_that_builds_the_reference_into_itself_is_a_compile_error(bench):
    """The sample cheat of its class: an answer whose editable region has the assembler
    include the hidden reference's file. Built for gfx942 (compile only), it is a compile
    error; the same answer without a sandbox builds."""
    from conftest import REPO

    bench.add_task(HIP_TASK, ranks=2)
    reference = bench.root / "references" / HIP_TASK / "solution.hip"
    text = (REPO / "references" / HIP_TASK / "solution.hip").read_text()
    marker = next(line for line in text.splitlines() if ">>> COMMBENCH EDIT" in line)
    folder = bench.root / "answers" / HIP_TASK
    folder.mkdir(parents=True)
    (folder / "solution.hip").write_text(text.replace(
        marker, marker + f'\n__asm__(".section .rodata\\n.incbin \\"{reference}\\"\\n.previous");', 1))
    answer = f"--commbench-model=dir:{bench.root / 'answers'}"
    result = bench.run("--platform=mi325x", "--commbench-compile-only", answer)
    result.assert_outcomes(failed=1)
    record = bench.records()[-1]
    assert record["verdict"] == "compile_error", record
    bench.run("--platform=mi325x", "--commbench-compile-only", "--commbench-unsandboxed",
              answer).assert_outcomes(passed=1)


@needs_sandbox
@needs_cc
def test_a_source_that_reads_an_endless_file_is_a_compile_error_within_the_memory_limit(
        tmp_path, monkeypatch):
    """`#include "/dev/zero"`: the compiler reads until its memory limit stops it (1 GiB
    here), and the answer's verdict is compile_error, the machine's memory untouched."""
    from pytest_commbench.engine import job

    monkeypatch.setattr(job, "COMPILE_DATA_BYTES", 1 << 30)
    settings = _settings(tmp_path)
    work = settings.cache / "k" / ".build-x"
    work.mkdir(parents=True)
    (work / "s.c").write_text('#include "/dev/zero"\n')
    with jailed(compile_jail(settings)), pytest.raises(Rejected) as caught:
        build._compile([CC, "-c", "-o", str(work / "s.o"), str(work / "s.c")], work)
    assert caught.value.verdict == Verdict.COMPILE_ERROR, caught.value.message


@needs_cc
def test_a_flood_of_compile_errors_is_read_in_a_bounded_part(tmp_path):
    """A source made to print megabytes of errors: its output goes to a file of the build's
    own, of which the controller reads the head (the first error) and the tail (the detail)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "s.c").write_text("int first_bad = ;\n" + "int bad = ;\n" * 50_000)
    with pytest.raises(Rejected) as caught:
        build._compile([CC, "-c", "-o", str(work / "s.o"), str(work / "s.c")], work)
    assert caught.value.verdict == Verdict.COMPILE_ERROR
    assert "s.c:1:" in caught.value.message and "error" in caught.value.message
    assert 0 < len(caught.value.detail) <= build.LOG_TAIL
    assert not (work / build.COMPILER_LOG).exists()  # the file goes with the build
