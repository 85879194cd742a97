"""Which records are pooled into one report and one entry: records of one hardware/software
fingerprint (`fingerprints`, `split`; `check_one_fingerprint` refuses a mix, naming what
differs), one version of each task (`changed_tasks`, `split_changed`), and runs of one entry
that judged disjoint items (`runs_judging_the_same_items`). An entry is one model in one
configuration (`entry_key`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from ..record import ResultLine, as_lines
from ..scoring import Records


class FingerprintMismatch(ValueError):
    """Records of machines or software that differ, given to one report."""


def fingerprints(records: Records) -> list[tuple[dict, list[ResultLine]]]:
    """The records grouped by their hardware/software fingerprint, in order of first sight. A
    record without one (an item that started and never finished) takes its run's."""
    records = as_lines(records)
    by_run: dict[str, dict] = {}
    for r in records:
        if r.fingerprint and r.item.run:
            by_run.setdefault(r.item.run, r.fingerprint)
    groups: dict[str, tuple[dict, list[ResultLine]]] = {}
    for r in records:
        fp = r.fingerprint or by_run.get(r.item.run or "", {}) or {}
        groups.setdefault(json.dumps(fp, sort_keys=True, default=str), (fp, []))[1].append(r)
    return list(groups.values())


def fingerprint_label(fp: dict) -> str:
    """A short name for a fingerprint group: its platform and a hash of the whole."""
    digest = hashlib.sha256(json.dumps(fp, sort_keys=True, default=str).encode()).hexdigest()
    return f"{fp.get('platform', 'unknown')}-{digest[:8]}"


def _who(records: list[ResultLine]) -> str:
    models = sorted({str(r.item.model or "?") for r in records})
    runs = sorted({str(r.item.run) for r in records if r.item.run})
    return (f"model{'s' * (len(models) > 1)} {', '.join(models)}"
            + (f", run{'s' * (len(runs) > 1)} {', '.join(runs)}" if runs else ""))


def difference(groups: list[tuple[dict, list[ResultLine]]]) -> str:
    """What differs between fingerprint groups, field by field, with whose records have
    each value."""
    fields = sorted({k for fp, _ in groups for k in fp}, key=lambda k: (k != "platform", k)) \
        or ["fingerprint"]
    lines = []
    for key in fields:
        values = [fp.get(key, "(not recorded)") if fp else "(no fingerprint)" for fp, _ in groups]
        if len({json.dumps(v, default=str) for v in values}) > 1:
            lines.append(f"  {key}: " + " vs ".join(
                f"{v!r} ({_who(recs)})" if isinstance(v, str) and not v.startswith("(")
                else f"{v} ({_who(recs)})" for v, (_, recs) in zip(values, groups)))
    return "\n".join(lines)


def check_one_fingerprint(records: Records) -> dict:
    """The fingerprint all the records share; FingerprintMismatch naming the differing fields
    where they do not."""
    groups = fingerprints(records)
    if len(groups) > 1:
        raise FingerprintMismatch(
            "these runs were made on different hardware or software, and their results are "
            "not pooled:\n" + difference(groups)
            + "\nreport them separately, or give --by-fingerprint for one report per group")
    return groups[0][0] if groups else {}


def changed_tasks(records: Records) -> dict[str, dict[str, list[str]]]:
    """Tasks whose records carry different task hashes (the task, its reference or its
    oracle changed between the runs): {task: {hash: [runs]}}. Records made before hashes
    were written carry none and are not compared."""
    seen: dict[str, dict[str, set[str]]] = {}
    for r in as_lines(records):
        if r.event == "result" and r.item.task_hash:
            seen.setdefault(r.item.task, {}).setdefault(r.item.task_hash, set()).add(
                str(r.item.run or "?"))
    return {task: {h: sorted(runs) for h, runs in by_hash.items()}
            for task, by_hash in seen.items() if len(by_hash) > 1}


def describe_changed(changed: dict[str, dict[str, list[str]]]) -> str:
    return "\n".join(f"  {task}: " + " vs ".join(f"{h} (run{'s' * (len(runs) > 1)} "
                                                  f"{', '.join(runs)})" for h, runs in hashes.items())
                      for task, hashes in sorted(changed.items()))


def split_changed(records: Records, changed: dict) -> list[ResultLine]:
    """Each version of a changed task as a task of its own (`task@hash`)."""
    def version(r: ResultLine) -> ResultLine:
        tag = f"@{r.item.task_hash[:8]}"
        # the node id too: an item counts once per node id (a run and its rerun)
        return replace(r, item=replace(r.item, task=r.item.task + tag,
                                       nodeid=str(r.item.nodeid) + tag))

    return [version(r) if r.item.task in changed and r.item.task_hash else r
            for r in as_lines(records)]


def runs_judging_the_same_items(records: Records) -> list[str]:
    """A line per pair of runs that would make one entry (one model, configuration and label)
    and judged an item both: pooled, the later record of each item would silently replace
    the other's. Runs of disjoint items (a suite run in parts) pool; records naming no run
    (older logs) are not compared."""
    items: dict[tuple, dict[str, set[str]]] = {}
    for r in as_lines(records):
        if r.item.run:
            key = (str(r.item.model or "?"), *entry_key(r))
            item = f"{r.item.nodeid} {r.item.candidate or ''}".strip()
            items.setdefault(key, {}).setdefault(str(r.item.run), set()).add(item)
    lines = []
    for key, by_run in items.items():
        names = sorted(by_run)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                shared = by_run[a] & by_run[b]
                if shared:
                    label = f" [{key[4]}]" if key[4] else ""
                    lines.append(f"  model {key[0]}{label}: runs {a} and {b} both judged "
                                 f"{len(shared)} item{'s' * (len(shared) > 1)} (e.g. "
                                 f"{min(shared)})")
    return lines


def split(records: Records) -> list[tuple[str, dict, list[ResultLine]]]:
    """(label, fingerprint, records) per fingerprint group."""
    return [(fingerprint_label(fp), fp, recs) for fp, recs in fingerprints(records)]



def entry_key(r: ResultLine) -> tuple:
    """What makes a record's entry besides its model: refinement rounds, budget, agent mode,
    the run's label and whether the prompts had the tasks' hints."""
    return (r.item.refine_rounds, r.item.budget_usd, r.item.agent, r.run_label,
            bool(r.item.hints))


def fingerprint_line(fp: dict) -> str:
    return "Hardware and software: " + ", ".join(f"{k} {v}" for k, v in sorted(fp.items()))
