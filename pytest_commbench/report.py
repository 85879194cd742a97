"""Render results as text tables. Needs only write_line/write_sep, so the terminal summary and
the `commbench report` command share it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from tabulate import tabulate

from .record import ResultLine, Size, as_lines
from .scoring import (
    MUTANT_UNJUDGED,
    Comparison,
    Intervals,
    Records,
    Scores,
    best_of_samples,
    bootstrap,
    breakdown,
    pass_at_ks,
    passes_by_round,
    record_band,
    score,
)
from .shards import headline_note
from .verdicts import Verdict

WriteLine = Callable[[str], None]
WriteSep = Callable[[str, str], None]

#: one colour per model, in board order: a model keeps its colour in every figure and page
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")


def model_colours(labels: list[str]) -> dict[str, str]:
    return {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(labels)}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def money(x: float | None) -> str:
    """Dollars, or "unknown" where no answer's cost is known (not $0: no price was had)."""
    return "unknown" if x is None else f"${x:.4f}"


def fast_line(s: Scores) -> str:
    """KernelBench's fast_p at each threshold, as one line (empty where nothing was timed)."""
    if not s.fast or all(v is None for _, v in s.fast):
        return ""
    return (f"fast_p (pass with speedup > p, of {s.applicable} tasks): "
            + "   ".join(f"fast_{p:g} {_pct(v)}" for p, v in s.fast))


def _interval(iv: list[float] | None) -> str:
    return "" if not iv else f" [{iv[0]:.3f}, {iv[1]:.3f}]"


def _pct_interval(iv: list[float] | None) -> str:
    return "-" if not iv else f"[{100 * iv[0]:.1f}%, {100 * iv[1]:.1f}%]"


def intervals_line(iv: Intervals) -> str:
    """The scores' intervals over tasks, as one line (empty with fewer than two tasks)."""
    if iv.tasks < 2:
        return ""
    return (f"{iv.level:.0%} intervals over tasks ({iv.resamples} bootstrap draws of "
            f"{iv.tasks} tasks): Pass Rate {_pct_interval(iv.pass_rate)}   "
            f"PASS+Good {_pct_interval(iv.pass_good)}   "
            f"GM-Speedup {_interval(iv.gm_speedup).strip() or '-'}   "
            f"Pass x GM {_interval(iv.pass_x_gm).strip() or '-'}")


def _world(r: ResultLine, missing: object = "") -> object:
    return missing if r.item.world is None else r.item.world


def _task_rows(records: list[ResultLine]) -> list[list[str]]:
    rows = []
    for r in sorted(records, key=lambda r: r.item.nodeid):
        a = r.result
        per_size = " ".join(f"{s.count}:{s.speedup:.2f}" for s in a.sizes)
        se = a.speedup_se
        speed = "compile only" if a.compile_only and r.passed else \
            "check only" if a.check_only and r.passed else _num(a.speedup)
        rows.append([
            r.item.task, _world(r), r.verdict, speed,
            "-" if se is None else f"{100 * se:.1f}%", a.timing_rounds or "-",
            a.timing_trust or "-", record_band(r), per_size or "-",
        ])
    return rows


def unreadable(records: Records) -> list[str]:
    """Passing items whose speedup is not to be read, each with why."""
    out = []
    for r in sorted(as_lines(records), key=lambda r: r.item.nodeid):
        a = r.result
        trust = a.timing_trust
        if not r.passed or trust in (None, "ok"):
            continue
        load = a.host_load
        stopped = (f"; timing stopped after {a.timing_rounds} rounds"
                   if a.timing_stopped == "contended" else "")
        why = (f"contended: {load and load.ranks} busy ranks and {load and load.outside_cpus} "
               f"CPUs of other load on {load and load.cpus} CPUs{stopped}"
               if trust == "contended" else
               "shared: its ranks shared a GPU" if trust == "shared" else
               f"noisy: +/- {100 * (a.speedup_se or 0):.1f}% after "
               f"{a.timing_rounds} timing rounds")
        out.append(f"{r.item.task} np{_world(r, '?')}{_cand(r)} ({why})")
    return out


def _cand(r: ResultLine) -> str:
    return f" {r.item.candidate}" if r.item.candidate else ""


def _score_rows(groups, readable: bool | None = True) -> list[list[str]]:
    """A breakdown's rows; the speedup scores left out ("-") where the headline leaves them
    out (every passing item timed on a contended host)."""
    def speed(text: str) -> str:
        return text if readable is not False else "-"
    return [[name, s.applicable, s.passes, _pct(s.pass_rate), speed(_pct(s.pass_good)),
             speed(_num(s.gm_speedup)), speed(_num(s.pass_x_gm))] for name, s in groups]


def agent_lines(records: Records) -> list[str]:
    """Agent mode's lines of the summary: the loop's calls, restarts and kept optimizations,
    the first generation against the agent's result, and the best of K runs per task."""
    runs = [r for r in as_lines(records) if r.item.agent and r.result.round_history is not None]
    if not runs:
        return []
    calls: dict[str, int] = {}
    summaries = [r.result.agent for r in runs]
    for agent in summaries:
        for role, n in ((agent and agent.calls) or {}).items():
            calls[role] = calls.get(role, 0) + int(n)
    labels = sorted({str(r.item.agent) for r in runs})
    cost = sum(r.result.usage.dollars for r in runs) \
        if any(r.result.usage.known for r in runs) else None
    restarts = sum(int((a and a.restarts) or 0) for a in summaries)
    kept = sum(int((a and a.kept) or 0) for a in summaries)
    out = [f"agent {', '.join(labels)}: {len(runs)} runs, model calls "
              + ", ".join(f"{role} {n}" for role, n in calls.items())
              + f"; restarts {restarts}; optimizations kept {kept}; "
              f"cost {money(cost)} over all steps"]
    for r in sorted(runs, key=lambda r: r.item.nodeid):
        steps = []
        for h in r.result.round_history or ():
            speed = "" if h.speedup is None else f" {h.speedup:.2f}"
            mark = (" kept" if h.kept and h.role == "optimize" else
                    " discarded" if h.kept is False else
                    " (trap: restart)" if h.restart else "")
            steps.append(f"i{h.round} {h.role or '?'} {h.verdict}{speed}{mark}")
        agent = r.result.agent
        out.append(f"  {r.item.task} np{_world(r, '?')}{_cand(r)}: " + "; ".join(steps)
                      + f" (stop: {(agent and agent.stop) or '-'})")
    first = [_as_first(r) for r in runs]
    a, f = score(runs), score(first)
    out.append(f"first generation (iteration 1) -> agent: Pass Rate {_pct(f.pass_rate)} -> "
                  f"{_pct(a.pass_rate)}, GM-Speedup {_num(f.gm_speedup)} -> "
                  f"{_num(a.gm_speedup)}, Pass x GM {_num(f.pass_x_gm)} -> {_num(a.pass_x_gm)}")
    samples = [r.item.sample for r in runs if r.item.sample is not None]
    if samples:
        best = score(best_of_samples(runs))
        out.append(f"best of {max(samples) + 1} agent runs per task: {best.passes}/"
                      f"{best.applicable} tasks pass ({_pct(best.pass_rate)}), GM-Speedup "
                      f"{_num(best.gm_speedup)}, Pass x GM {_num(best.pass_x_gm)}")
    return out


def _as_first(r: ResultLine) -> ResultLine:
    """An agent's record as its first iteration ended (its verdict and speedup)."""
    first = r.result.agent.first if r.result.agent is not None else None
    verdict = (first.verdict if first is not None else None) or r.result.verdict
    speedup = first.speedup if first is not None else None
    return replace(r, attempt=replace(r.result, verdict=verdict, speedup=speedup))


def bandwidths(size: Size | Mapping[str, Any], role: str = "sol"
               ) -> tuple[float | None, float | None]:
    """(algbw, busbw) in GB/s of one size's `role` ("sol" or "ref"), as nccl-tests prints
    them: algbw the bytes over the time; busbw the task's metric where its manifest names
    busbw (algbw times the collective's factor), else None. Both None for a task whose
    metric is a time."""
    size = Size.of(size)
    seconds = (size.time_us(role) or 0) * 1e-6
    if size.unit != "GB/s" or seconds <= 0 or not size.bytes:
        return None, None
    algbw = size.bytes / seconds / 1e9
    return algbw, size.value(role) if size.metric == "busbw" else None


def size_rows(records: Records) -> list[list[str]]:
    """Per size of every passing, timed item with a bandwidth metric, the nccl-tests columns
    (size, count, type, time, algbw, busbw) of the solution and the reference's time and
    busbw (algbw where the task names no busbw) beside them, and the speedup."""
    rows = []
    for r in sorted(as_lines(records), key=lambda r: r.item.nodeid):
        if not r.passed or r.result.check_only:
            continue
        for sz in r.result.sizes:
            algbw, busbw = bandwidths(sz)
            if algbw is None:
                continue
            ref_alg, ref_bus = bandwidths(sz, "ref")
            rows.append([r.item.task, _world(r), sz.bytes, sz.count,
                         sz.dtype, _num(sz.t_sol_us, 2), _num(algbw, 2),
                         _num(busbw, 2), _num(sz.t_ref_us, 2),
                         _num(ref_bus if busbw is not None else ref_alg, 2),
                         _num(sz.speedup)])
    return rows


SIZE_HEADERS = ["task", "np", "size (B)", "count", "type", "time (us)", "algbw (GB/s)",
                "busbw (GB/s)", "ref time (us)", "ref bw (GB/s)", "speedup"]


def _ci(iv: list[float] | None) -> str:
    return "" if not iv else f" (90% CI {iv[0]:.3f}-{iv[1]:.3f})"


def speed_readable(solutions: Records) -> bool | None:
    """Whether the run's speedup scores say anything: None where no passing item was timed,
    False where every timed pass was timed on a contended host."""
    timed = [r for r in as_lines(solutions) if r.passed and r.result.speedup is not None
             and not r.result.check_only]
    if not timed:
        return None
    return not all(r.result.timing_trust == "contended" for r in timed)


def headline(solutions: Records, s) -> list[str]:
    """The scores' line, leading with what the run measured: correctness alone where nothing
    was timed (check-only), the speedup scores left out with the reason where every passing
    item was timed on a contended host (PASS+Good and GM-Speedup would be numbers the
    machine could not measure), every interval labelled."""
    passed = f"Pass Rate {_pct(s.pass_rate)} ({s.passes}/{s.applicable})"
    price = f"Price {money(s.price)}/task"
    rest = f"   ({s.not_applicable} not applicable)" if s.not_applicable else ""
    readable = speed_readable(solutions)
    if readable is None:
        return [f"{passed}   {price}   (correctness only: nothing was timed){rest}"]
    if not readable:
        return [f"{passed}   {price}{rest}",
                "PASS+Good and GM-Speedup left out: every passing item was timed on a "
                "contended host (see above), which no number of rounds makes readable; "
                "--commbench-check-only judges correctness alone"]
    return [f"{passed}   PASS+Good {_pct(s.pass_good)} ({s.good}/{s.applicable})   "
            f"GM-Speedup {_num(s.gm_speedup)}{_ci(s.gm_ci90)}   "
            f"Pass x GM {_num(s.pass_x_gm)}{_ci(s.pass_x_gm_ci90)}   {price}{rest}"]


def render(records: Records, write_line: WriteLine, write_sep: WriteSep,
           header: str = "commbench") -> None:
    records = as_lines(records)
    solutions = [r for r in records if r.is_solution]
    mutants = [r for r in records if r.item.kind == "mutant"]
    write_sep("=", header)
    skipped = [r for r in records if r.verdict == Verdict.SKIPPED]
    solutions = [r for r in solutions if r.verdict != Verdict.SKIPPED]
    mutants = [r for r in mutants if r.verdict != Verdict.SKIPPED]
    if skipped:
        reasons: dict[str, int] = {}
        for r in skipped:
            reasons[r.result.message] = reasons.get(r.result.message, 0) + 1
        write_line(f"{len(skipped)} items skipped: "
                   + "; ".join(f"{n} x {why}" for why, n in sorted(reasons.items())))
    if solutions:
        table = tabulate(_task_rows(solutions),
                         headers=["task", "np", "verdict", "speedup", "+/-", "rounds", "trust",
                                  "band", "per size (count:speedup)"])
        for line in table.splitlines():
            write_line(line)
        shared = [r for r in solutions if r.result.timing_trust == "shared"
                  or r.placement.startswith("shared")]
        if shared:
            write_line("ranks shared GPUs (--commbench-ranks-per-gpu): verdicts hold, but the "
                       "timings are of ranks sharing one device, not NVLink figures")
        built = [r for r in solutions if r.result.compile_only]
        if built:
            ok = sum(1 for r in built if r.passed)
            write_line(f"compile only (--commbench-compile-only): {ok} of {len(built)} answers "
                       "built, none ran; they are not counted in the scores below")
        sized = size_rows(solutions)
        readable = speed_readable(solutions)
        if sized:
            write_line("")
            write_line("per size, as nccl-tests prints it (the solution; ref bw: the "
                       "reference's busbw, or algbw where the task names no busbw)"
                       + (":" if readable is not False else
                          "; timed on a contended host, not to be read as bandwidths:"))
            for line in tabulate(sized, headers=SIZE_HEADERS).splitlines():
                write_line(line)
        doubtful = unreadable(solutions)
        if doubtful:
            write_line(f"speedups not to be read as they stand ({len(doubtful)}): "
                       + "; ".join(doubtful))
        s = score(solutions)
        write_line("")
        partial = headline_note(solutions)  # a run of shards, some of them missing
        for i, line in enumerate(headline(solutions, s)):
            write_line(line + (partial if i == 0 else ""))
        # the speedup scores only where a timing could be read (the headline says why not)
        fast = fast_line(s) if readable else ""
        if fast:
            write_line(fast)
        spread = intervals_line(bootstrap(solutions)) if readable else ""
        if spread:
            write_line(spread)
        ks = pass_at_ks(solutions)
        if ks:
            write_line("pass@k over the samples: " + ", ".join(
                f"pass@{k} {_pct(v)}" for k, v in ks))
        by_round = passes_by_round(solutions)
        if by_round:
            step = "agent iteration" if any(r.item.agent for r in solutions) else \
                "refinement round"
            write_line(f"tasks passed by {step} (cumulative): " + ", ".join(
                f"r{r}: {n}" for r, n in by_round) + f" of {s.applicable}")
        for line in agent_lines(solutions):
            write_line(line)
        headers = ["", "tasks", "pass", "Pass Rate", "PASS+Good", "GM-Speedup", "Pass x GM"]
        for key in ("difficulty", "category", "library"):
            write_line("")
            table = tabulate(_score_rows(breakdown(solutions, key), readable),
                             headers=[key] + headers[1:])
            for line in table.splitlines():
                write_line(line)
    if mutants:
        if solutions:
            write_line("")
        judged = [r for r in mutants if r.verdict not in MUTANT_UNJUDGED]
        rejected = sum(1 for r in judged if not r.passed)
        survived = [r for r in judged if r.passed]
        unjudged = len(mutants) - len(judged)
        rows = [[r.item.task, _world(r), r.item.candidate, r.verdict,
                 "SURVIVED" if r.passed else "rejected"]
                for r in sorted(mutants, key=lambda r: r.item.nodeid)]
        for line in tabulate(rows, headers=["task", "np", "mutant", "verdict", "checker"]).splitlines():
            write_line(line)
        write_line("")
        write_line(f"mutants rejected: {rejected}/{len(judged)}"
                   + (f" ({unjudged} not run: skipped, infra error or aborted)" if unjudged else "")
                   + (f"; SURVIVED: {', '.join(r.item.nodeid for r in survived)}" if survived
                      else ""))


def comparison_markdown(cmp: Comparison, a: str, b: str) -> str:
    """Run A against run B as Markdown tables (a GitHub-style table reads in a terminal too)."""
    def ci(iv: list[float]) -> str:
        return f"[{iv[0]:.3f}, {iv[1]:.3f}]"

    out = [f"## {a} -> {b}", "",
           f"{len(cmp.verdicts)} verdict changes, {len(cmp.moved)} speedups moved beyond their "
           f"90% intervals ({cmp.steady} passes in both did not), {len(cmp.new)} new items, "
           f"{len(cmp.removed)} removed.", ""]
    if cmp.verdicts:
        out += ["### Verdict changes", "", tabulate(
            [[item, x, y] for item, x, y in cmp.verdicts],
            headers=["item", a, b], tablefmt="github"), ""]
    if cmp.moved:
        out += ["### Speedups that moved", "", tabulate(
            [[item, f"{sx:.3f} {ci(ix)}", f"{sy:.3f} {ci(iy)}", how]
             for item, sx, ix, sy, iy, how in cmp.moved],
            headers=["item", a, b, "moved"], tablefmt="github"), ""]
    for title, items in (("New items", cmp.new), ("Removed items", cmp.removed)):
        if items:
            out += [f"### {title}", "", *[f"- {i}" for i in items], ""]
    return "\n".join(out)
