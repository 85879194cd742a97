from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_commbench.build import build_python
from pytest_commbench.tasks import ManifestError, load_task
from pytest_commbench.verdicts import Rejected, Verdict

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "fixtures" / "solutions"
TASK_DIR = REPO / "suites" / "collective" / "ring_allreduce"


@pytest.fixture
def task():
    return load_task(TASK_DIR / "task.toml", REPO / "suites")


def source(case: str) -> str:
    return (SOLUTIONS / case / "collective" / "ring_allreduce" / "solution.py").read_text()


def test_manifest_loads_with_markers(task):
    assert task.relpath == "collective/ring_allreduce"
    assert task.check.op == "allreduce"
    assert "category_collective" in task.markers() and "setup_bare_metal" in task.markers()


@pytest.mark.parametrize("case", ["forbidden", "forbidden_getattr"])
def test_forbidden_names_are_found_in_the_built_code(task, case, tmp_path):
    with pytest.raises(Rejected) as info:
        build_python(task, source(case), tmp_path)
    assert info.value.verdict is Verdict.FORBIDDEN
    assert "Allreduce" in info.value.message


def test_syntax_error_is_compile_error(task, tmp_path):
    with pytest.raises(Rejected) as info:
        build_python(task, source("syntax_error"), tmp_path)
    assert info.value.verdict is Verdict.COMPILE_ERROR


def test_build_is_cached_by_content(task, tmp_path):
    a = build_python(task, source("right_naive"), tmp_path)
    b = build_python(task, source("right_naive"), tmp_path)
    c = build_python(task, source("slow"), tmp_path)
    assert a == b and a.path.exists() and c.digest != a.digest


def test_the_entry_function_name_itself_is_not_a_forbidden_use(task, tmp_path):
    # the template defines `allreduce`, which the task's forbid list also names
    build_python(task, (REPO / "references" / task.relpath / "solution.py").read_text(), tmp_path)


@pytest.mark.parametrize(
    "change, key",
    [
        (lambda s: s.replace('category = "collective"', 'category = "collectives"'), "category"),
        (lambda s: s.replace("ranks = [4]", 'ranks = "4"'), "ranks"),
        (lambda s: s.replace('op = "allreduce"', 'op = "allreduse"'), "check.op"),
        (lambda s: 'colour = "blue"\n' + s, "colour"),
        (lambda s: s + 'colour = "blue"\n', "metric.colour"),
        (lambda s: s.replace("timeout = 60", "timeout = -1"), "timeout"),
        (lambda s: s.replace('title = "', 'title = '), "<toml>"),
        (lambda s: s.replace('entry = "allreduce"\n', ""), "entry"),
        # an example name the paper's repository does not have (the message says which it has)
        (lambda s: 'upstream = "example022_allreduce"\n' + s, "upstream"),
    ],
)
def test_bad_manifest_names_file_and_key(tmp_path, change, key):
    task_dir = tmp_path / "suites" / "collective" / "ring_allreduce"
    shutil.copytree(TASK_DIR, task_dir)
    manifest = task_dir / "task.toml"
    manifest.write_text(change(manifest.read_text()))
    with pytest.raises(ManifestError) as info:
        load_task(manifest, tmp_path / "suites")
    assert info.value.key == key
    assert str(manifest) in str(info.value)


def test_a_mutant_is_the_reference_with_its_edits(tmp_path):
    from pytest_commbench.mutants import MutantError, load, mutants

    ref_dir = tmp_path / "ref"
    (ref_dir / "mutants").mkdir(parents=True)
    (ref_dir / "solution.py").write_text("a = 1\nb = 2\nb = 2\n")
    (ref_dir / "mutants" / "one.toml").write_text(
        "[[replace]]\nold = '''\na = 1\n'''\nnew = '''\na = 3\n'''\n")
    (ref_dir / "mutants" / "whole.py").write_text("a = 9\n")
    (ref_dir / "mutants" / "twice.toml").write_text(
        "[[replace]]\nold = '''\nb = 2\n'''\nnew = '''\nb = 4\n'''\n")
    found = dict(mutants(ref_dir, ".py"))
    assert sorted(found) == ["one", "twice", "whole"]
    assert found["one"]() == "a = 3\nb = 2\nb = 2\n"
    assert found["whole"]() == "a = 9\n"
    with pytest.raises(MutantError, match="mutant twice: edit 1's old text occurs 2 times"):
        found["twice"]()
    (ref_dir / "mutants" / "bad.toml").write_text("[[replace]]\nold = 'x\n")
    with pytest.raises(MutantError, match="mutant bad"):
        load(ref_dir / "mutants" / "bad.toml", ref_dir / "solution.py")


def test_every_mutant_of_the_suites_builds_from_its_reference():
    from pytest_commbench.mutants import mutants

    count = 0
    for manifest in sorted((REPO / "suites").glob("*/*/task.toml")):
        task = load_task(manifest, REPO / "suites")
        ref_dir = REPO / "references" / task.relpath
        reference = (ref_dir / f"solution{task.suffix}").read_text()
        for name, read in mutants(ref_dir, task.suffix):
            assert read() != reference, f"{task.relpath} mutant {name} is the reference"
            count += 1
    assert count >= 89
