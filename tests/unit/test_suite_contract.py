"""The suite's own contract, checked on every manifest (the lint CI runs): each task loads,
its reference is its template with only the editable regions filled, it has at least two
mutants that differ from the reference and stay inside the regions, its prompt exists and
is not empty, it names a known CommBench example when it names one; and the GPU suite has
the breadth its issue asks for (counts per category, library and difficulty)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from pytest_commbench import regions
from pytest_commbench.mutants import mutants
from pytest_commbench.tasks import load_suite

REPO = Path(__file__).resolve().parents[2]
TASKS, ERRORS = load_suite(REPO / "suites")
GPU = [t for t in TASKS if set(t.platforms) - {"cpu"}]


def test_every_manifest_loads():
    assert not ERRORS


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.relpath)
def test_reference_and_mutants_keep_to_the_template(task):
    template = task.template.read_text()
    ref_dir = REPO / "references" / task.relpath
    reference = (ref_dir / f"solution{task.suffix}").read_text()
    regions.verify(template, reference)
    assert task.prompt.read_text().strip(), f"{task.relpath}: empty prompt"
    found = 0
    for name, read in mutants(ref_dir, task.suffix):
        source = read()
        assert source != reference, f"{task.relpath} mutant {name} is the reference"
        regions.verify(template, source)
        found += 1
    assert found >= 2, f"{task.relpath} has {found} mutants (at least 2)"


def test_upstream_names_are_examples_of_the_paper():
    """Each named example is one of the CommBench repository's (the manifest loader refuses
    any other name, with the name its number has)."""
    from pytest_commbench.tasks import commbench_examples

    known = commbench_examples()
    assert len(known) == 101 and min(known) == 1
    named = [t.upstream for t in TASKS if t.upstream]
    assert all(name in known.values() for name in named)
    assert len(set(named)) >= 40  # the suite covers a good part of the paper's examples


def test_the_gpu_suite_has_the_breadth_it_promises():
    assert len(GPU) >= 64, len(GPU)
    by_category = Counter(t.category for t in GPU)
    for category, least in {"p2p": 10, "collective": 18, "ep": 8, "fusion": 10,
                             "utility": 12}.items():
        assert by_category[category] >= least, (category, by_category)
    by_library = Counter(t.library for t in GPU)
    for library, least in {"torch": 4, "nccl": 4, "nvshmem": 6, "thunderkittens": 4}.items():
        assert by_library[library] >= least, (library, by_library)
    assert sum(t.difficulty == "hard" for t in GPU) >= 20
    for task in GPU:
        assert 2 in task.ranks or min(task.ranks) >= 2, task.relpath
