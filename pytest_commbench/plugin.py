"""pytest hooks of pytest-commbench (thin: the work is in the modules named for it)."""

from __future__ import annotations

import pytest

from . import hookspecs
from .items import TaskManifest, is_manifest, record_from_report
from .models.builtin import BUILTIN_NAMES, make_builtin
from .platforms import make as make_platform
from .report import render
from .session import STATE, create

MODEL_DESC = "where solutions come from: reference, template, mutants, dir:PATH or a registered model"
PLATFORM_DESC = "platform to run on: auto (default), cpu, h200, b300, gh200, mi325x or a registered one"
SEED_DESC = "secret seed of the random inputs (default: a fresh one per run, printed)"
TIMEOUT_DESC = "per-job deadline in seconds (default: the task manifest's timeout)"
RUNS_DESC = "where result logs and scratch directories go (default .commbench/runs)"
SCRATCH_DESC = ("where items' scratch directories (inputs, outputs) go instead of the runs "
                "directory, e.g. a tmpfs such as /dev/shm for large sizes")
ROUNDS_DESC = "interleaved reference/solution rounds per item, at least (default 2)"
MAX_ROUNDS_DESC = ("at most this many rounds: rounds are added while the speedup is less "
                   "precise than --commbench-precision (default 6)")
PRECISION_DESC = ("relative uncertainty of an item's speedup (standard error, from how much "
                  "the jobs scatter, at its 90% upper bound for so few jobs) below which no "
                  "more rounds are added (default 0.03)")
REPS_DESC = "timed repetitions per size per job (default 10)"
WARMUP_DESC = "untimed warm-up calls per size per job (default 2)"
BUDGET_DESC = ("seconds of timed work per size per job; repetitions go on past --commbench-reps "
               "until it is spent (default 0.25)")
MAX_REPS_DESC = "at most this many timed repetitions per size per job (default 200)"
MARKERS = {
    "commbench": "a pytest-commbench task item",
    "category_p2p": "", "category_collective": "", "category_ep": "", "category_fusion": "",
    "category_utility": "", "difficulty_easy": "", "difficulty_medium": "", "difficulty_hard": "",
    "setup_bare_metal": "", "setup_library_based": "",
}


def _number(kind: type, minimum: float, inclusive: bool, what: str):
    """An argparse type that raises UsageError with a sentence (as xdist's option parsers do)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise pytest.UsageError(f"expected {what}, got {text!r}") from None
        if value < minimum or (value == minimum and not inclusive):
            sign = ">=" if inclusive else ">"
            raise pytest.UsageError(f"expected {what} {sign} {minimum:g}, got {text}")
        return value

    return parse


_count = _number(int, 0, True, "a whole number")
_seconds = _number(float, 0, False, "seconds")
_nonnegative_seconds = _number(float, 0, True, "seconds")
_fraction = _number(float, 0, True, "a fraction")


def _seed(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise pytest.UsageError(f"--commbench-seed: expected an integer, got {text!r}") from None


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("commbench", "GPU communication benchmark (pytest-commbench)")
    options = [
        ("--commbench-model", "model", str, MODEL_DESC),
        ("--platform", "platform", str, PLATFORM_DESC),
        ("--commbench-seed", "seed", _seed, SEED_DESC),
        ("--commbench-timeout", "timeout", _seconds, TIMEOUT_DESC),
        ("--commbench-runs-dir", "runs_dir", str, RUNS_DESC),
        ("--commbench-scratch", "scratch", str, SCRATCH_DESC),
        ("--commbench-rounds", "rounds", _count, ROUNDS_DESC),
        ("--commbench-max-rounds", "max_rounds", _count, MAX_ROUNDS_DESC),
        ("--commbench-precision", "precision", _fraction, PRECISION_DESC),
        ("--commbench-reps", "reps", _count, REPS_DESC),
        ("--commbench-warmup", "warmup", _count, WARMUP_DESC),
        ("--commbench-budget", "budget", _nonnegative_seconds, BUDGET_DESC),
        ("--commbench-max-reps", "max_reps", _count, MAX_REPS_DESC),
    ]
    for flag, name, kind, desc in options:
        group.addoption(flag, dest=f"commbench_{name}", type=kind, default=None, help=desc)
        parser.addini(f"commbench_{name}", desc)
    group.addoption("--commbench-keep", dest="commbench_keep", action="store_true",
                    help="keep the scratch directories of passing items too")
    group.addoption("--commbench-shared-node", dest="commbench_shared_node", action="store_true",
                    help="timed items lease only the GPUs they use instead of the whole node "
                         "(faster with -n, but neighbours may disturb the numbers)")
    parser.addini("commbench_references", "hidden references root (default: references)")
    parser.addini("commbench_suites", "suites root, to name tasks by relative path (default: suites)")


@pytest.hookimpl(trylast=True)
def pytest_commbench_make_model(config, name):
    return make_builtin(name, config.invocation_params.dir)


@pytest.hookimpl(trylast=True)
def pytest_commbench_make_platform(config, name):
    return make_platform(name)


def pytest_commbench_model_names(config):
    return list(BUILTIN_NAMES)


def pytest_configure(config: pytest.Config) -> None:
    for name, desc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {desc or 'commbench task attribute'}")
    for lib in ("mpi", "nccl", "nccl_device", "nvshmem", "cuda_runtime", "cupy", "torch",
                "ibverbs", "mscclpp", "deepep", "thunderkittens", "vllm", "sglang"):
        config.addinivalue_line("markers", f"library_{lib}: commbench task attribute")
    state = create(config)
    config.stash[STATE] = state
    config.pluginmanager.register(ResultsCollector(state), "commbench-results")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(state), "commbench-xdist")


class XdistHooks:
    """Hand the controller's secret seed and run id to every worker."""

    def __init__(self, state) -> None:
        self.state = state

    def pytest_configure_node(self, node) -> None:
        node.workerinput["commbench_seed"] = self.state.seed
        node.workerinput["commbench_run_id"] = self.state.run_id


def pytest_collect_file(file_path, parent):
    if is_manifest(file_path):
        return TaskManifest.from_parent(parent, path=file_path)
    return None


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash[STATE]
    return [
        f"commbench: model={state.model.name} platform={state.platform.name} "
        f"seed={state.seed} rounds={state.rounds}-{max(state.rounds, state.max_rounds)} "
        f"(precision {state.precision:g}) reps={state.reps}",
        f"commbench: results log {state.log.path}",
    ]


class ResultsCollector:
    """Gathers the records of finished items from their reports (so it works on the xdist
    controller too) and renders the summary."""

    def __init__(self, state) -> None:
        self.state = state
        self.records: list[dict] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and report.skipped):
            record = record_from_report(report)
            if record is not None:
                self.records.append(record)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.records:
            return
        state = self.state
        render(self.records, terminalreporter.write_line, terminalreporter.write_sep,
               header=f"commbench: model {state.model.name} on {state.platform.name}")
        terminalreporter.write_line(f"seed {state.seed}; results log {state.log.path}")
