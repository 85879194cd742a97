"""A suite spread over machines: `--commbench-shard K/N` runs one part of the selected items,
and `commbench report` puts the parts of one run back together.

The split is by task: every item of a task (all its world sizes, samples and candidates)
lands in the same shard, so a task's score is never made of parts judged on two machines.
Where a task goes depends only on the selection and on a SHA-256 hash of the task's path
below the suites folder: not on collection order, the machine or Python's salted `hash`, so
that N machines given the same command (the same suite, -k, -m) agree on their parts
without talking to each other. The tasks are dealt out largest first (most items), in hash
order among equals, each to the shard with the fewest items so far: shards differ by at most
one task's items.

Each shard is a run of its own (its own folder, log and seed); its `run.json` names the
shard (`"shard": "K/N"`) and the name the shards of one run share (`"run_name"`, given with
--commbench-run-name, or inside a Slurm job array `slurm-<array job id>`). The report takes
runs of one name and model as the parts of one run: it refuses two parts that overlap (one
shard number twice, an item judged in two shards, shards of different N) and names the
missing parts on the scores' headline line where fewer than N are there.

No pytest here: the report reads run folders without it."""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .record import ResultLine, as_lines

#: the key of run.json that names the shard ("K/N"), and the one that names the run it is part of
SHARD_KEY = "shard"
NAME_KEY = "run_name"
_SPEC = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")


@dataclass(frozen=True, order=True)
class Shard:
    """Part `index` (1-based) of `count`."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse(text: Any) -> Shard:
    """`K/N` with 1 <= K <= N; ValueError saying what is wrong otherwise."""
    found = _SPEC.fullmatch(str(text))
    if not found:
        raise ValueError(f"expected K/N (shard K of N, e.g. 2/4), got {str(text)!r}")
    index, count = int(found[1]), int(found[2])
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"expected K/N with 1 <= K <= N (e.g. 2/4), got {str(text)!r}")
    return Shard(index, count)


def parse_name(text: Any) -> str:
    """A run name: letters, digits and . _ + - (it goes into run.json and commands)."""
    name = str(text).strip()
    if not _NAME.fullmatch(name):
        raise ValueError("expected a name of letters, digits and . _ + - (at most 128, "
                         f"starting with a letter or digit), got {str(text)!r}")
    return name


def default_name(environ: Mapping[str, str] = os.environ) -> str | None:
    """The name the shards of one run share where none is given: inside a Slurm job array
    (sbatch --array, submitit's map_array) the array's job id, the same for every index."""
    job = environ.get("SLURM_ARRAY_JOB_ID", "").strip()
    return f"slurm-{job}" if job.isdigit() else None


# -- the split --------------------------------------------------------------------------------

def task_hash(key: str) -> int:
    """A stable number for a task's path (the same on every machine and run)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")


def assign(sizes: Mapping[str, int], count: int) -> dict[str, int]:
    """Each task (its path -> its number of items) to a shard 1..count: largest first, in
    hash order among equals, each to the shard with the fewest items so far (the lowest
    number among equals)."""
    load = [0] * count
    out = {}
    for key in sorted(sizes, key=lambda k: (-sizes[k], task_hash(k), k)):
        best = min(range(count), key=lambda i: (load[i], i))
        out[key] = best + 1
        load[best] += sizes[key]
    return out


def item_task(item: Any) -> str:
    """What an item is split by: its task's path below the suites folder; an item of no task
    (a test beside the suites) by its file's part of the node id."""
    task = getattr(item, "task", None)
    relpath = getattr(task, "relpath", None)
    return str(relpath) if relpath else str(item.nodeid).split("::", 1)[0]


def split(items: Iterable[Any], shard: Shard,
          key: Callable[[Any], str] = item_task) -> tuple[list[Any], list[Any]]:
    """(the items of `shard`, the others), each in the order given."""
    items = list(items)
    sizes = Counter(key(item) for item in items)
    where = assign(sizes, shard.count)
    kept = [item for item in items if where[key(item)] == shard.index]
    return kept, [item for item in items if where[key(item)] != shard.index]


def deselect(config: Any, items: list, shard: Shard | None) -> tuple[int, int] | None:
    """Keep `items` (the session's selection, after -k and -m) to this shard's, the rest
    reported deselected as -k does; (this shard's tasks, the selection's), None unsharded."""
    if shard is None or shard.count == 1:
        return None
    kept, dropped = split(items, shard)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    return len({item_task(i) for i in kept}), len({item_task(i) for i in kept + dropped})


# -- the report: shards of one run --------------------------------------------------------

def of(info: Mapping[str, Any]) -> Shard | None:
    """The shard a run's run.json names (None: a whole run, or a value not understood)."""
    value = info.get(SHARD_KEY)
    if value in (None, ""):
        return None
    try:
        return parse(value)
    except ValueError:
        return None


@dataclass
class Part:
    """One run of a report that is a shard: what the merge needs of it."""

    folder: Path
    name: str
    models: tuple[str, ...]
    shard: Shard
    items: frozenset[str]  # node id (and candidate) of every item it recorded (results.load)


@dataclass
class Merge:
    error: str | None  # one line: the parts overlap and are not reported
    notes: list[str]  # a line per run of shards: merged, or which of its shards are missing
    partial: dict[Path, str]  # a run folder -> what its headline says (shards missing)


def _item(record: Mapping[str, Any]) -> str:
    return f"{record.get('nodeid')} {record.get('candidate') or ''}".strip()


def part(folder: Path, info: Mapping[str, Any], records: Iterable[Mapping[str, Any]],
         models: Iterable[str]) -> Part | None:
    shard = of(info)
    if shard is None:
        return None
    name = str(info.get(NAME_KEY) or info.get("run") or folder.name)
    return Part(folder, name, tuple(models), shard,
                frozenset(_item(r) for r in records))


def _shards(shards: Iterable[Shard]) -> str:
    return ", ".join(str(s) for s in sorted(shards))


def merge(parts: Iterable[Part]) -> Merge:
    """The shards given to a report, grouped by run name and model: one error line where any
    overlap, else a note for each run (and a headline text per folder of a run with shards
    missing)."""
    groups: dict[tuple[str, tuple[str, ...]], list[Part]] = {}
    for p in parts:
        groups.setdefault((p.name, p.models), []).append(p)
    notes: list[str] = []
    partial: dict[Path, str] = {}
    for (name, models), members in sorted(groups.items()):
        who = f"run {name} (model {', '.join(models) or '?'})"
        counts = sorted({p.shard.count for p in members})
        if len(counts) > 1:
            return Merge(f"the shards of {who} split the suite in different numbers of parts "
                         f"({_shards(p.shard for p in members)}), so they overlap: report "
                         "shards of one split", [], {})
        seen: dict[int, Part] = {}
        for p in sorted(members, key=lambda p: (p.shard, str(p.folder))):
            if p.shard.index in seen:
                return Merge(f"shard {p.shard} of {who} is given twice ({seen[p.shard.index].folder}"
                             f" and {p.folder}): give one of them", [], {})
            seen[p.shard.index] = p
        ordered = sorted(members, key=lambda p: p.shard)
        for i, a in enumerate(ordered):
            for b in ordered[i + 1:]:
                shared = a.items & b.items
                if shared:
                    return Merge(f"shards {a.shard} and {b.shard} of {who} both judged "
                                 f"{len(shared)} item{'s' * (len(shared) > 1)} (e.g. "
                                 f"{min(shared)}): were they run with the same selection?",
                                 [], {})
        missing = [Shard(k, counts[0]) for k in range(1, counts[0] + 1) if k not in seen]
        if not missing and counts[0] > 1:
            notes.append(f"{who}: its {counts[0]} shards merged")
        if missing:
            here = _shards(p.shard for p in members)
            text = (f"PARTIAL: shard{'s' * (len(members) > 1)} {here} of run {name}, "
                    f"missing {_shards(missing)}")
            notes.append(f"{who}: only shard{'s' * (len(members) > 1)} {here} here; "
                         f"missing {_shards(missing)} (not given, not finished, or of no "
                         "task): reporting what is there")
            for p in members:
                partial[p.folder] = text
    return Merge(None, notes, partial)


def headline_note(records: Iterable[ResultLine | Mapping[str, Any]]) -> str:
    """What the scores' headline adds for records of a run whose shards are not all there."""
    found = sorted({r.partial_note for r in as_lines(records) if r.partial_note})
    return f"   ({'; '.join(found)})" if found else ""
