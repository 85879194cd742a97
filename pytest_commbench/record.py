"""The result record, typed from end to end: an item's identity, its attempt (verdict, per-size
figures, timing, speedup and intervals), what answering cost, the rounds of a strategy, and
the one result line they make, with its one serializer (`to_json`/`from_json`). The JSON is
the results log's line as it always was (field names and shape unchanged); the JUnit
properties, the hook's argument, the reports and a resume read the typed record.

Every part is a frozen dataclass whose fields say how they are written (`written`):

- `ALWAYS`: written, null included;
- `SET`: written where not None (what was measured or said, an agent's own, ...);
- `("with", name)`: written where the field `name` is not None (a refinement's first passing
  round goes with its history, null where no round passed).

A line is read tolerantly, as lines of any version are: a field it lacks keeps its default,
and a field it has or lacks unlike its rule (an older line without a field always written
now, or with null where a field is written only where set) is remembered in `exceptions`, so
that the line is written back as it was read; a field this version does not know is kept in
`extra` (of the line, of a size, of a round) and written back as it is. `problem` says why a
parsed line is no record a report or a resume can use (the checks are declared with the
fields); `ResultLine.read` refuses such a line (`RecordError`).

Every string of a line is capped (`cap`): a solution controls its exception messages and its
output, and a 50 MB message must not make a 100 MB line (or a 100 MB JUnit property).

This module imports only the verdicts and the standard library: everything that writes or
reads a result imports it, never the other way round."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from functools import cache, cached_property
from typing import Any, ClassVar

from .verdicts import Verdict

ALWAYS = "always"
SET = "set"

ABORTED = "aborted"  # the verdict of an item that started and never ended
STARTED, RESULT = "started", "result"  # the two events of a line

# -- caps ---------------------------------------------------------------------------------------

MESSAGE_CHARS = 2000  # a one-line summary
TEXT_CHARS = 8000  # detail, output, tracebacks and anything else
LIMITS = {"message": MESSAGE_CHARS, "headline": MESSAGE_CHARS}
# fields whose end says most (the last lines of a traceback or of the ranks' output)
TAILS = frozenset({"detail", "output", "traceback", "stderr", "stdout"})


def cap_text(text: str, limit: int, tail: bool = False) -> str:
    """`text` in at most `limit` characters, saying how much was cut (idempotent)."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - 64)  # room for the note
    note = f"[... {len(text) - keep:,} characters cut ...]"
    if tail:
        return f"{note}\n{text[len(text) - keep:]}"[-limit:] if keep else note[:limit]
    return f"{text[:keep]}\n{note}"[:limit]


def cap(value: Any, key: str | None = None) -> Any:
    """A copy of a line (JSON, or a typed line) with every string (values, keys, nested)
    capped by its field."""
    if isinstance(value, ResultLine):
        return value.capped()
    if isinstance(value, str):
        return cap_text(value, LIMITS.get(key or "", TEXT_CHARS), tail=key in TAILS)
    if isinstance(value, dict):
        return {cap_text(str(k), TEXT_CHARS): cap(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [cap(v, key) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return cap(str(value), key)  # what json would have written with default=str


# -- the checks a read line must pass -----------------------------------------------------------

def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def _whole(value: Any, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


TEXT = ("a string", lambda v: isinstance(v, str))
NAME = ("a string", lambda v: isinstance(v, str) and v != "")
COUNT = ("a whole number (0 or more)", _whole)
DOLLARS = ("a finite number of dollars (0 or more) or null",
           lambda v: v is None or _number(v) and v >= 0)


# -- the parts ----------------------------------------------------------------------------------

def written(default: Any = None, *, key: str | None = None, when: Any = ALWAYS,
            part: type | None = None, each: type | None = None,
            check: tuple[str, Callable[[Any], bool]] | None = None, junit: bool = True,
            factory: Callable[[], Any] | None = None) -> Any:
    """A field of the line: its JSON `key` (its name unless given), when it is written, the
    part its JSON object is read as (`part`) or each of its list's objects (`each`), the check
    a read line's value must pass, and whether the JUnit summary carries it."""
    meta: dict[str, Any] = {"when": when, "junit": junit}
    for name, value in (("key", key), ("part", part), ("each", each), ("check", check)):
        if value is not None:
            meta[name] = value
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def flat(part: type, *, optional: bool = False) -> Any:
    """A part whose fields are written into the object of the part that holds it (the line
    is flat: its identity, attempt and usage share one object)."""
    if optional:
        return field(default=None, metadata={"flat": part})
    return field(default_factory=part, metadata={"flat": part})


def _plain(value: Any) -> Any:
    if isinstance(value, Part):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class _Spec:
    """A field of a part as the serializer reads it."""

    name: str
    key: str
    meta: Mapping[str, Any]
    flat: type | None
    default: Any  # its default (None where a factory makes it: never a None)


class Part:
    """What every part of the line shares: one serializer, driven by its fields' `written`."""

    exceptions: frozenset[str]
    #: the prefixes of keys a part claims besides its fields' (an agent's "agent_*")
    prefixes: ClassVar[tuple[str, ...]] = ()
    _specs: ClassVar[dict[type, tuple[_Spec, ...]]] = {}
    _known: ClassVar[dict[type, tuple[frozenset[str], tuple[str, ...], bool]]] = {}

    @classmethod
    def _fields(cls) -> tuple[_Spec, ...]:
        specs = Part._specs.get(cls)
        if specs is None:
            specs = tuple(
                _Spec(f.name, f.metadata.get("key", f.name), f.metadata, f.metadata.get("flat"),
                      f.default if f.default is not MISSING else None)
                for f in fields(cls)  # type: ignore[arg-type]
                if "when" in f.metadata or "flat" in f.metadata)
            Part._specs[cls] = specs
        return specs

    @classmethod
    def _keys(cls) -> tuple[frozenset[str], tuple[str, ...], bool]:
        """The keys the part claims, the prefixes it claims and whether it keeps `extra`."""
        known = Part._known.get(cls)
        if known is None:
            keys, prefixes = set(), list(cls.prefixes)
            for f in cls._fields():
                if f.flat is not None:
                    inner, more, _ = f.flat._keys()
                    keys |= inner
                    prefixes += more
                else:
                    keys.add(f.key)
            known = (frozenset(keys), tuple(prefixes),
                     "extra" in {f.name for f in fields(cls)})  # type: ignore[arg-type]
            Part._known[cls] = known
        return known

    def __post_init__(self) -> None:
        """Values given as JSON (a third party's dicts and lists) become the typed parts."""
        for f in self._fields():
            value = getattr(self, f.name)
            if value is None or isinstance(value, (str, int, float, Part)):
                continue
            if isinstance(value, (dict, Mapping)):
                kind = f.flat or f.meta.get("part")
                if kind is None:
                    continue
                value = kind.from_json(value)
            elif isinstance(value, (list, tuple)):
                each = f.meta.get("each")
                if each is not None:
                    value = tuple(each.from_json(v) if isinstance(v, Mapping) else v
                                  for v in value)
                elif isinstance(value, list):
                    value = tuple(value)
                else:
                    continue
            else:
                continue
            object.__setattr__(self, f.name, value)

    @staticmethod
    def _rule(f: _Spec, value: Any, other: Callable[[str], Any]) -> bool:
        """Whether the field's rule writes it, its value (and the one its rule names) as
        they stand."""
        when = f.meta["when"]
        if when == ALWAYS:
            return True
        if when == SET:
            return value is not None
        return other(when[1]) is not None  # ("with", other field)

    def _writes(self, f: _Spec) -> bool:
        return self._rule(f, getattr(self, f.name), lambda name: getattr(self, name))

    def to_json(self) -> dict[str, Any]:
        """The part as the line's JSON object (fields it does not know, then its own)."""
        out: dict[str, Any] = dict(getattr(self, "extra", None) or {})
        for f in self._fields():
            value = getattr(self, f.name)
            if f.flat is not None:
                if value is not None:
                    out.update(value.to_json())
            elif self._writes(f) != (f.name in self.exceptions):
                out[f.key] = _plain(value)
        return out

    def evolve(self, **changes: Any):
        """A copy with `changes`, each written by its rule (a report that sets a field of a
        line read without it writes it)."""
        return replace(self, **changes, exceptions=self.exceptions - changes.keys())

    @classmethod
    def claims(cls, key: str) -> bool:
        """Whether a JSON key is one of this part's (or of a part written into it)."""
        keys, prefixes, _ = cls._keys()
        return key in keys or key.startswith(prefixes)

    @classmethod
    def _extra(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        keys, prefixes, _ = cls._keys()
        return {k: v for k, v in data.items() if k not in keys and not k.startswith(prefixes)}

    @classmethod
    def _flat_from(cls, data: Mapping[str, Any]) -> Part | None:
        """This part from the JSON object of the part that holds it."""
        return cls.from_json(data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]):
        """The part from a JSON object of any version: fields it lacks keep their defaults;
        fields it has or lacks unlike their rule are remembered as exceptions; keys it does
        not know are kept in `extra` where the part has one (else left)."""
        kw: dict[str, Any] = {}
        specs = cls._fields()
        for f in specs:
            if f.flat is not None:
                kw[f.name] = f.flat._flat_from(data)
            elif f.key in data:
                kw[f.name] = data[f.key]
        if cls._keys()[2]:
            kw["extra"] = cls._extra(data)
        by_name = {f.name: f for f in specs}

        def value(name: str) -> Any:
            return kw[name] if name in kw else by_name[name].default

        unlike = frozenset(f.name for f in specs if f.flat is None
                           and (f.key in data) != cls._rule(f, value(f.name), value))
        return cls(**kw, exceptions=unlike)

    @classmethod
    def of(cls, value: Any):
        """The part from itself or its JSON (a report given JSON reads it so)."""
        return value if isinstance(value, cls) else cls.from_json(value)

    @classmethod
    def partial(cls, **given: Any):
        """A part that says only what is given (and what is written only where set): a line
        of an item that ended before it was judged (skipped, its worker died, aborted)."""
        made = cls(**given)
        parts = {f.name: type(getattr(made, f.name)).partial() for f in cls._fields()
                 if f.flat is not None and f.name not in given
                 and getattr(made, f.name) is not None}
        missing = frozenset(f.name for f in cls._fields() if f.flat is None
                            and f.name not in given and made._writes(f))
        return replace(made, exceptions=missing, **parts)

    @classmethod
    def checks(cls) -> Iterator[tuple[str, str, Callable[[Any], bool]]]:
        """(key, what it must be, the test) of every checked field, flat parts' included."""
        for f in cls._fields():
            if f.flat is not None:
                yield from f.flat.checks()
            elif "check" in f.meta:
                yield (f.key, *f.meta["check"])

    @classmethod
    def junit_keys(cls) -> Iterator[str]:
        """The keys the JUnit summary carries, flat parts' included."""
        for f in cls._fields():
            if f.flat is not None:
                yield from f.flat.junit_keys()
            elif f.meta["junit"]:
                yield f.key


def _exceptions() -> Any:
    return field(default=frozenset(), repr=False)


@dataclass(frozen=True)
class Size(Part):
    """One size of a timed item: both sides' medians and spreads, the task's metric of each
    side, the speedup, each job's median in the order the jobs ran, the calls per batch."""

    count: int | None = written()
    dtype: str | None = written()
    bytes: int | None = written()
    t_sol_us: float | None = written()
    t_ref_us: float | None = written()
    spread_sol: float | None = written()
    spread_ref: float | None = written()
    n: int | None = written()
    metric: str | None = written()
    unit: str | None = written()
    value_sol: float | None = written()
    value_ref: float | None = written()
    speedup: float | None = written()
    jobs_sol_us: tuple[float, ...] = written(factory=tuple)
    jobs_ref_us: tuple[float, ...] = written(factory=tuple)
    batch: int = written(1)
    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    exceptions: frozenset[str] = _exceptions()

    def value(self, role: str = "sol") -> float | None:
        """The task's metric of one side ("sol" or "ref")."""
        return self.value_sol if role == "sol" else self.value_ref

    def time_us(self, role: str = "sol") -> float | None:
        return self.t_sol_us if role == "sol" else self.t_ref_us


@dataclass(frozen=True)
class Round(Part):
    """One round of a strategy (a refinement round, an agent's iteration): its verdict and
    speedup, and for an agent the step, its role and whether it was kept (and why)."""

    round: int | None = written(when=SET)
    step: int | None = written(when=SET)
    role: str | None = written(when=SET)
    verdict: str | None = written()
    speedup: float | None = written()
    message: str | None = written(when=SET)
    kept: bool | None = written(when=SET)
    why: str | None = written(when=SET)
    restart: bool | None = written(when=SET)
    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    exceptions: frozenset[str] = _exceptions()

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.verdict, Verdict):
            object.__setattr__(self, "verdict", str(self.verdict))

    @property
    def passed(self) -> bool:
        return self.verdict == Verdict.PASS


@dataclass(frozen=True)
class MachineLoad(Part):
    """The machine's load while an item was timed: its CPUs, the item's busy ranks, the CPUs
    busy with other work (None: unknown) and whether they were more than the CPUs."""

    cpus: int | None = written()
    ranks: int | None = written()
    outside_cpus: float | None = written()
    contended: bool | None = written()
    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    exceptions: frozenset[str] = _exceptions()


def request_cost(request: Mapping[str, Any]) -> float:
    """What one request behind an answer cost when it was asked (0 where it says nothing)."""
    return float(request.get("cost") or 0.0)


def request_price(request: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The price a request's cost was computed with (None: no price was had)."""
    return (request or {}).get("price") or None


def request_limit(request: Mapping[str, Any] | None) -> int | None:
    """The output-token limit a request was made with."""
    return (request or {}).get("max_tokens")


@dataclass(frozen=True)
class Usage(Part):
    """What an item's answers cost: tokens, the requests behind them (endpoint, settings,
    usage, cost, price source), the cost in dollars and the price it was computed with, and
    whether the answer was kept from before, not asked."""

    tokens_in: int = written(0, check=COUNT)
    tokens_out: int = written(0, check=COUNT)
    cost: float | None = written(0.0, check=DOLLARS)
    requests: tuple[dict[str, Any], ...] = written(factory=tuple, junit=False)
    replayed: bool = written(False)
    price_source: dict[str, Any] | None = written(when=SET)
    exceptions: frozenset[str] = _exceptions()

    @property
    def known(self) -> bool:
        """Whether the cost is known: it names the price it was computed with, or it cost
        something (older logs name no price). A model with no price (or no token accounting,
        as the built-in ones) records a cost of 0, which is no price of $0."""
        return bool(self.price_source) or float(self.cost or 0.0) > 0

    @property
    def dollars(self) -> float:
        return float(self.cost or 0.0)

    def refused(self) -> int | None:
        """The status (401, 403) of a request the endpoint refused, else None."""
        return next((q["refused"] for q in self.requests
                     if isinstance(q, Mapping) and q.get("refused")), None)

    def endpoints(self) -> tuple[list[str], list[str]]:
        """The endpoints the requests went to, and the model ids they asked for."""
        asked = [q for q in self.requests if isinstance(q, Mapping)]
        return (sorted({str(q["endpoint"]) for q in asked if q.get("endpoint")}),
                sorted({str(q["model"]) for q in asked if q.get("model")}))


@dataclass(frozen=True)
class AgentSummary(Part):
    """An agent's own summary of an item, written flat as "agent" and "agent_*" keys: the
    model calls by role, restarts, optimizations kept, why it stopped, its first iteration,
    the knowledge packs and retrieved task of its prompt, its steps and the iteration kept
    (a third party's other "agent_*" keys are kept as they are)."""

    label: str | None = written(key="agent")
    calls: dict[str, int] | None = written(key="agent_calls")
    restarts: int | None = written(key="agent_restarts")
    kept: int | None = written(key="agent_kept")
    stop: str | None = written(key="agent_stop", junit=False)
    first: Round | None = written(key="agent_first", part=Round)
    knowledge: tuple[str, ...] | None = written(key="agent_knowledge", junit=False)
    retrieved: str | None = written(key="agent_retrieved", junit=False)
    steps: tuple[str, ...] | None = written(key="agent_steps", junit=False)
    iteration: int | None = written(key="agent_iteration", when=SET, junit=False)
    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    exceptions: frozenset[str] = _exceptions()

    prefixes: ClassVar[tuple[str, ...]] = ("agent_",)

    @classmethod
    def _extra(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        own = cls._keys()[0]
        return {k: v for k, v in data.items() if k.startswith("agent_") and k not in own}

    @classmethod
    def _flat_from(cls, data: Mapping[str, Any]) -> AgentSummary | None:
        """Only a line with an agent's own keys has a summary (a line of agent mode's
        configuration whose candidate could not be asked has the label alone)."""
        return cls.from_json(data) if any(k.startswith("agent_") for k in data) else None


@dataclass(frozen=True)
class Identity(Part):
    """What every line of an item says: the item (node id, task and its facts, world size,
    candidate and its kind), the model, the run, what produced the line (the plugin's
    version, the task's hash, the platform) and the run's settings that make its results
    another configuration of the model (rounds, budget, hints, agent)."""

    nodeid: str = written("", check=NAME)
    run: str | None = written()
    task: str = written("", check=NAME)
    title: str = written("")
    category: str = written("")
    library: str = written("")
    difficulty: str = written("")
    setup: str = written("")
    world: int | None = written(check=("a whole number of ranks (1 or more)",
                                       lambda v: _whole(v, 1)))
    model: str | None = written(check=TEXT)
    commbench_version: str | None = written()
    task_hash: str | None = written()
    platform: str | None = written(junit=False)
    candidate: str = written("")
    kind: str = written("solution")
    refine_rounds: int | None = written(junit=False)
    budget_usd: float | None = written(check=DOLLARS, junit=False)
    hints: bool | None = written(when=SET, junit=False)
    agent: str | None = written(when=SET)
    exceptions: frozenset[str] = _exceptions()

    @property
    def is_solution(self) -> bool:
        """A model's answer (a mutant is the checker's test, not a model's)."""
        return self.kind == "solution"

    @property
    def sample(self) -> int | None:
        """The sample's number of a candidate `s<k>` (None: not a sample)."""
        c = self.candidate or ""
        return int(c[1:]) if len(c) > 1 and c[0] == "s" and c[1:].isdigit() else None

    @property
    def key(self) -> str:
        """The item: its node id (its task where it has none) and its candidate."""
        item = str(self.nodeid or self.task)
        return f"{item} {self.candidate}" if self.candidate else item

    def of(self, dimension: str) -> str:
        """The value of one of the task's dimensions (category, difficulty, setup, library)."""
        return {"category": self.category, "difficulty": self.difficulty,
                "setup": self.setup, "library": self.library, "task": self.task}[dimension]


@dataclass(frozen=True)
class Attempt(Part):
    """One attempt's result: what `engine.evaluate` returns and what a strategy returns for the
    item (the answer it keeps, with its usage over every answer, its rounds and its own
    summary). The reply's text and whether the speedup is less precise than asked travel
    with it and are never written."""

    verdict: str = written(check=NAME)
    message: str = written("", check=TEXT)
    detail: str = written("", junit=False)
    output: str = written("", junit=False)  # the solution's output (tail)
    duration_s: float = written(0.0, check=("a finite number of seconds (0 or more)",
                                            lambda v: _number(v) and v >= 0), junit=False)
    usage: Usage = flat(Usage)
    rounds: int = written(1)  # the model's own rounds for the answer (a multi-turn source's)
    # what was measured: per-size figures and the speedup, and how far it may be read
    speedup: float | None = written(check=("a finite positive number or null",
                                           lambda v: v is None or _number(v) and v > 0))
    sizes: tuple[Size, ...] = written(factory=tuple, each=Size, check=(
        "a list of objects", lambda v: isinstance(v, list) and all(isinstance(x, dict)
                                                                   for x in v)))
    check_only: bool | None = written(when=SET)
    compile_only: bool | None = written(when=SET)
    speedup_se: float | None = written(when=SET, check=(
        "a finite number or null", lambda v: v is None or _number(v) and v >= 0))
    speedup_ci90: tuple[float, float] | None = written(when=SET, check=(
        "null or two finite numbers", lambda v: v is None or (
            isinstance(v, list) and len(v) == 2 and all(_number(x) for x in v))))
    timing_trust: str | None = written(when=SET)
    host_load: MachineLoad | None = written(when=SET, part=MachineLoad)
    timing_rounds: int | None = written(when=SET)
    timing_stopped: str | None = written(when=SET)
    untimed_phases_us: dict[str, Any] | None = written(when=SET, junit=False)
    # per job of a timed item (check, warmup, ref0, sol0, ...): its start, cases and end in
    # seconds, where an item's time went
    job_phases_s: dict[str, Any] | None = written(when=SET, junit=False)
    # each rank's host, from the item's first job that reached the observer (where ranks
    # said it: placement over nodes)
    hosts: list[str | None] | None = written(when=SET, junit=False, check=(
        "a list of host names", lambda v: v is None or isinstance(v, list) and all(
            x is None or isinstance(x, str) for x in v)))
    # a job over several nodes (its ranks through node agents): each node's clock offset's
    # uncertainty in microseconds, from the item's first such job
    clock_skew_us: dict[str, Any] | None = written(when=SET, junit=False, check=(
        "a mapping of host names to numbers", lambda v: v is None or isinstance(v, dict) and all(
            isinstance(k, str) and _number(x) for k, x in v.items())))
    # a strategy's parts: every round and the first round that passed (written together,
    # where the answers could be refined), and an agent's summary
    round_history: tuple[Round, ...] | None = written(when=SET, each=Round)
    round: int | None = written(when=("with", "round_history"))
    agent: AgentSummary | None = flat(AgentSummary, optional=True)
    # never written
    reply_text: str = field(default="", repr=False, compare=False)
    imprecise: bool = field(default=True, repr=False, compare=False)
    exceptions: frozenset[str] = _exceptions()

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.verdict, Verdict):
            object.__setattr__(self, "verdict", str(self.verdict))
        if self.sizes is None:  # a JUnit summary of an item that ended early
            object.__setattr__(self, "sizes", ())

    @property
    def passed(self) -> bool:
        return self.verdict == Verdict.PASS

    @property
    def timed(self) -> bool:
        """A speedup was measured (a positive, finite one)."""
        s = self.speedup
        return s is not None and s > 0 and math.isfinite(s)

    # the engine's names of old: a strategy's dict (`as_record`) is the attempt's JSON
    def as_record(self) -> dict[str, Any]:
        return self.to_json()

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Attempt:
        return cls.from_json(record)


@dataclass(frozen=True)
class ResultLine(Part, Mapping):
    """One line of the results log: a "started" line (the item's identity, when it began) or
    a "result" line (the identity, the attempt, the seed that reproduces its inputs, its
    band, the machine's fingerprint, when it finished). A report may add the run's label, a
    task's world sizes (`scoring.per_task`) and, for a run of shards some of which are
    missing, the note its headline carries (`partial_note`); none of them is in a log.

    Read only as typed fields by this package; its mapping view (`line["verdict"]`,
    `line.get("speedup")`) is the line's JSON, for hooks and scripts written against it."""

    event: str = written(RESULT, junit=False)
    item: Identity = flat(Identity)
    attempt: Attempt | None = flat(Attempt, optional=True)
    seed: int | None = written(when=SET)
    band: str | None = written(when=SET)
    fingerprint: dict[str, Any] | None = written(when=SET, check=(
        "an object", lambda v: isinstance(v, dict)), junit=False)
    started: str | None = written(when=SET, junit=False)
    finished: str | None = written(when=SET, junit=False)
    run_label: str | None = written(when=SET, junit=False)
    worlds: tuple[int, ...] | None = written(when=SET, junit=False)
    partial_note: str | None = written(when=SET, key="_shards_partial", junit=False)
    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    exceptions: frozenset[str] = _exceptions()

    # -- the serializer --------------------------------------------------------------------
    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResultLine:
        """A line from its JSON (a started line has no attempt)."""
        if isinstance(data, ResultLine):
            return data
        line = super().from_json(data)
        if data.get("event") == STARTED and line.attempt is not None:
            line = replace(line, attempt=None)
        return line

    @classmethod
    def read(cls, data: Any) -> ResultLine:
        """A line of a log: RecordError where it is no record a report or a resume can use."""
        why = problem(data)
        if why is not None:
            raise RecordError(why)
        return cls.from_json(data)

    @classmethod
    def started_line(cls, item: Identity, when: str) -> ResultLine:
        return cls(event=STARTED, item=item, started=when)

    def aborted(self) -> ResultLine:
        """The result of an item that started and never finished (a failure of the model:
        see scoring), from its started line."""
        return replace(self, event=RESULT, attempt=Attempt.partial(
            verdict=ABORTED, message="the item started and never finished"))

    def capped(self) -> ResultLine:
        """The line with every string capped, as it is written."""
        return ResultLine.from_json(cap(self.to_json()))

    def dumps(self) -> str:
        """The line as the log holds it (capped, keys sorted)."""
        return json.dumps(cap(self.to_json()), sort_keys=True)

    # -- the mapping view (the line's JSON) ------------------------------------------------
    @cached_property
    def _json(self) -> dict[str, Any]:
        return self.to_json()

    def __getitem__(self, key: str) -> Any:
        return self._json[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._json)

    def __len__(self) -> int:
        return len(self._json)

    __hash__ = None  # type: ignore[assignment]  # it holds lists and objects

    # -- what readers ask ------------------------------------------------------------------
    @property
    def result(self) -> Attempt:
        """The attempt of a result line (an empty one, of no verdict, for a started line)."""
        return self.attempt if self.attempt is not None else Attempt.partial(verdict="")

    @property
    def verdict(self) -> str:
        return str(self.result.verdict or ABORTED)

    @property
    def passed(self) -> bool:
        return self.result.passed

    @property
    def is_solution(self) -> bool:
        return self.item.is_solution

    @property
    def placement(self) -> str:
        """Where the ranks ran, as the machine's fingerprint says ("shared..." where ranks
        shared a GPU); "" where it says nothing."""
        return str((self.fingerprint or {}).get("placement", ""))

    def summary(self) -> dict[str, Any]:
        """The JUnit summary: every field it carries, null where the line has none."""
        data = self.to_json()
        return {k: data.get(k) for k in dict.fromkeys(ResultLine.junit_keys())}


class RecordError(ValueError):
    """A parsed line that is no record a report or a resume can use."""


def problem(entry: Any) -> str | None:
    """Why a parsed line is no record a report or a resume can use (None: it is one). Fields
    a line lacks are fine (older logs, items that ended early); the checks are the fields'."""
    if not isinstance(entry, Mapping):
        return "not an object"
    event = entry.get("event")
    if event not in (STARTED, RESULT):
        return f"'event' is {event!r}, not 'started' or 'result'"
    if not isinstance(entry.get("nodeid"), str) or not entry["nodeid"]:
        return "no 'nodeid' (the item it is about)"
    if event == RESULT and "verdict" not in entry:
        return "a result without a 'verdict'"
    for key, what, ok in _line_checks():
        if key in entry and not ok(entry[key]):
            return f"{key!r} is {str(entry[key])[:60]!r}, not {what}"
    return None


@cache
def _line_checks() -> tuple[tuple[str, str, Callable[[Any], bool]], ...]:
    return tuple(ResultLine.checks())


def looks_like_line(entry: Any) -> bool:
    """Whether a JSON object found inside a torn line is a line of its own."""
    return isinstance(entry, Mapping) and entry.get("event") in (STARTED, RESULT) and \
        isinstance(entry.get("nodeid"), str)


def as_lines(records: Iterable[ResultLine | Mapping[str, Any]]) -> list[ResultLine]:
    """Typed lines from lines or their JSON."""
    return [ResultLine.of(r) for r in records]


# -- JUnit ------------------------------------------------------------------------------------

JUNIT_RECORD = "commbench.record"


def junit_properties(line: ResultLine) -> list[tuple[str, Any]]:
    """Flat (str, builtin) pairs: one per figure for CI dashboards, plus the summary (the
    line's JUnit fields, as JSON)."""
    item, a = line.item, line.result
    props: list[tuple[str, Any]] = [
        ("commbench.verdict", a.verdict),
        ("commbench.task", item.task),
        ("commbench.category", item.category),
        ("commbench.world_size", item.world),
        ("commbench.tokens_in", a.usage.tokens_in),
        ("commbench.tokens_out", a.usage.tokens_out),
        ("commbench.cost_usd", round(a.usage.dollars, 6) if a.usage.known else "unknown"),
        ("commbench.version", item.commbench_version or ""),
        ("commbench.task_hash", item.task_hash or ""),
    ]
    if a.round is not None:
        props.append(("commbench.round", a.round))
    if a.speedup is not None:
        props += [("commbench.speedup", round(a.speedup, 4)),
                  ("commbench.band", line.band or "")]
    if a.timing_trust:
        props.append(("commbench.timing_trust", a.timing_trust))
    if a.speedup_ci90:
        props += [("commbench.speedup_ci90_lo", round(a.speedup_ci90[0], 4)),
                  ("commbench.speedup_ci90_hi", round(a.speedup_ci90[1], 4))]
    if a.speedup_se is not None:
        props += [("commbench.speedup_se", round(a.speedup_se, 4)),
                  ("commbench.timing_rounds", a.timing_rounds)]
    for s in a.sizes:
        key = f"commbench.size.{s.count}.{s.dtype}"
        props += [
            (f"{key}.speedup", round(s.speedup, 4)),
            (f"{key}.t_sol_us", round(s.t_sol_us, 3)),
            (f"{key}.t_ref_us", round(s.t_ref_us, 3)),
            (f"{key}.spread_sol", round(s.spread_sol, 4)),
        ]
        if s.value_sol is not None:
            props.append((f"{key}.{s.metric}_{s.unit}", round(s.value_sol, 4)))
    props.append((JUNIT_RECORD, json.dumps(cap(line.summary()), sort_keys=True, default=str)))
    return props


def from_junit(properties: Iterable[tuple[str, Any]]) -> ResultLine | None:
    """The line of an item's JUnit properties (its summary: the JUnit fields), or None."""
    for name, value in properties:
        if name == JUNIT_RECORD:
            return ResultLine.from_json(json.loads(value))
    return None
