"""The typed result record: one line type, one serializer. A seeded generator draws records over
every field (values, nulls, fields a line of another version lacks or adds) and each must come
back unchanged through the results log (JSONL) and through the JUnit properties; every line of
the logs kept in this repository must be written back exactly as it was read."""

from __future__ import annotations

import json
import random
from dataclasses import MISSING, fields, replace
from pathlib import Path

import pytest

from pytest_commbench import record
from pytest_commbench.record import (
    ALWAYS,
    SET,
    AgentSummary,
    Attempt,
    Identity,
    MachineLoad,
    ResultLine,
    Round,
    Size,
    Usage,
    from_junit,
    junit_properties,
    problem,
)
from pytest_commbench.results import ResultsLog, entries, load

REPO = Path(__file__).resolve().parents[2]
DRAWS = 300
BUILTIN = (str, int, float, bool, type(None))


class Draw:
    """Field values drawn from one seeded generator: every value a valid line may hold."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def chance(self, p: float = 0.5) -> bool:
        return self.rng.random() < p

    def text(self, empty: bool = True) -> str:
        alphabet = "abcxyz _-/:.[]\u00e9\u03bb\u2192\"\\\n0123456789"
        n = self.rng.randint(0 if empty else 1, 24)
        return "".join(self.rng.choice(alphabet) for _ in range(n))

    def number(self, low: float = 0.0, high: float = 1e6) -> float:
        return self.rng.choice([self.rng.uniform(low, high), self.rng.uniform(low, 1.0),
                                float(self.rng.randint(int(low), 10)), 1e-300 + low])

    def positive(self) -> float:
        return self.rng.uniform(1e-9, 50.0)

    def whole(self, low: int = 0) -> int:
        return self.rng.choice([low, self.rng.randint(low, 10), self.rng.randint(low, 1 << 40)])

    def blob(self, depth: int = 2) -> dict:
        """An opaque JSON object (a fingerprint, a request, a price)."""
        out: dict = {}
        for _ in range(self.rng.randint(0, 4)):
            kind = self.rng.randint(0, 4 if depth else 3)
            out[self.text(empty=False)] = (
                self.text() if kind == 0 else self.whole() if kind == 1 else
                self.number() if kind == 2 else [self.whole(), self.text()] if kind == 3
                else self.blob(depth - 1))
        return out

    def later(self, prefix: str = "later_") -> dict:
        """Fields of a later version, kept as they are."""
        return {f"{prefix}{self.rng.randint(0, 99)}": self.blob(0) if self.chance() else
                self.text() for _ in range(self.rng.randint(0, 2)) if self.chance(0.3)}


def _part(cls, draw: Draw, values: dict, skip: frozenset[str] = frozenset()):
    """A part with `values`; each ALWAYS field may be missing (as in a line of an older
    version) and each SET field may be null (as older lines wrote it), where not in `skip`."""
    made = cls(**values)
    unlike = set()
    for f in fields(cls):
        when = f.metadata.get("when")
        if when is None or f.name in skip:
            continue
        if when == ALWAYS and draw.chance(0.1):
            unlike.add(f.name)
            made = _with(made, f.name, f.default if f.default is not MISSING
                         else f.default_factory())
        elif when == SET and getattr(made, f.name) is None and draw.chance(0.1):
            unlike.add(f.name)
    return _with(made, "exceptions", frozenset(unlike))


def _with(part, name, value):
    return replace(part, **{name: value})


def size(draw: Draw, index: int, whole: bool = False) -> Size:
    values = dict(
        count=index + 1 + 10 * draw.whole(),  # a task's sizes differ
        dtype=draw.rng.choice(["float32", "bfloat16", "int8"]),
        bytes=draw.whole(1), t_sol_us=draw.number(), t_ref_us=draw.number(),
        spread_sol=draw.number(0, 1), spread_ref=draw.number(0, 1), n=draw.whole(1),
        metric=draw.rng.choice(["busbw", "algbw", "latency"]),
        unit=draw.rng.choice(["GB/s", "us"]),
        value_sol=None if draw.chance(0.2) else draw.number(),
        value_ref=None if draw.chance(0.2) else draw.number(),
        speedup=draw.positive(),
        jobs_sol_us=tuple(draw.number() for _ in range(draw.rng.randint(0, 3))),
        jobs_ref_us=tuple(draw.number() for _ in range(draw.rng.randint(0, 3))),
        batch=draw.whole(1), extra=draw.later())
    # a JUnit property is made of count, dtype and the figures: those a timed size has
    keep = frozenset({"count", "dtype", "speedup", "t_sol_us", "t_ref_us", "spread_sol",
                      "value_sol", "metric", "unit"}) if whole else frozenset()
    return _part(Size, draw, values, keep)


def round_entry(draw: Draw, n: int) -> Round:
    agent = draw.chance()
    return _part(Round, draw, dict(
        round=n if draw.chance(0.9) else None, verdict=draw.rng.choice(VERDICTS),
        speedup=draw.positive() if draw.chance() else None,
        message=draw.text() if draw.chance(0.8) else None,
        step=draw.whole(1) if agent else None,
        role=draw.rng.choice(["generate", "reflect", "optimize"]) if agent else None,
        kept=draw.rng.choice([True, False, None]), why=draw.text() if draw.chance(0.2) else None,
        restart=True if draw.chance(0.1) else None, extra=draw.later()))


VERDICTS = ["pass", "wrong_answer", "compile_error", "runtime_error", "timeout", "tampered",
            "forbidden", "no_solution", "truncated", "infra_error", "skipped", "aborted"]


def usage(draw: Draw) -> Usage:
    return _part(Usage, draw, dict(
        tokens_in=draw.whole(), tokens_out=draw.whole(),
        cost=None if draw.chance(0.1) else draw.number(0, 5),
        requests=tuple(draw.blob() for _ in range(draw.rng.randint(0, 2))),
        replayed=draw.chance(), price_source=draw.blob(0) if draw.chance(0.3) else None))


def agent_summary(draw: Draw, label: str | None) -> AgentSummary:
    made = _part(AgentSummary, draw, dict(
        label=label, calls={"generate": draw.whole(), "optimize": draw.whole()},
        restarts=draw.whole(), kept=draw.whole(),
        stop=draw.text() if draw.chance(0.8) else None,
        first=None if draw.chance(0.2) else round_entry(draw, 1),
        knowledge=tuple(draw.text(False) for _ in range(draw.rng.randint(0, 2))),
        retrieved=draw.text() if draw.chance() else None,
        steps=tuple(draw.text(False) for _ in range(draw.rng.randint(0, 3))),
        iteration=draw.whole(1) if draw.chance() else None, extra=draw.later("agent_later_")),
        # the line has one "agent" (the identity's); a summary says at least its calls
        skip=frozenset({"label", "calls"}))
    return made


def attempt(draw: Draw, label: str | None, whole_sizes: bool = False) -> Attempt:
    refined = draw.chance(0.4)
    history = tuple(round_entry(draw, n) for n in range(1, draw.rng.randint(1, 4))) \
        if refined else None
    ci90 = sorted([draw.positive(), draw.positive()])
    values = dict(
        verdict=draw.rng.choice(VERDICTS), message=draw.text(), detail=draw.text(),
        output=draw.text(), duration_s=draw.number(), usage=usage(draw),
        rounds=draw.whole(1), speedup=draw.positive() if draw.chance(0.7) else None,
        sizes=tuple(size(draw, i, whole_sizes) for i in range(draw.rng.randint(0, 3))),
        check_only=draw.rng.choice([True, None]), compile_only=draw.rng.choice([True, None]),
        speedup_se=draw.number(0, 1) if draw.chance() else None,
        speedup_ci90=tuple(ci90) if draw.chance() else None,
        timing_trust=draw.rng.choice(["ok", "noisy", "contended", "shared", None]),
        host_load=_part(MachineLoad, draw, dict(
            cpus=draw.whole(1), ranks=draw.whole(1),
            outside_cpus=None if draw.chance(0.3) else draw.number(0, 64),
            contended=draw.chance(), extra=draw.later())) if draw.chance(0.5) else None,
        timing_rounds=draw.whole(1) if draw.chance() else None,
        timing_stopped="contended" if draw.chance(0.2) else None,
        untimed_phases_us=draw.blob() if draw.chance(0.3) else None,
        job_phases_s=draw.blob() if draw.chance(0.3) else None,
        round_history=history,
        round=draw.rng.choice([None, 1, 2]) if refined else None,
        agent=agent_summary(draw, label) if label is not None or draw.chance(0.2) else None)
    # the summary's label is the line's "agent" (drawn with the identity); a third party's
    # summary may say no label (the line's "agent" is then the identity's, if any)
    if values["agent"] is not None and label is None:
        values["agent"] = _with(values["agent"], "exceptions",
                                values["agent"].exceptions | {"label"})
    return _part(Attempt, draw, values, skip=frozenset(
        {"verdict", "speedup", "sizes"} | ({"round"} if refined else set())
        if whole_sizes else {"verdict"}))


def identity(draw: Draw, label: str | None) -> Identity:
    return _part(Identity, draw, dict(
        nodeid=draw.text(False) + "::t[np2]", run=draw.text(False), task=draw.text(False),
        title=draw.text(), category=draw.text(), library=draw.text(), difficulty=draw.text(),
        setup=draw.text(), world=draw.whole(1), model=draw.text(),
        commbench_version=draw.text(False), task_hash=draw.text(False),
        platform=draw.text(False), candidate=draw.rng.choice(["", "s0", "s3", "mutant-x"]),
        kind=draw.rng.choice(["solution", "mutant"]),
        refine_rounds=draw.whole(1) if draw.chance(0.9) else None,
        budget_usd=draw.number(0, 10) if draw.chance() else None,
        hints=True if draw.chance(0.2) else None, agent=label),
        skip=frozenset({"nodeid", "agent"}))


def line(draw: Draw, whole_sizes: bool = False) -> ResultLine:
    """A started line or a result line, with every part drawn."""
    label = draw.rng.choice([None, None, "geak", "best-of-two"])
    item = identity(draw, label)
    if draw.chance(0.15) and not whole_sizes:
        return ResultLine.started_line(item, draw.text(False))
    return _part(ResultLine, draw, dict(
        item=item, attempt=attempt(draw, label, whole_sizes),
        seed=draw.whole() if draw.chance(0.9) else None,
        band=draw.rng.choice(["", "Better", "inconclusive", None]),
        fingerprint=draw.blob() if draw.chance(0.9) else None,
        started=draw.text(False) if draw.chance(0.1) else None,
        finished=draw.text(False) if draw.chance(0.8) else None,
        run_label=draw.text(False) if draw.chance(0.1) else None,
        worlds=(2, 4) if draw.chance(0.1) else None, extra=draw.later()),
        skip=frozenset({"event", "fingerprint"}))


def draws(n: int = DRAWS, whole_sizes: bool = False):
    for seed in range(n):
        yield seed, line(Draw(seed), whole_sizes)


# -- JSON and JSONL -------------------------------------------------------------------------

def test_every_drawn_record_round_trips_through_its_json():
    for seed, r in draws():
        data = r.to_json()
        assert problem(data) is None, (seed, problem(data))
        back = ResultLine.from_json(json.loads(json.dumps(data)))
        assert back == r, seed
        assert back.to_json() == data, seed
        assert dict(r) == data and r["event"] == data["event"]  # the mapping view: the JSON


def test_every_drawn_record_round_trips_through_the_results_log(tmp_path):
    log = ResultsLog(tmp_path / "results.jsonl")
    drawn = [r for _, r in draws()]
    for r in drawn:
        log.write(r)
    read = list(entries(log.path, skipped=None))
    assert read == drawn
    assert [json.loads(x) for x in log.path.read_text().splitlines()] == \
        [r.to_json() for r in drawn]


def test_a_line_says_only_what_was_said_and_keeps_what_it_does_not_know():
    old = {"event": "result", "nodeid": "n", "task": "t", "verdict": "pass", "speedup": None,
           "speedup_se": None, "a_field_of_a_later_version": [1, {"x": 2}],
           "agent_something_new": 3, "sizes": [{"count": 1, "speedup": 2.0, "later": True}]}
    r = ResultLine.from_json(old)
    assert r.to_json() == old
    assert r.item.model is None and r.item.kind == "solution" and r.result.usage.tokens_in == 0
    assert r.result.sizes[0].count == 1 and r.result.sizes[0].extra == {"later": True}
    assert r.result.agent is not None and r.result.agent.extra == {"agent_something_new": 3}
    assert r.extra == {"a_field_of_a_later_version": [1, {"x": 2}]}
    # a report that sets a field the line lacked writes it
    assert "cost" in r.result.usage.evolve(cost=1.5).to_json()


def test_every_kept_log_of_this_repository_is_written_back_exactly_as_read():
    logs = sorted(REPO.glob("fixtures/**/*.jsonl")) + sorted(REPO.glob("benchmarks/**/*.jsonl"))
    assert logs
    lines = 0
    for path in logs:
        for raw in path.read_bytes().splitlines():
            if raw.strip():
                data = json.loads(raw)
                assert ResultLine.from_json(data).to_json() == data, path
                lines += 1
        assert len(load(path)) > 0
    assert lines > 100


def test_a_line_that_is_no_record_is_refused_with_why():
    good = {"event": "result", "nodeid": "n", "verdict": "pass"}
    for bad, why in (({**good, "speedup": -1.0}, "'speedup'"), ({**good, "world": 0}, "'world'"),
                     ({**good, "cost": float("inf")}, "'cost'"), ({**good, "event": "x"}, "event"),
                     ({**good, "sizes": [1]}, "'sizes'"), ({"event": "result", "nodeid": "n"},
                                                           "verdict")):
        with pytest.raises(record.RecordError, match=why):
            ResultLine.read(bad)
    assert ResultLine.read(good).verdict == "pass"


# -- JUnit ----------------------------------------------------------------------------------

def test_every_drawn_record_round_trips_through_its_junit_properties():
    for seed, r in draws(whole_sizes=True):
        props = junit_properties(r)
        assert all(isinstance(k, str) and isinstance(v, BUILTIN) for k, v in props), seed
        back = from_junit(json.loads(json.dumps(props)))
        # the summary carries the JUnit fields of the line, each as the line has it
        assert back.summary() == r.summary(), seed
        # (a field the line lacks is null in the summary)
        assert back.verdict == r.verdict and back.item.task == r.get("task"), seed
        assert back.result.speedup == r.result.speedup and back.seed == r.seed, seed
        assert back.result.sizes == r.result.sizes, seed
        flat = dict(props)
        a = r.result
        assert flat["commbench.verdict"] == a.verdict and flat["commbench.world_size"] == \
            r.item.world and flat["commbench.tokens_in"] == a.usage.tokens_in, seed
        assert flat["commbench.cost_usd"] == (round(a.usage.dollars, 6) if a.usage.known
                                              else "unknown"), seed
        assert ("commbench.speedup" in flat) == (a.speedup is not None), seed
        for s in a.sizes:
            key = f"commbench.size.{s.count}.{s.dtype}"
            assert flat[f"{key}.speedup"] == round(s.speedup, 4), seed
        assert set(json.loads(flat["commbench.record"])) == set(ResultLine.junit_keys()), seed


def test_the_junit_summary_has_the_fields_it_always_had():
    assert set(ResultLine.junit_keys()) == {
        "nodeid", "task", "title", "category", "library", "difficulty", "setup", "world",
        "model", "candidate", "kind", "verdict", "message", "speedup", "speedup_se",
        "timing_rounds", "timing_trust", "timing_stopped", "speedup_ci90", "host_load",
        "check_only", "compile_only", "commbench_version", "task_hash", "replayed",
        "price_source", "band", "sizes", "rounds", "round", "round_history", "agent",
        "agent_calls", "agent_restarts", "agent_kept", "agent_first", "cost", "tokens_in",
        "tokens_out", "seed", "run"}
