"""pytest hooks of pytest-commbench (thin: the work is in the modules named for it)."""

from __future__ import annotations

import pytest

from . import hookspecs
from .items import TaskManifest, is_manifest, record_crashed_item, record_from_report
from .models.api import api_model_names, make_api_model
from .models.builtin import BUILTIN_NAMES, make_builtin
from .platforms import make as make_platform
from .report import render
from .session import FLAGS, STATE, create, flag_name, labelled

MODEL_DESC = "where solutions come from: reference, template, mutants, dir:PATH or a registered model"
PLATFORM_DESC = "platform to run on: auto (default), cpu, h200, b300, gh200, mi325x or a registered one"
SEED_DESC = "secret seed of the random inputs (default: a fresh one per run, printed)"
TIMEOUT_DESC = "per-job deadline in seconds (default: the task manifest's timeout)"
RUNS_DESC = "where result logs and scratch directories go (default .commbench/runs)"
SCRATCH_DESC = ("where items' scratch directories (inputs, outputs) go instead of the runs "
                "directory, e.g. a tmpfs such as /dev/shm for large sizes")
RESUME_DESC = ("finish a killed run: RUN is its id under the runs directory or its directory; "
               "items it finished are reported from its log, the rest run with its seed")
ROUNDS_DESC = ("refinement rounds: after a failure, or a pass slower than the reference, the "
               "model is asked again with the verdict and its evidence, up to this many "
               "generations per task (default 1)")
TIMING_ROUNDS_DESC = "interleaved reference/solution timing rounds per item, at least (default 2)"
MAX_ROUNDS_DESC = ("at most this many timing rounds: they are added while the speedup is less "
                   "precise than --commbench-timing-precision (default 6)")
PRECISION_DESC = ("relative uncertainty of an item's speedup (standard error, from how much "
                  "the jobs scatter, at its 90% upper bound for so few jobs) below which no "
                  "more timing rounds are added (default 0.03)")
REPS_DESC = "timed repetitions per size per job (default 10)"
WARMUP_DESC = "untimed warm-up calls per size per job (default 2)"
BUDGET_DESC = ("seconds of timed work per size per job; repetitions go on past --commbench-reps "
               "until it is spent (default 0.25)")
MAX_REPS_DESC = "at most this many timed repetitions per size per job (default 200)"
KEEP_DESC = "keep the scratch directories of passing items too"
SHARED_NODE_DESC = ("timed items lease only the GPUs they use instead of the whole node "
                    "(faster with -n, but neighbours may disturb the numbers)")
UNSANDBOXED_DESC = ("run jobs without their sandbox where namespaces are not available "
                    "(recorded in every result's fingerprint; a solution can then reach the "
                    "harness)")
BASE_URL_DESC = ("endpoint of the model's server, in the form its SDK takes (OpenAI-compatible: "
                 ".../v1; Anthropic: the host root); overrides the registry's")
MODELS_FILE_DESC = "a TOML file of models that extends or overrides the shipped registry"
REGENERATE_DESC = ("ask the model again even where the runs directory keeps a reply for the "
                   "task (otherwise kept replies are reused and no request is sent)")
REQUEST_TIMEOUT_DESC = "seconds one request to a model may take (default 900)"
SAMPLES_DESC = ("independent answers per task (each an item, e.g. [np2-s1]); pass@k for every "
                "k up to it in the summary (default 1)")
TEMPERATURE_DESC = "sampling temperature (default: the registry's, else the provider's)"
BUDGET_USD_DESC = ("US dollars a task's answers may cost: no further refinement round once "
                   "spent (needs the model's prices)")
MARKERS = {
    "commbench": "a pytest-commbench task item",
    "category_p2p": "", "category_collective": "", "category_ep": "", "category_fusion": "",
    "category_utility": "", "difficulty_easy": "", "difficulty_medium": "", "difficulty_hard": "",
    "setup_bare_metal": "", "setup_library_based": "",
}
OPTIONS = [
    ("model", MODEL_DESC), ("platform", PLATFORM_DESC), ("seed", SEED_DESC),
    ("timeout", TIMEOUT_DESC), ("runs_dir", RUNS_DESC), ("scratch", SCRATCH_DESC),
    ("resume", RESUME_DESC), ("rounds", ROUNDS_DESC), ("timing_rounds", TIMING_ROUNDS_DESC),
    ("timing_max_rounds", MAX_ROUNDS_DESC), ("timing_precision", PRECISION_DESC),
    ("reps", REPS_DESC), ("warmup", WARMUP_DESC),
    ("budget", BUDGET_DESC), ("max_reps", MAX_REPS_DESC),
    ("keep", KEEP_DESC), ("shared_node", SHARED_NODE_DESC), ("unsandboxed", UNSANDBOXED_DESC),
    ("base_url", BASE_URL_DESC), ("models_file", MODELS_FILE_DESC),
    ("regenerate", REGENERATE_DESC), ("request_timeout", REQUEST_TIMEOUT_DESC),
    ("samples", SAMPLES_DESC), ("temperature", TEMPERATURE_DESC), ("budget_usd", BUDGET_USD_DESC),
]


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("commbench", "GPU communication benchmark (pytest-commbench)")
    for name, desc in OPTIONS:
        text = desc.replace("%", "%%")  # argparse %-formats help texts
        if name in FLAGS:
            group.addoption(flag_name(name), dest=f"commbench_{name}", action="store_true",
                            help=text)
        else:
            group.addoption(flag_name(name), dest=f"commbench_{name}", type=labelled(name),
                            default=None, help=text,
                            **({"metavar": "RUN"} if name == "resume" else {}))
        parser.addini(f"commbench_{name}", desc)
    parser.addini("commbench_references", "hidden references root (default: references)")
    parser.addini("commbench_suites", "suites root, to name tasks by relative path (default: suites)")


@pytest.hookimpl(trylast=True)
def pytest_commbench_make_model(config, name):
    return make_builtin(name, config.invocation_params.dir) or make_api_model(config, name)


@pytest.hookimpl(trylast=True)
def pytest_commbench_make_platform(config, name):
    return make_platform(name)


def pytest_commbench_model_names(config):
    return [*BUILTIN_NAMES, *api_model_names(config)]


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
    """Hand the controller's secret seed and run to every worker; give a crashed worker's item
    its end in the results log."""

    def __init__(self, state) -> None:
        self.state = state

    def pytest_configure_node(self, node) -> None:
        node.workerinput["commbench_seed"] = self.state.seed
        node.workerinput["commbench_run_id"] = self.state.run_id
        node.workerinput["commbench_run_dir"] = str(self.state.run_dir)
        node.workerinput["commbench_resume_upto"] = self.state.resume_upto

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem, report, sched) -> None:
        """On the controller: the worker running `crashitem` died (perhaps killed by the
        solution). Its item is a failure of the model, written to the log here."""
        record_crashed_item(self.state, crashitem, report)


def pytest_collect_file(file_path, parent):
    if is_manifest(file_path):
        return TaskManifest.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtestloop(session: pytest.Session):
    """Before the first item: write the run's file (its seed, for --commbench-resume). And a
    broken task.toml is a collection error of that task only: the other tasks still run (the
    errors still count in the exit status)."""
    state = session.config.stash[STATE]
    controller = not hasattr(session.config, "workerinput")
    distributed = session.config.pluginmanager.getplugin("dsession") is not None
    if controller and not session.config.option.collectonly and (distributed or session.items):
        state.write_run_file()
    forgiven = min(state.manifest_errors, session.testsfailed)
    session.testsfailed -= forgiven
    try:
        return (yield)
    finally:
        session.testsfailed += forgiven


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash[STATE]
    lines = [
        f"commbench: model={state.model.name} platform={state.platform.name} "
        f"seed={state.seed} timing rounds={state.rounds}-{max(state.rounds, state.max_rounds)} "
        f"(precision {state.precision:g}) reps={state.reps}",
        f"commbench: results log {state.log.path}",
    ]
    if state.resume_upto is not None:
        lines.append(f"commbench: resuming run {state.run_id}: {len(state.resumed)} items "
                     "already finished are reported from its log")
    return lines


class ResultsCollector:
    """Gathers the records of finished items from their reports (so it works on the xdist
    controller too) and renders the summary."""

    def __init__(self, state) -> None:
        self.state = state
        self.by_node: dict[str, dict] = {}

    @property
    def records(self) -> list[dict]:
        return list(self.by_node.values())

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # the call's report; a skip's setup report; a crashed worker's report (when "???")
        if report.when == "call" or (report.when == "setup" and report.skipped) \
                or report.when not in ("setup", "call", "teardown"):
            record = record_from_report(report)
            if record is not None:
                self.by_node[report.nodeid] = record

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.by_node:
            return
        state = self.state
        render(self.records, terminalreporter.write_line, terminalreporter.write_sep,
               header=f"commbench: model {state.model.name} on {state.platform.name}")
        terminalreporter.write_line(f"seed {state.seed}; results log {state.log.path}")
