"""Hooks through which models and platforms are provided (the built-ins use them too)."""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("pytest")


@hookspec(firstresult=True)
def pytest_commbench_make_model(config, name):
    """Return a model object for `--commbench-model=name`, or None if the name is not yours.
    The built-ins (reference, template, mutants, dir:PATH) answer last."""


@hookspec(firstresult=True)
def pytest_commbench_make_platform(config, name):
    """Return a platform object for `--platform=name`, or None. The built-ins answer last."""


@hookspec(firstresult=True)
def pytest_commbench_make_agent(config, name):
    """Return an agent object for `--commbench-agent=name` (an object with `name`, `label`
    and `run(task, world, candidate, platform, settings)` returning the item's
    `engine.ItemResult` (the record layer's `record.Attempt`), as `engine.refine` does: the
    evaluation of the answer it keeps, with its usage over every step, `round_history`/`round`
    and its own summary in `agent` (a `record.AgentSummary`, or a dict of keys "agent" and
    "agent_*", written into the result line as they are)), or None if the name is not
    yours. An agent evaluates each answer as a value with `engine.evaluate(task, world,
    reply, platform, settings, kind=candidate.kind)` (`engine.produce(fn)` asks a model
    source for a reply, an outage as infra_error; a candidate is still taken). The built-in `geak` answers last. (The attempt's JSON, a dict of
    `ItemResult.to_json()`, is still taken.)"""


@hookspec(firstresult=True)
def pytest_commbench_job_runner(config):
    """Return the job runner every item runs its jobs with (an `engine.JobRunner`: one job
    of a built answer, its `engine.Outcome` returned), or None. The built-in,
    `engine.job.run_job` (MPI ranks under the observer), answers last; the plugin's own
    tests answer with a fake (`tests/fake_runner.py`), so an item runs in milliseconds."""


@hookspec
def pytest_commbench_model_names(config):
    """Return the model names you provide (they are listed when a name is unknown)."""


@hookspec
def pytest_commbench_result(config, record):
    """Called with every finished result, after it is on disk: `record` is the typed line
    (`record.ResultLine`), also a read-only mapping of the line's JSON (`record["verdict"]`)
    for implementations written against the dict; `record.to_json()` is the dict."""
