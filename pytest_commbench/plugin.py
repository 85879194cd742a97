"""pytest hooks of pytest-commbench (thin: the work is in the modules named for it)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from . import capacity, hookspecs, launch, preflight, shards
from .agent import GeakAgent
from .engine.job import run_job
from .items import TaskItem, TaskManifest, is_manifest, record_crashed_item, record_from_report
from .launch import install_stop_handlers
from .leaderboard import render_run
from .makers import AGENT_NAMES
from .models.api import api_model_names, make_api_model
from .models.builtin import BUILTIN_NAMES, make_builtin
from .option_sources import setting
from .options import GROUPS, OPTIONS, flag_name, group_of, labelled
from .platforms import make as make_platform
from .record import ResultLine
from .run_state import STATE
from .session import create
from .tasks import marker_names


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


METAVARS = {"resume": "RUN", "shard": "K/N", "run_name": "NAME"}


def pytest_addoption(parser: pytest.Parser) -> None:
    groups = {key: parser.getgroup(f"commbench-{key}", f"commbench: {title}")
              for key, (title, _names) in GROUPS.items()}
    for option in OPTIONS:
        name, desc = option.name, option.text
        for old in option.aliases:  # former names: still read, never listed
            parser.addini(f"commbench_{old}", f"former name of commbench_{name}")
        if not option.cli:
            parser.addini(f"commbench_{name}", desc)
            continue
        group = groups[group_of(name)]
        text = desc.replace("%", "%%")  # argparse %-formats help texts
        for flag, dest, shown in ((flag_name(name), name, text),
                                  *((flag_name(old), old, argparse.SUPPRESS)
                                    for old in option.aliases)):
            if option.flag:
                group.addoption(flag, dest=f"commbench_{dest}", action="store_true", help=shown)
            else:
                group.addoption(flag, dest=f"commbench_{dest}", type=labelled(name, flag),
                                default=None, help=shown,
                                **({"metavar": METAVARS[name]} if name in METAVARS else {}))
        parser.addini(f"commbench_{name}", desc)


@pytest.hookimpl(trylast=True)
def pytest_commbench_make_model(config, name):
    return make_builtin(name, config.invocation_params.dir) or make_api_model(config, name)


@pytest.hookimpl(trylast=True)
def pytest_commbench_make_platform(config, name):
    return make_platform(name)


@pytest.hookimpl(trylast=True)
def pytest_commbench_make_agent(config, name):
    """The built-in agent called `name` (None: not one of ours), set up from the options."""
    if name not in AGENT_NAMES:
        return None
    state = config.stash.get(STATE, None)
    suites = state.suites if state is not None else config.rootpath / setting(config, "suites")
    return GeakAgent(suites, max_debug=int(setting(config, "max_debug")),
                     use_knowledge=setting(config, "knowledge") == "on",
                     retrieval=setting(config, "retrieval") == "on")


@pytest.hookimpl(trylast=True)
def pytest_commbench_job_runner(config):
    return run_job


def pytest_commbench_model_names(config):
    return [*BUILTIN_NAMES, *api_model_names(config)]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "commbench: a pytest-commbench task item")
    for name in marker_names():  # every value a manifest may name: -m never meets an unknown mark
        config.addinivalue_line("markers", f"{name}: commbench task attribute")
    state = create(config)
    config.stash[STATE] = state
    preflight.check(config, state)  # refusals and warnings, before anything is spent
    install_stop_handlers()
    config.pluginmanager.register(ResultsCollector(state), "commbench-results")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(state), "commbench-xdist")


class XdistHooks:
    """Hand the controller's secret seed and run to every worker; give a crashed worker's item
    its end in the results log."""

    def __init__(self, state) -> None:
        self.state = state
        self.told = False  # the timing statement is written once

    def pytest_configure_node(self, node) -> None:
        node.workerinput["commbench_seed"] = self.state.seed
        node.workerinput["commbench_run_id"] = self.state.run_id
        node.workerinput["commbench_run_dir"] = str(self.state.run_dir)
        node.workerinput["commbench_resume_upto"] = self.state.resume_upto
        node.workerinput["commbench_shard"] = str(self.state.shard or "")
        node.workerinput["commbench_run_name"] = self.state.run_name

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        """On the controller, which collects nothing itself: the first worker's items (all
        workers collect the same) say what this machine can time, before any item runs."""
        if not self.told:
            self.told = True
            capacity.tell(node.config, self.state, list(ids))

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem, report, sched) -> None:
        """On the controller: the worker running `crashitem` died (perhaps killed by the
        solution). Its item is a failure of the model, written to the log here; a test of
        another plugin or of the user's own (not a task's item) is left to pytest."""
        if is_manifest(Path(crashitem.partition("::")[0])):
            record_crashed_item(self.state, crashitem, report)


def pytest_runtest_logfinish(nodeid, location) -> None:
    """Ctrl-C stops the run after the item it came in, wherever its KeyboardInterrupt went
    (one raised inside a destructor is swallowed)."""
    if launch.INTERRUPTED[0]:
        raise KeyboardInterrupt


SHARD_TASKS = pytest.StashKey[tuple]()  # (this shard's tasks, the selection's)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items) -> None:
    """--commbench-shard: of the items -k and -m left, this shard's tasks only."""
    counted = shards.deselect(config, items, config.stash[STATE].shard)
    if counted is not None:
        config.stash[SHARD_TASKS] = counted


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
    t = state.settings
    lines = [
        f"commbench: model={state.model.name} platform={state.platform.name} "
        f"seed={state.seed} timing rounds={t.timing_rounds}-"
        f"{max(t.timing_rounds, t.timing_max_rounds)} "
        f"(precision {t.timing_precision:g}) reps={t.reps}",
        f"commbench: results log {state.log.path}",
    ]
    if state.shard is not None:
        lines.append(f"commbench: shard {state.shard} of the selected tasks"
                     + (f", part of run {state.run_name}" if state.run_name else ""))
    if state.resume_upto is not None:
        lines.append(f"commbench: resuming run {state.run_id}: {len(state.resumed)} items "
                     "already finished are reported from its log")
    return lines


class ResultsCollector:
    """Gathers the records of finished items from their reports (so it works on the xdist
    controller too) and renders the summary."""

    def __init__(self, state) -> None:
        self.state = state
        self.by_node: dict[str, ResultLine] = {}

    @property
    def records(self) -> list[ResultLine]:
        return list(self.by_node.values())

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # the call's report; a skip's setup report; a crashed worker's report (when "???")
        if report.when == "call" or (report.when == "setup" and report.skipped) \
                or report.when not in ("setup", "call", "teardown"):
            record = record_from_report(report)
            if record is not None:
                self.by_node[report.nodeid] = record

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Before the first item: whether this machine can time the selected items, and what
        the run will report (an xdist controller collects nothing: XdistHooks says it from
        a worker's item ids)."""
        config = session.config
        if not hasattr(config, "workerinput") and not config.option.collectonly:
            capacity.tell(config, self.state, [item.nodeid for item in session.items])

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """A benchmark session in which no item ran (all skipped: the wrong platform, a task
        filter that left only skips) is not a success: pytest's "nothing collected" status."""
        if hasattr(session.config, "workerinput"):
            return
        if preflight.no_item_ran(self.records) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.by_node:
            config = terminalreporter.config
            mine, selected = config.stash.get(SHARD_TASKS, (None, 0))
            if mine == 0 and not hasattr(config, "workerinput"):
                terminalreporter.write_line(
                    f"commbench: shard {self.state.shard} holds no task: the selection has "
                    f"{selected} task{'s' * (selected != 1)}, fewer than the shards", yellow=True)
                return
            given = [f"{flag} {value!r}" for flag, value in
                     (("-k", config.option.keyword), ("-m", config.option.markexpr)) if value]
            # task items were there and the filter took them all
            tasks_deselected = any(isinstance(item, TaskItem)
                                   for item in terminalreporter.stats.get("deselected", ()))
            if given and tasks_deselected and not hasattr(config, "workerinput"):
                terminalreporter.write_line(
                    f"commbench: no task item matched {' and '.join(given)}; `commbench tasks` "
                    "lists the tasks, their markers and world sizes (items are named "
                    "TASK[npN])", yellow=True)
            return
        why = preflight.no_item_ran(self.records)
        if why:
            terminalreporter.write_line(f"commbench: {why}; exit status "
                                        f"{int(pytest.ExitCode.NO_TESTS_COLLECTED)}", red=True)
        state = self.state
        render_run(self.records, terminalreporter.write_line, terminalreporter.write_sep,
               header=f"commbench: model {state.model.name} on {state.platform.name}")
        terminalreporter.write_line(f"seed {state.seed}; results log {state.log.path}")
