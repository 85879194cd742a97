"""`commbench`: aggregate results logs into leaderboards, and list tasks.

    commbench report .commbench/runs/<run>/results.jsonl [more logs ...]
    commbench report .commbench/runs            (per model: its fullest, newest run)
    commbench report RUN_K1 RUN_K2 ...          (the shards of one run, merged)
    commbench runs [.commbench/runs]            (every run: model, date, items, passes, seed)
    commbench label RUN NAME                    (a run's label, kept in its run.json)
    commbench report RUN... --out DIR           (leaderboard: report.md, CSV, JSON, figures)
    commbench markdown RUN --section NAME --title TITLE --command CMD [--out BENCHMARKS.md]
    commbench compile [suites] [--references DIR] [--platform h200]
    commbench tasks [suites]
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from tabulate import tabulate

from . import evaluate_cli, runs, shards
from .record import Identity, ResultLine
from .report import render
from .results import load, merge
from .tasks import load_suite


def _logs(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    direct = path / "results.jsonl"
    if direct.is_file():
        return [direct]
    runs = sorted(path.glob("*/results.jsonl"), key=lambda p: p.stat().st_mtime)
    return runs[-1:] if runs else []


def _report_logs(path: Path, args: argparse.Namespace) -> list[Path]:
    """The logs a report reads for a path; a runs folder's runs as `runs.pick` takes them
    (those of --model and --run-label only), each run left out said in one line."""
    if path.is_file() or runs.is_run(path):
        return _logs(path)
    found = [r for r in runs.runs_in(path) if _run_wanted(r, args)]
    chosen, notes = runs.pick(found)
    for note in notes:
        print(f"commbench report: {note}", file=sys.stderr)
    return [r.log for r in chosen]


def _run_wanted(run: runs.Run, args: argparse.Namespace) -> bool:
    return (not args.model or bool(set(run.models) & set(args.model))) and \
        (not args.run_label or run.label in args.run_label)


def _wanted(record: ResultLine, args: argparse.Namespace) -> bool:
    """Whether a record is of the models and run labels the report was asked for."""
    return (not args.model or str(record.item.model) in args.model) and \
        (not args.run_label or record.run_label in args.run_label)


def _wanted_text(args: argparse.Namespace) -> str:
    parts = ([f"model {' or '.join(args.model)}"] if args.model else []) + \
        ([f"label {' or '.join(args.run_label)}"] if args.run_label else [])
    return " with ".join(parts)


def cmd_runs(args: argparse.Namespace) -> int:
    """`commbench runs [RUNS_DIR]`: one row per run, newest first, and which of them
    `commbench report RUNS_DIR` takes."""
    root = Path(args.runs_dir)
    if not root.is_dir():
        print(f"commbench runs: no folder {root}", file=sys.stderr)
        return 2
    found = runs.runs_in(root)
    if not found:
        print(f"commbench runs: no run in {root} (a run is a folder with a results.jsonl)")
        return 0
    taken = {id(r) for r in runs.pick(found)[0]}
    sharded = any(r.shard for r in found)  # a column of the shards, where there are any
    rows = [[r.folder.name, ", ".join(r.models) or "-", r.label or "-", r.started or "-",
             r.platform, r.ran, len(r.records) - r.ran, r.passes,
             "-" if r.seed is None else r.seed, "yes" if id(r) in taken else "-"]
            + ([f"{r.shard} of {r.run_name or '?'}" if r.shard else "-"] if sharded else [])
            for r in found]
    print(tabulate(rows, headers=["run", "model", "label", "started", "platform", "items ran",
                                  "skipped", "passes", "seed", "in report"]
                   + (["shard"] if sharded else []),
                   disable_numparse=True))
    print(f"\n`commbench report {root}` takes the runs marked 'in report': per model and "
          "configuration, the run in which the most items ran (the newest of those; the "
          "shards of one run name count as one run); give a run's folder to report another")
    return 0


def cmd_label(args: argparse.Namespace) -> int:
    """`commbench label RUN NAME`: a name for a run, kept in its run.json; reports name its
    entries by it (two runs of one model stay apart) and `--run-label` picks runs by it."""
    folder = Path(args.run)
    if not runs.is_run(folder):
        print(f"commbench label: {folder} is no run folder (no results.jsonl in it)",
              file=sys.stderr)
        return 2
    runs.set_label(folder, args.name)
    print(f"commbench label: run {folder.name} " + (f"labelled {args.name!r}" if args.name
                                                     else "unlabelled"))
    return 0


def _sep(sep: str, title: str) -> None:
    print(f" {title} ".center(100, sep))


def cmd_report(args: argparse.Namespace) -> int:
    from . import leaderboard
    from .models.registry import RegistryError

    records: list[ResultLine] = []
    reply_roots: dict[str, Path] = {}
    labels = args.label or []
    if labels and not args.compare and len(labels) != len(args.paths):
        print("commbench report: give one --label per run (in the order of the runs), or none",
              file=sys.stderr)
        return 2
    parts: list[shards.Part] = []  # the runs that are shards (--commbench-shard)
    by_folder: dict[Path, list[ResultLine]] = {}
    for index, raw in enumerate(args.paths):
        logs = _report_logs(Path(raw), args)
        if not logs:
            print(f"commbench: no results log at {raw}"
                  + (f" of {_wanted_text(args)}" if args.model or args.run_label else ""),
                  file=sys.stderr)
            return 2
        for log in logs:
            loaded = load(log)
            # a run labelled with `commbench label`: its entries are named by it
            info = runs.read_info(log.parent) if log.name == runs.LOG else {}
            kept = info.get("label")
            found = shards.part(log.parent, info, loaded, runs.Run(log.parent, loaded, info).models)
            if found is not None:
                parts.append(found)
                by_folder[log.parent] = loaded
            # a log in a runs folder (<runs>/<run>/results.jsonl): its replies beside it
            for r in loaded:
                reply_roots.setdefault(str(r.item.run), log.parent.parent / "replies")
                if labels and not args.compare:  # the run's entries are named by its label
                    r = replace(r, run_label=labels[index])
                elif kept:
                    r = replace(r, run_label=kept)
                if _wanted(r, args):
                    records.append(r)
    if args.compare:
        return _compare(args)
    merged = shards.merge(parts)  # the shards of a run: one run, never overlapping
    if merged.error:
        print(f"commbench report: {merged.error}", file=sys.stderr)
        return 2
    for note in merged.notes:
        print(f"commbench report: {note}", file=sys.stderr)
    # a run of shards, some of them missing: its lines say so (the summary's headline)
    partial = {str(r.item.run): text for folder, text in merged.partial.items()
               for r in by_folder.get(folder, [])}
    records = [r.evolve(partial_note=partial[str(r.item.run)])
               if str(r.item.run) in partial else r for r in records]
    if (args.model or args.run_label) and not records:
        print(f"commbench report: no run of {_wanted_text(args)} in {' '.join(args.paths)}",
              file=sys.stderr)
        return 1
    if args.fail_on:
        print("commbench report: --fail-on goes with --compare A B", file=sys.stderr)
        return 2
    if not records:
        print(f"commbench report: no item's record in {' '.join(args.paths)} (an empty log, "
              "or every line skipped as said above): nothing to report", file=sys.stderr)
        return 1
    changed = leaderboard.changed_tasks(records)
    if changed and not args.split_changed:
        print("commbench report: these runs judged different versions of the same tasks (the "
              "task, its reference or its oracle changed), and their results are not pooled:\n"
              + leaderboard.describe_changed(changed)
              + "\nreport them separately, or give --split-changed to show each version as a "
              "task of its own", file=sys.stderr)
        return 2
    if changed:
        records = leaderboard.split_changed(records, changed)
    twice = leaderboard.runs_judging_the_same_items(records)
    if twice:
        print("commbench report: one model's entry would pool runs that judged the same "
              "items, and one would silently replace the other:\n" + "\n".join(twice)
              + "\nreport one of them, or label them apart (--label per run, or "
              "`commbench label RUN NAME`)", file=sys.stderr)
        return 2
    groups = leaderboard.split(records)
    if len(groups) > 1 and not args.by_fingerprint:
        try:
            leaderboard.check_one_fingerprint(records)
        except leaderboard.FingerprintMismatch as exc:
            print(f"commbench report: {exc}", file=sys.stderr)
            return 2
    if len(groups) > 1 and args.readme:
        print("commbench report: --readme takes runs of one fingerprint", file=sys.stderr)
        return 2
    command = " ".join(["commbench report", *args.paths]
                       + ([f"--models-file {args.models_file}"] if args.models_file else [])
                       + (["--by-fingerprint"] if args.by_fingerprint else [])
                       + (["--split-changed"] if args.split_changed else [])
                       + ([f"--out {args.out}"] if args.out else [])
                       + ([f"--html {args.html}"] if args.html else [])
                       + ([f"--suites {args.suites}"] if args.suites else []))
    given = Path(args.replies) if args.replies else None
    suite = None
    if args.suites:  # Table 1 from the suite, not from what the logs hold
        tasks, errors = load_suite(Path(args.suites))
        for error in errors:
            print(f"commbench report: {error}", file=sys.stderr)
        suite = [(Identity.partial(task=t.relpath, category=t.category, library=t.library,
                                   difficulty=t.difficulty, setup=t.setup), tuple(t.platforms))
                 for t in tasks]

    def replies_of(r: ResultLine) -> Path | None:  # where a record's kept replies are
        return given or reply_roots.get(str(r.item.run))

    for label, fp, group in groups:
        if len(groups) > 1:
            _sep("#", f"fingerprint group {label}")
            print(leaderboard.fingerprint_line(fp))
            print()
        try:
            # an item of one model in several logs (a run and its rerun) counts once
            board = leaderboard.build(group, Path(args.models_file) if args.models_file
                                      else None, suite=suite)
        except RegistryError as exc:
            print(f"commbench report: {exc}", file=sys.stderr)
            return 2
        leaderboard.render(board, print, _sep)
        if args.out:
            out = Path(args.out) / label if len(groups) > 1 else Path(args.out)
            written = leaderboard.write(board, out, command)
            print(f"commbench: wrote {len(written)} files to {out}: "
                  + ", ".join(p.name for p in written))
            if not any(p.suffix == ".png" for p in written):
                print("commbench: no figures drawn (matplotlib is missing: install the "
                      "'plots' extra); report.md has them as text")
        if args.html:
            from . import htmlreport

            site = Path(args.html) / label if len(groups) > 1 else Path(args.html)
            pages = htmlreport.write(board, site, replies_of, command)
            print(f"commbench: wrote {len(pages)} pages to {site} (open {site / 'index.html'})")
        if args.readme:
            write_section(Path(args.readme), leaderboard.README_SECTION,
                          leaderboard.leaderboard_markdown(board))
            print(f"commbench: wrote the leaderboard into {args.readme}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    """`commbench report A B --compare`: what changed from run A to run B."""
    from .report import comparison_markdown
    from .scoring import compare

    if len(args.paths) != 2:
        print("commbench report: --compare takes two runs (A B)", file=sys.stderr)
        return 2
    labels = args.label or []
    if len(labels) not in (0, 2):
        print("commbench report: give --label twice (one for each run) or not at all",
              file=sys.stderr)
        return 2
    try:
        threshold = fail_on(args.fail_on)
    except ValueError as exc:
        print(f"commbench report: --fail-on {args.fail_on}: {exc}", file=sys.stderr)
        return 2
    runs = []
    for raw in args.paths:
        runs.append([r for log in _logs(Path(raw)) for r in load(log)])
    a, b = labels or [str(p) for p in args.paths]
    cmp = compare(*runs)
    text = comparison_markdown(cmp, a, b)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "compare.md").write_text(text + "\n")
        print(f"commbench: wrote {Path(args.out) / 'compare.md'}")
    return _compare_status(cmp, threshold, a, b)


def fail_on(text: str | None) -> float | None:
    """`slower:P%` as the fraction P/100 (None: no speed threshold given)."""
    if text is None:
        return None
    kind, _, amount = text.partition(":")
    if kind != "slower" or not amount.endswith("%"):
        raise ValueError("expected slower:P% (e.g. slower:5%)")
    try:
        value = float(amount[:-1])
    except ValueError:
        raise ValueError(f"{amount!r} is no percentage") from None
    if not 0 <= value < 100:
        raise ValueError("the percentage must be at least 0 and below 100")
    return value / 100


def _compare_status(cmp, threshold: float | None, a: str, b: str) -> int:
    """1 where a pass of A is anything else in B, or (given a threshold) a speedup fell by
    more than it and beyond both intervals; each cause named on stderr. 0 otherwise."""
    from .scoring import slower, worse

    failed = False
    for item, x, y in worse(cmp):
        print(f"commbench report --compare: worse: {item}: {x} in {a}, {y} in {b}",
              file=sys.stderr)
        failed = True
    for item, sx, ix, sy, iy, _ in (slower(cmp, threshold) if threshold is not None else []):
        print(f"commbench report --compare: slower by {100 * (1 - sy / sx):.1f}% (more than "
              f"{100 * threshold:g}%, beyond the 90% intervals): {item}: {sx:.3f} "
              f"[{ix[0]:.3f}, {ix[1]:.3f}] in {a}, {sy:.3f} [{iy[0]:.3f}, {iy[1]:.3f}] in {b}",
              file=sys.stderr)
        failed = True
    return 1 if failed else 0


def comparisons(records: list[ResultLine], pairs: list[str]) -> list[str]:
    """Lines of a table: for each `TASK:BASELINE` pair, per size both tasks have, the two
    medians and how TASK's performance compares with the baseline's (t_baseline / t_task: the
    bytes are the same, so for a bandwidth this is the ratio of bandwidths)."""
    by_task = {r.item.task: r for r in records if r.result.sizes}
    rows = []
    for pair in pairs:
        task, _, base = pair.partition(":")
        if task not in by_task or base not in by_task:
            rows.append([task, base, "-", "-", "-", "-", "not both in this run"])
            continue
        base_sizes = {(s.count, s.dtype): s for s in by_task[base].result.sizes}
        for s in by_task[task].result.sizes:
            b = base_sizes.get((s.count, s.dtype))
            if b is None:
                continue
            rows.append([task, base, s.count, f"{s.bytes:,}", f"{s.t_sol_us:.1f}",
                         f"{b.t_sol_us:.1f}", f"{100 * b.t_sol_us / s.t_sol_us:.1f}%"])
    if not rows:
        return []
    return ["Against the baselines (medians of the solution-role jobs of this run; "
            "performance = baseline time / task time):", "",
            tabulate(rows, headers=["task", "baseline", "count", "bytes", "task us",
                                    "baseline us", "task perf vs baseline"],
                     tablefmt="github"), ""]


def markdown_section(records: list[ResultLine], title: str, command: str,
                     compare: list[str] = ()) -> str:
    """A BENCHMARKS.md section: what, where, the command, and the numbers from the log."""
    fp = next((r.fingerprint for r in records if r.fingerprint), {}) or {}
    lines = [f"## {title}", ""]
    lines.append("Hardware and software: " + ", ".join(f"{k} {v}" for k, v in sorted(fp.items())))
    runs = {r.item.run: r.seed for r in records if r.item.run}
    lines += ["; ".join(f"Run {run}, seed {seed}" for run, seed in sorted(runs.items())) + ".",
              "", "Command:", "", "```", command, "```", ""]
    out: list[str] = []
    render(records, out.append, lambda sep, text: out.append(f"### {text}"),
           header="results")
    body = [x for x in out if not x.startswith("### ")]
    lines += ["```", *body, "```", ""]
    lines += comparisons(records, list(compare))
    sizes = []
    for r in sorted(records, key=lambda r: r.item.nodeid):
        for s in r.result.sizes:
            jobs = ""
            if s.jobs_ref_us:
                jobs = (" ".join(f"{x:.4g}" for x in s.jobs_ref_us) + " / "
                        + " ".join(f"{x:.4g}" for x in s.jobs_sol_us))
            sizes.append([r.item.task, r.item.world, s.count, s.dtype, s.batch,
                          f"{s.t_ref_us:.1f}", f"{s.t_sol_us:.1f}",
                          f"{100 * s.spread_ref:.0f}%", f"{100 * s.spread_sol:.0f}%",
                          "-" if s.value_sol is None else f"{s.value_sol:.3g} {s.unit}",
                          f"{s.speedup:.3f}", jobs])
    if sizes:
        lines += ["Per size (calls per timed batch, median times per call over all timed "
                  "repetitions, spread = IQR / median, then each job's median in the order the "
                  "jobs ran):", ""]
        lines.append(tabulate(sizes, headers=["task", "np", "count", "dtype", "batch", "ref us",
                                              "sol us",
                                              "ref spread", "sol spread", "metric (sol)",
                                              "speedup", "job medians us (ref / sol)"],
                              tablefmt="github"))
        lines.append("")
    return "\n".join(lines)


def write_section(path: Path, name: str, text: str) -> None:
    """Replace (or append) the section between <!-- commbench:NAME --> markers."""
    begin, end = f"<!-- commbench:{name} -->", f"<!-- /commbench:{name} -->"
    old = path.read_text() if path.exists() else "# Benchmarks\n\nEvery section below is " \
        "written by `commbench markdown` from the results log of the command it shows.\n"
    block = f"{begin}\n{text}\n{end}"
    if begin in old and end in old:
        new = old[: old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new)


def cmd_markdown(args: argparse.Namespace) -> int:
    logs = [log for run in args.run for log in _logs(Path(run))]
    if not logs:
        print(f"commbench: no results log at {' '.join(args.run)}", file=sys.stderr)
        return 2
    # an item found in several logs counts once: the later log's record wins
    records = merge(r for log in logs for r in load(log))
    write_section(Path(args.out), args.section,
                  markdown_section(records, args.title, args.command, args.compare))
    print(f"commbench: wrote section {args.section!r} of {args.out}")
    return 0


def cmd_include(args: argparse.Namespace) -> int:
    """A measuring tool's own output, verbatim, as a BENCHMARKS.md section (for probes whose
    figures are not results logs: the latency probe, the peer-copy sweep)."""
    try:
        text = Path(args.output).read_text()
    except OSError as exc:
        print(f"commbench: cannot read {args.output}: {exc}", file=sys.stderr)
        return 2
    if not text.strip():
        print(f"commbench: {args.output} is empty", file=sys.stderr)
        return 2
    body = "\n".join([f"## {args.title}", "", "Command:", "", "```", args.command, "```", "",
                      "Output:", "", "```", text.rstrip("\n"), "```", ""])
    write_section(Path(args.out), args.section, body)
    print(f"commbench: wrote section {args.section!r} of {args.out}")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    """Build every CUDA template, reference and mutant with the hidden recipe (what CI can do
    without a GPU): templates and references must build and pass `forbid`; mutants must build."""
    import dataclasses
    import tempfile

    from .platforms import PROFILES, platform_of

    # the door an item's build goes through: the platform's own build (its vendor's
    # toolchain), for the profile's architecture or the one asked for
    profile = PROFILES[args.platform]
    if args.arch:
        profile = dataclasses.replace(profile, arch=args.arch)
    platform = platform_of(profile)
    # --cache: the folder a run's --commbench-build-cache names, filled ahead of the run; else
    # a throw-away one, removed at the end (every build of a suite: some hundred MB)
    if args.cache:
        return _compile_all(args, platform, profile.arch, Path(args.cache))
    with tempfile.TemporaryDirectory(prefix="commbench-compile-") as cache:
        return _compile_all(args, platform, profile.arch, Path(cache))


def _compile_all(args: argparse.Namespace, platform, arch: str, cache: Path) -> int:
    """`commbench compile`'s builds, into `cache`."""
    from .mutants import MutantError, mutants
    from .verdicts import Rejected, Verdict

    root, refs = Path(args.suites), Path(args.references)
    work = []
    tasks, failures = load_suite(root)
    from .toolchains.nvidia import THUNDERKITTENS_ENV, thunderkittens_include, uses_thunderkittens

    # what the profile compiles: HIP for gfx942 on mi325x, HIP through the HIP->CUDA header on
    # h200-hip, CUDA on the NVIDIA profiles (their Python tasks need no build)
    compiled = [x for x in platform.languages if x != "python"]
    for task in tasks:
        if task.language not in compiled or (args.select and not any(
                part in task.relpath for part in args.select)):
            continue
        if uses_thunderkittens(task) and thunderkittens_include() is None:
            print(f"{task.relpath:45s} skipped: no ThunderKittens headers ({THUNDERKITTENS_ENV})")
            continue
        ref_dir = refs / task.relpath
        suffix = task.template.suffix
        sources = [("template", task.template.read_text),
                   ("reference", (ref_dir / f"solution{suffix}").read_text)]
        sources += [(f"mutant {name}", load) for name, load in mutants(ref_dir, suffix)]
        work += [(task, kind, read) for kind, read in sources]

    def one(n: int, task, kind: str, read) -> tuple[str, str | None]:
        try:  # side by side: each build works in a folder of its own
            platform.build(task, read(), cache)
            return "ok", None
        except (OSError, MutantError) as exc:
            return f"missing: {exc}", f"{task.relpath} {kind}: missing: {exc}"
        except Rejected as exc:
            status = f"{exc.verdict}: {exc.message}"
            if kind.startswith("mutant") and exc.verdict is Verdict.FORBIDDEN:
                return status, None
            return status, f"{task.relpath} {kind}: {status}\n{exc.detail}"

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        done = list(pool.map(lambda w: one(w[0], *w[1]), enumerate(work)))
    built = len(done)
    for (task, kind, _read), (status, failure) in zip(work, done):
        print(f"{task.relpath:45s} {kind:28s} {status}")
        if failure:
            failures.append(failure)
    print(f"commbench compile: {built} sources for {arch}, {len(failures)} failed")
    for f in failures:
        print(f"FAILED {f}", file=sys.stderr)
    return 1 if failures or not built else 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """What this machine has for the benchmark and which items that leaves runnable."""
    from .doctor import report

    try:
        return report(args.platform, Path(args.suites), args.ranks_per_gpu)
    except ValueError as exc:
        print(f"commbench doctor: {exc}", file=sys.stderr)
        return 2


def example_library(name: str) -> str:
    """The library a CommBench example is written against, from its directory name."""
    low = name.lower()
    for needle, library in (("nccl_device_api", "nccl-device"), ("msclpp", "mscclpp"),
                            ("mscclpp", "mscclpp"), ("rdma", "ibverbs"), ("ibv_", "ibverbs"),
                            ("torch_distributed", "torch"), ("nvshmem", "nvshmem"),
                            ("deepep", "deepep"), ("thunderkitten", "thunderkittens"),
                            ("vllm", "vllm"), ("sglang", "sglang")):
        if needle in low:
            return library
    return "cuda-runtime"


# a task's library that counts as the example's own (torch.distributed runs NCCL)
SAME_LIBRARY = {"torch": {"torch", "nccl"}, "cuda-runtime": {"cuda-runtime"}}


def upstream_coverage(tasks) -> list[tuple[str, str, str, list[str]]]:
    """(example, its library, covered | partly | none, the tasks naming it) for each of the
    paper's examples: covered where a task names it and uses the example's library, partly
    where the tasks that name it use another (the problem ported, not the library's API)."""
    from .tasks import commbench_examples

    rows = []
    for _num, name in sorted(commbench_examples().items()):
        library = example_library(name)
        naming = [t for t in tasks if t.upstream == name]
        own = SAME_LIBRARY.get(library, {library})
        status = ("none" if not naming else
                  "covered" if any(t.library in own for t in naming) else "partly")
        rows.append((name, library, status, [t.relpath for t in naming]))
    return rows


def cmd_tasks(args: argparse.Namespace) -> int:
    from collections import Counter

    tasks, errors = load_suite(Path(args.suites))
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if args.upstream:
        rows = upstream_coverage(tasks)
        print(tabulate([[n, lib, st, ", ".join(ts) or "-"] for n, lib, st, ts in rows],
                       headers=["example", "library", "coverage", "tasks"]))
        counts = Counter(st for _, _, st, _ in rows)
        print(f"\n{len(rows)} examples: covered {counts['covered']}, partly "
              f"{counts['partly']} (the problem in another library), none {counts['none']}")
        by_lib = Counter((lib, st) for _, lib, st, _ in rows)
        for lib in sorted({lib for _, lib, _, _ in rows}):
            print(f"  {lib}: " + ", ".join(f"{st} {by_lib[(lib, st)]}"
                                           for st in ("covered", "partly", "none")
                                           if by_lib[(lib, st)]))
        return 1 if errors else 0
    rows = []
    for t in tasks:
        rows.append([t.relpath, t.category, t.library, t.difficulty, t.setup,
                     "own" if t.own_setup else "harness", "yes" if t.hints else "-",
                     ",".join(t.platforms), ",".join(map(str, t.ranks)), t.check.op,
                     t.upstream or "-"])
    print(tabulate(rows, headers=["task", "category", "library", "difficulty", "setup",
                                  "set-up by", "hints", "platforms", "ranks", "op",
                                  "upstream"]))
    # the suite's breadth: per platform kind, tasks by category, library and difficulty
    for kind, chosen in (("CPU", [t for t in tasks if "cpu" in t.platforms]),
                         ("GPU", [t for t in tasks if set(t.platforms) - {"cpu"}])):
        if not chosen:
            continue
        print(f"\n{kind} tasks: {len(chosen)}; CommBench examples covered: "
              f"{len({t.upstream for t in chosen if t.upstream})}")
        print(f"  prompts: {len(chosen)}, of which {sum(1 for t in chosen if t.hints)} with "
              f"hints; the answer owns the set-up in {sum(1 for t in chosen if t.own_setup)}")
        for field in ("category", "library", "difficulty"):
            counts = Counter(getattr(t, field) for t in chosen)
            print(f"  by {field}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 1 if errors else 0


def cmd_prompt(args: argparse.Namespace) -> int:
    """The first prompt of a task as a model gets it (without the machine's measured facts,
    which only a run's platform knows: the platform's name stands for them)."""
    from .models.prompt import build

    tasks, errors = load_suite(Path(args.suites))
    found = [t for t in tasks if t.relpath == args.task.strip("/")]
    if not found:
        near = [t.relpath for t in tasks if args.task.strip("/").split("/")[-1] in t.relpath]
        print(f"commbench prompt: no task {args.task!r} in {args.suites}"
              + (f" (did you mean {', '.join(near[:5])}?)" if near else
                 " (`commbench tasks` lists them)"), file=sys.stderr)
        return 2
    task = found[0]
    if args.hints and task.hints is None:
        print(f"commbench prompt: {task.relpath} has no hints", file=sys.stderr)
    platform = args.platform or next((p for p in task.platforms if p != "cpu"),
                                     task.platforms[0])
    facts: dict = {}
    if args.fingerprint:
        try:
            facts = _fingerprint_of(Path(args.fingerprint))
        except (OSError, ValueError) as exc:
            print(f"commbench prompt: {args.fingerprint}: {exc}", file=sys.stderr)
            return 2
    print(build(task, {**facts, "platform": facts.get("platform", platform)}, hints=args.hints))
    return 0


def _fingerprint_of(path: Path) -> dict:
    """Machine facts from a JSON object's file or from a results log's first fingerprint."""
    import json

    from .results import entries

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        data = None
    if isinstance(data, dict):
        return data["fingerprint"] if isinstance(data.get("fingerprint"), dict) else data
    found = next((e.fingerprint for e in entries(path) if isinstance(e.fingerprint, dict)),
                 None)
    if found is None:
        raise ValueError("no fingerprint in it (a JSON object, or a results log with one)")
    return found


def cmd_models(args: argparse.Namespace) -> int:
    """The model registry (shipped, overlaid with --file): alias, provider, model id, key
    variable and whether it is set, endpoint, settings, prices."""
    import os

    from tabulate import tabulate

    from .models.registry import RegistryError, load

    try:
        specs = load(Path(args.file) if args.file else None)
    except RegistryError as exc:
        print(f"commbench models: {exc}", file=sys.stderr)
        return 2
    rows = []
    from .models.prices import per_million

    for s in specs.values():
        settings = ", ".join(f"{k}={v}" for k, v in (("reasoning", s.reasoning_effort),
                                                     ("thinking", s.thinking),
                                                     ("extra", s.extra_body or None)) if v)
        known = per_million(s)
        price = f"{known[0]:g}/{known[1]:g}" if known else "unknown"
        rows.append([s.alias, s.provider, s.model,
                     f"{s.key_env} ({'set' if os.environ.get(s.key_env) else 'not set'})",
                     s.base_url or "(SDK default)", settings or "-", price,
                     {True: "yes", False: "no", None: "?"}[s.open_weights]])
    print(tabulate(rows, headers=["alias", "provider", "model id", "key", "endpoint",
                                  "settings", "$/M tokens in/out", "open weights"]))
    print("\nalso: openai:MODEL and anthropic:MODEL for any compatible server "
          "(with --commbench-base-url)")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """A model's kept answers as the `dir:` layout: for every task, the last round's reply of
    sample 0 (or --sample) as DIR/<category>/<task>/reply.md, so another machine (the GPU
    one) judges exactly these answers with --commbench-model=dir:DIR. With --agent LABEL, the
    answer that agent run stands by (its last kept step, else its last step)."""
    import shutil

    root = Path(args.replies)
    if not root.is_dir():
        print(f"commbench export: no folder {root}", file=sys.stderr)
        return 2
    written = 0
    from .agent import standing_answer
    from .models.conversation import last_round_reply

    for sample in sorted(root.glob(f"*/*/s{args.sample}")):
        chosen = standing_answer(sample / args.agent) if args.agent else last_round_reply(sample)
        if chosen is None:
            continue
        name = f"{args.agent}/{chosen.parent.name}" if args.agent else chosen.parent.name
        task = sample.parent.relative_to(root)
        out = Path(args.dir) / task
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(chosen, out / "reply.md")
        written += 1
        print(f"{task}: {name}")
    print(f"commbench export: {written} tasks written to {args.dir}")
    return 0 if written else 1


def build_parser() -> argparse.ArgumentParser:
    """The `commbench` command line: every subcommand and its options (docs/options.md is
    made from it, and the docs' commands are checked against it)."""
    parser = argparse.ArgumentParser(prog="commbench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="scores and tables from results logs")
    rep.add_argument("paths", nargs="+", help="results.jsonl files, run folders or runs folders "
                                              "(a runs folder: per model and configuration, "
                                              "the run in which the most items ran, the "
                                              "newest of those; `commbench runs` lists them)")
    rep.add_argument("--out", metavar="DIR",
                     help="write report.md, leaderboard.csv, leaderboard.json and the figures "
                          "(PNGs, with the 'plots' extra) into DIR")
    rep.add_argument("--html", metavar="DIR",
                     help="write a static site into DIR (index.html: the leaderboard, the task x "
                          "model matrix, the failure anatomy; a page per task with every "
                          "model's evidence and reply, a page per model); no network needed")
    rep.add_argument("--replies", metavar="DIR",
                     help="the models' kept replies for --html (<runs>/replies; default: "
                          "beside each results log in a runs folder)")
    rep.add_argument("--suites", metavar="DIR",
                     help="Table 1 from this suite's tasks for the runs' platform (with how many "
                          "of them the logs cover), not from the tasks the logs hold")
    rep.add_argument("--compare", action="store_true",
                     help="two runs A B: the verdicts that changed, the speedups that moved "
                          "beyond their 90%% intervals, the items new in B and those removed; "
                          "exit status 1 where a pass of A is anything else in B")
    rep.add_argument("--fail-on", metavar="slower:P%",
                     help="with --compare: also exit 1 where a speedup of B fell by more than "
                          "P%% of A's and beyond both 90%% intervals (a pass that became "
                          "anything else always does)")
    rep.add_argument("--label", action="append", metavar="NAME",
                     help="a name for each run, in their order: a model's entries of two runs "
                          "stay apart as 'model [NAME]' (with --compare: A's, then B's)")
    rep.add_argument("--model", action="append", metavar="NAME",
                     help="only the records of this model (repeatable); in a runs folder, "
                          "only its runs")
    rep.add_argument("--run-label", action="append", metavar="LABEL",
                     help="only the runs labelled LABEL (`commbench label`; repeatable)")
    rep.add_argument("--split-changed", action="store_true",
                     help="runs that judged different versions of a task (its hash differs): "
                          "each version as a task of its own instead of refusing to pool them")
    rep.add_argument("--by-fingerprint", action="store_true",
                     help="runs of different hardware/software: one report per fingerprint "
                          "(DIR/<platform>-<hash>) instead of refusing them")
    rep.add_argument("--models-file", metavar="TOML",
                     help="a model registry file to overlay (open weights, prices)")
    rep.add_argument("--readme", metavar="FILE",
                     help="also write the leaderboard table into FILE between "
                          "<!-- commbench:leaderboard --> markers")
    rep.set_defaults(func=cmd_report)
    rns = sub.add_parser("runs", help="list the runs of a runs folder, newest first")
    rns.add_argument("runs_dir", nargs="?", default=".commbench/runs", metavar="RUNS_DIR",
                     help="a runs folder (default: .commbench/runs)")
    rns.set_defaults(func=cmd_runs)
    lbl = sub.add_parser("label", help="name a run (kept in its run.json): reports show and "
                                       "pick runs by it")
    lbl.add_argument("run", help="a run folder (<runs>/<run>)")
    lbl.add_argument("name", help="the label ('' removes it)")
    lbl.set_defaults(func=cmd_label)
    md = sub.add_parser("markdown", help="write a run's figures into a section of BENCHMARKS.md")
    md.add_argument("run", nargs="+",
                    help="results.jsonl, a run folder or a runs folder (newest run); several "
                         "make one section")
    md.add_argument("--out", default="BENCHMARKS.md")
    md.add_argument("--section", required=True, help="section name (replaced if present)")
    md.add_argument("--title", required=True)
    md.add_argument("--command", required=True, help="the command that produced the run")
    md.add_argument("--compare", action="append", default=[], metavar="TASK:BASELINE",
                    help="add a table of TASK against BASELINE per common size (repeatable)")
    md.set_defaults(func=cmd_markdown)
    inc = sub.add_parser("include", help="a measuring tool's output, verbatim, as a section")
    inc.add_argument("output", help="the file the tool's output was saved to")
    inc.add_argument("--out", default="BENCHMARKS.md")
    inc.add_argument("--section", required=True, help="section name (replaced if present)")
    inc.add_argument("--title", required=True)
    inc.add_argument("--command", required=True, help="the command whose output it is")
    inc.set_defaults(func=cmd_include)
    cmp_ = sub.add_parser("compile", help="build every CUDA (or HIP) template, reference and "
                                          "mutant")
    cmp_.add_argument("suites", nargs="?", default="suites")
    cmp_.add_argument("--references", default="references")
    cmp_.add_argument("--platform", default="h200", help="profile whose architecture to build for")
    cmp_.add_argument("--arch", help="another architecture of the profile's vendor (gfx90a, "
                                     "sm_100a, ...) to build for instead of the profile's")
    cmp_.add_argument("--cache", help="keep the builds in this folder (a run's "
                                       "--commbench-build-cache) instead of a throw-away one")
    cmp_.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                      help="builds side by side (default: the CPUs)")
    cmp_.add_argument("-k", dest="select", action="append", default=[], metavar="PART",
                      help="only the tasks whose path (category/name) contains PART "
                           "(repeatable)")
    cmp_.set_defaults(func=cmd_compile)
    mdl = sub.add_parser("models", help="list the models that can be asked by name")
    mdl.add_argument("--file", help="a user registry file to overlay (as the ini key "
                                    "commbench_models_file)")
    mdl.set_defaults(func=cmd_models)
    exp = sub.add_parser("export", help="a model's kept answers as a dir: folder")
    exp.add_argument("replies", help="<runs>/replies/<model>")
    exp.add_argument("dir")
    exp.add_argument("--sample", type=int, default=0)
    exp.add_argument("--agent", metavar="LABEL",
                     help="export an agent run's answers (the folder <task>/s<k>/LABEL: its "
                          "last kept step, else its last step) instead of the direct rounds'")
    exp.set_defaults(func=cmd_export)
    doc = sub.add_parser("doctor", help="what this machine has for the benchmark, what it "
                                        "lacks, and which items that leaves runnable")
    doc.add_argument("suites", nargs="?", default="suites")
    doc.add_argument("--platform", default=None,
                     help="the platform to judge (default: what --platform=auto picks)")
    doc.add_argument("--ranks-per-gpu", type=int, default=1,
                     help="shared placement, as --commbench-ranks-per-gpu")
    doc.set_defaults(func=cmd_doctor)
    tsk = sub.add_parser("tasks", help="list the tasks of a suites folder")
    tsk.add_argument("suites", nargs="?", default="suites")
    tsk.add_argument("--upstream", action="store_true",
                     help="the CommBench paper's examples instead: which the suite covers "
                          "with the example's own library, which only partly (ported to "
                          "another library), which not at all")
    tsk.set_defaults(func=cmd_tasks)
    prm = sub.add_parser("prompt", help="print the prompt a model is sent for a task (its "
                                        "contract; with --hints, the hints too)")
    prm.add_argument("task", help="a task's path below the suites folder, e.g. "
                                  "p2p/memory_channel_put")
    prm.add_argument("--suites", default="suites")
    prm.add_argument("--hints", action="store_true", help="add the task's hints")
    prm.add_argument("--platform", default=None,
                     help="the platform named in the prompt's machine facts")
    prm.add_argument("--fingerprint", default=None,
                     help="the machine facts to state: a JSON object's file, or a results log "
                          "(its first record's fingerprint)")
    prm.set_defaults(func=cmd_prompt)
    evaluate_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `commbench report ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
