"""`commbench`: aggregate results logs into leaderboards, and list tasks.

    commbench report .commbench/runs/<run>/results.jsonl [more logs ...]
    commbench report .commbench/runs            (the newest run in that folder)
    commbench tasks [suites]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tabulate import tabulate

from .report import render
from .results import load
from .scoring import score
from .tasks import MANIFEST, ManifestError, load_task


def _logs(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    direct = path / "results.jsonl"
    if direct.is_file():
        return [direct]
    runs = sorted(path.glob("*/results.jsonl"), key=lambda p: p.stat().st_mtime)
    return runs[-1:] if runs else []


def cmd_report(args: argparse.Namespace) -> int:
    per_model: dict[str, list[dict]] = {}
    for raw in args.paths:
        logs = _logs(Path(raw))
        if not logs:
            print(f"commbench: no results log at {raw}", file=sys.stderr)
            return 2
        for log in logs:
            for record in load(log):
                per_model.setdefault(record.get("model", "?"), []).append(record)
    for model, records in sorted(per_model.items()):
        render(records, print, lambda sep, title: print(f" {title} ".center(100, sep)),
               header=f"commbench: model {model}")
        print()
    if len(per_model) > 1:
        rows = []
        for model, records in per_model.items():
            s = score(records)
            rows.append([model, s.applicable, s.pass_rate, s.pass_good, s.gm_speedup, s.pass_x_gm,
                         s.price])
        rows.sort(key=lambda r: -(r[5] or 0))
        print(tabulate(rows, headers=["model", "tasks", "Pass Rate", "PASS+Good", "GM-Speedup",
                                      "Pass x GM", "Price"], floatfmt=".3f"))
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    root = Path(args.suites)
    rows, bad = [], 0
    for manifest in sorted(root.rglob(MANIFEST)):
        try:
            t = load_task(manifest, root)
        except ManifestError as exc:
            print(f"error: {exc}", file=sys.stderr)
            bad += 1
            continue
        rows.append([t.relpath, t.category, t.library, t.difficulty, t.setup,
                     ",".join(t.platforms), ",".join(map(str, t.ranks)), t.check.op])
    print(tabulate(rows, headers=["task", "category", "library", "difficulty", "setup",
                                  "platforms", "ranks", "op"]))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="commbench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="scores and tables from results logs")
    rep.add_argument("paths", nargs="+", help="results.jsonl files, run folders or runs folders")
    rep.set_defaults(func=cmd_report)
    tsk = sub.add_parser("tasks", help="list the tasks of a suites folder")
    tsk.add_argument("suites", nargs="?", default="suites")
    tsk.set_defaults(func=cmd_tasks)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
