"""An answer's compilers run in a job's sandbox: a compiler reads whatever file its source names
(`#include`, `.incbin`, `#embed`), so a native answer could otherwise build the hidden
reference into itself, or quote it back in its compile errors. Checked with the C compiler
(every machine) and end to end with a HIP task built for gfx942 (where Debian's toolchain
is)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_commbench import build, sandbox
from pytest_commbench.build import jailed, paths_named
from pytest_commbench.engine.job import compile_jail
from pytest_commbench.settings import RunSettings, Settings
from pytest_commbench.toolchains.amd import DEBIAN_DEVICE_LIBS, rocm_path
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
def test_a_flood_of_compile_errors_is_read_in_a_bounded_part(tmp_path, monkeypatch):
    """A source made to print many times what the controller reads of it (and more than a
    pipe holds): its output goes to a file of the build's own, of which the controller reads
    the head (the first error) and the tail (the detail). (2,000 errors, not megabytes: the
    bound is the same, a compiler printing 50,000 took minutes on 2 CPUs.)"""
    work = tmp_path / "work"
    work.mkdir()
    (work / "s.c").write_text("int first_bad = ;\n" + "int bad = ;\n" * 2_000)
    printed = []
    read = build._compiler_output

    def noting(log):
        printed.append(log.stat().st_size)
        return read(log)

    monkeypatch.setattr(build, "_compiler_output", noting)
    with pytest.raises(Rejected) as caught:
        build._compile([CC, "-c", "-o", str(work / "s.o"), str(work / "s.c")], work)
    # the compiler printed more than a pipe's buffer and than the head and tail together
    assert printed and printed[0] > max(1 << 16, build.LOG_HEAD + build.LOG_TAIL), printed
    assert caught.value.verdict == Verdict.COMPILE_ERROR
    assert "s.c:1:" in caught.value.message and "error" in caught.value.message
    assert 0 < len(caught.value.detail) <= build.LOG_TAIL
    assert not (work / build.COMPILER_LOG).exists()  # the file goes with the build


def _host_secret_lines() -> list[str]:
    """Lines of the host's shadow file this process can read (none where it cannot)."""
    try:
        return [line for line in Path("/etc/shadow").read_text().splitlines() if len(line) > 8]
    except OSError:
        return []


@needs_sandbox
@needs_cc
def test_a_jailed_compiler_sees_no_host_secret(tmp_path):
    """The sample cheats of the class: a source that includes the host's shadow file, its
    registry settings, an ssh key or the compiler's own environment, to have the compile
    error quote them (into the record and the next round's prompt) or to build them into
    the answer. In the jail none of those files exists (the environment is the build's
    own: the toolchain's variables and PATH), and nothing of them is in any message."""
    settings = _settings(tmp_path)
    work = settings.cache / "k" / ".build-etc"
    work.mkdir(parents=True)
    secrets = _host_secret_lines()
    for target in ("/etc/shadow", "/etc/gshadow", "/etc/pip.conf", "/root/.ssh/id_rsa",
                   str(Path.home() / ".ssh" / "id_ed25519")):
        (work / "s.c").write_text(f'#include "{target}"\n')
        with jailed(compile_jail(settings)), pytest.raises(Rejected) as caught:
            build._compile([CC, "-fPIC", "-shared", "-o", str(work / "lib.so"),
                            str(work / "s.c")], work)
        said = (caught.value.detail or "") + caught.value.message
        assert caught.value.verdict == Verdict.COMPILE_ERROR, said
        assert "No such file" in said or "not found" in said, said
        assert not any(line in said for line in secrets), target
    # the compiler's environment holds nothing of the controller's (an API key, say): the
    # source compiles or not (a /proc file reads as empty to a compiler), never quoting it
    (work / "s.c").write_text('#include "/proc/self/environ"\n')
    os.environ["COMMBENCH_TEST_SECRET_KEY"] = "sk-commbench-test-0123456789"
    said = ""
    try:
        with jailed(compile_jail(settings)):
            build._compile([CC, "-fPIC", "-shared", "-o", str(work / "lib.so"),
                            str(work / "s.c")], work)
    except Rejected as exc:
        said = (exc.detail or "") + exc.message
    finally:
        del os.environ["COMMBENCH_TEST_SECRET_KEY"]
    assert "sk-commbench-test" not in said, said
    if (work / "lib.so").exists():
        assert b"sk-commbench-test" not in (work / "lib.so").read_bytes()


@needs_sandbox
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT],
                         ids=["SIGKILL", "SIGTERM", "SIGINT"])
def test_a_jailed_build_dies_with_its_controller(tmp_path, sig):
    """kill -9, SIGTERM (a CI job cancelled) or Ctrl-C of the process that started a build
    (pytest, an xdist worker) ends the build: a compiler that would run for ten minutes is
    gone within seconds, its jail with it."""
    marker = f"commbench-build-orphan-{os.getpid()}-{time.time_ns()}"
    work = tmp_path / "work"
    (work / "ro").mkdir(parents=True)
    controller = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from pytest_commbench import build, launch, sandbox
        launch.install_stop_handlers()
        work = Path({str(work)!r})
        jail = build.Jail(lambda cmd, w: sandbox.wrap(w, cmd, {{"PATH": "/usr/bin:/bin"}},
                                                       hide=[]),
                          sandbox.SETUP_FAILED, sandbox.LIMIT_EXIT)
        print("running", flush=True)
        with build.jailed(jail):
            build._compile([sys.executable, "-c", "import time; time.sleep(600)",
                            {marker!r}], work)
        """)
    proc = subprocess.Popen([sys.executable, "-c", controller], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "running"

        def left() -> str:
            """The build's processes (the controller's own command line names the marker
            too: it is not one of them)."""
            out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
            return "\n".join(x for x in out.splitlines() if x.split()[0] != str(proc.pid))

        def running() -> bool:
            return "time.sleep(600)" in left()

        deadline = time.time() + 30
        while time.time() < deadline and not running():
            time.sleep(0.1)
        assert running(), "the build never started"
        proc.send_signal(sig)
        proc.wait(timeout=30)
        deadline = time.time() + 15
        while time.time() < deadline and left():
            time.sleep(0.1)
        assert not left().strip(), f"the build outlived its controller ({sig.name}): {left()}"
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["pkill", "-9", "-f", marker], capture_output=True)
