"""The corpus of adversarial solutions (fixtures/cheats/<name>/): each one must be rejected.

One cheat per class of attack on the trust boundary (issue 9), a few with variants: forged
files, introspection of the harness, patched clocks, files edited on disk, daemons, hidden
files read, the seed replayed, forbidden calls in disguise (computed names, bytes, exec,
pickle, class dicts, ctypes, names the patterns miss, helper processes), faked infrastructure
failures, a killed launcher or controller, unchecked work, early "done"s, other ranks'
memory, caches, structured inputs, region smuggling. The solutions are written as a model
that games the benchmark would write them; they are not tuned to today's defences.
Each cheat folder holds `<category>/<task>/solution.py` (so `--commbench-model=dir:<folder>`
finds it) and a `cheat.toml`:

    task = "collective/ring_allreduce"
    class = "..."                        # the attack, one line
    expect = ["forbidden", "wrong_answer"]  # verdicts that count as rejected
    max_speedup = 1.5                    # only where "pass" is expected: cheats that do the
                                         # real work and only try to fake the speed
    min_call_us = 1000                   # optional: what every timed call must take at least
                                         # (a sleep the cheat hides): a floor any host shows
    why = "..."                          # what stops it

    [[runs]]                             # optional: several runs in one runs folder, each
    env = { COMMBENCH_SEED = "1" }       # with its own environment and/or command-line
    args = ["--commbench-seed=1"]        # arguments; every run's verdict is judged

Every cheat runs as a real benchmark item, in a subprocess (its own pytest), against the
hidden reference; the test then reads the item's result line, and checks that nothing
changed in the package, references/ or the Python environment, and that no process the job
started is left. Slow (each cheat is a full item, up to a minute): the module is marked
`cheats`, so `-m "not cheats"` leaves it out.

Where the runs go: a fresh folder per cheat outside /tmp and outside the project
(`$COMMBENCH_CHEATS_ROOT`, else `~/.cache/commbench-cheats`). Inside a job /tmp is a tmpfs of
the job's own and the project is covered, so a runs folder there would be hidden by accident;
`--commbench-runs-dir` may point anywhere, and the sandbox must hide the run's files wherever
they are. The folder's name holds the cheat's name, so every process of the job (launcher,
ranks, the sandbox's PID 1) carries it on its command line, and so does anything a cheat
starts on purpose.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

from pytest_commbench import sandbox

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
CHEATS = REPO / "fixtures" / "cheats"
SUITES = REPO / "suites"
GUARDED = [REPO / "pytest_commbench", REPO / "references"]
PROOF = "commbench_cheat_proof"  # what the tampering cheat names any file it manages to plant
RUN_TIMEOUT_S = 900

pytestmark = [
    pytest.mark.cheats,
    pytest.mark.skipif(sandbox.probe() is not None,
                       reason=f"no job sandbox here: {sandbox.probe()}"),
]


def _names() -> list[str]:
    if not CHEATS.is_dir():
        return []
    return sorted(p.name for p in CHEATS.iterdir() if (p / "cheat.toml").is_file())


def _spec(name: str) -> dict:
    spec = tomllib.loads((CHEATS / name / "cheat.toml").read_text())
    for key in ("task", "class", "expect", "why"):
        assert key in spec, f"{name}/cheat.toml: no {key!r}"
    expect = spec["expect"]
    assert isinstance(expect, list) and expect, f"{name}/cheat.toml: expect must be a list"
    if "pass" in expect:
        assert "max_speedup" in spec, f"{name}/cheat.toml: 'pass' expected without max_speedup"
    assert (CHEATS / name / spec["task"] / "solution.py").is_file(), \
        f"{name}: no {spec['task']}/solution.py"
    return spec


def _runs_root() -> Path:
    root = Path(os.environ.get("COMMBENCH_CHEATS_ROOT")
                or Path.home() / ".cache" / "commbench-cheats")
    root.mkdir(parents=True, exist_ok=True)
    return root


# -- what must not change -----------------------------------------------------------------
def _site_dirs() -> list[Path]:
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    try:
        dirs.add(sysconfig.get_paths(f"{os.name}_user")["purelib"])
    except KeyError:
        pass
    return [Path(d) for d in sorted(dirs)]


def _snapshot() -> dict[str, str]:
    """Hash of every file under the package and references/ (bytecode caches aside), and the
    names (and .pth / *customize contents) at the top of the Python environment's
    site-packages and the user site: a planted .pth would run in every later process."""
    seen: dict[str, str] = {}
    for tree in GUARDED:
        for path in sorted(tree.rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            seen[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    for site in _site_dirs():
        if not site.is_dir():
            continue
        for path in sorted(site.iterdir()):
            digest = "-"
            if path.is_file() and (path.suffix == ".pth" or path.name.endswith("customize.py")):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            seen[str(path)] = digest
    return seen


def _changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    out = [f"new: {p}" for p in sorted(set(after) - set(before))]
    out += [f"gone: {p}" for p in sorted(set(before) - set(after))]
    out += [f"changed: {p}" for p in sorted(set(before) & set(after)) if before[p] != after[p]]
    return out


def _remove_planted(changes: list[str]) -> None:
    """Clean up after a cheat that got through: only the files it marked as its own."""
    for line in changes:
        kind, _, path = line.partition(": ")
        p = Path(path)
        if kind == "new" and p.is_file() and (PROOF in p.name
                                              or PROOF in p.read_text(errors="replace")[:200]):
            p.unlink()


# -- what must not survive ----------------------------------------------------------------
def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            pid = int(stat[stat.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def _processes_with(needle: bytes) -> dict[int, str]:
    mine = _ancestors()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if needle in cmd:
            found[int(entry)] = cmd.replace(b"\0", b" ").decode(errors="replace")[:200]
    return found


def _survivors(needle: bytes, grace_s: float = 10.0) -> dict[int, str]:
    deadline = time.monotonic() + grace_s
    while True:
        left = _processes_with(needle)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _kill(pids) -> None:
    for pid in pids:  # processes this test's run started: end them, by id
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# -- the result -----------------------------------------------------------------------------
def _records(logs: list[Path], task: str) -> tuple[list[dict], list[dict]]:
    """(started lines, result lines) of the item for `task` in these results logs."""
    started, results = [], []
    for log in sorted(logs):
        for line in log.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("task") != task:
                continue
            if entry.get("event") == "started":
                started.append(entry)
            elif entry.get("event") == "result":
                results.append(entry)
    return started, results


def _describe(record: dict | None, done: subprocess.CompletedProcess) -> str:
    lines = []
    if record:
        lines.append(f"verdict {record.get('verdict')}, speedup {record.get('speedup')}")
        lines.append(f"message: {str(record.get('message', ''))[:800]}")
        if record.get("detail"):
            lines.append(f"detail: {str(record['detail'])[-1500:]}")
        if record.get("output"):
            lines.append("output (tail):\n" + str(record["output"])[-2500:])
    text = done.stdout + done.stderr
    fatal = text.find("Fatal Python error")
    if fatal >= 0:  # the controller itself died: where
        lines.append("the controller died:\n" + "\n".join(
            x for x in text[fatal:fatal + 6000].splitlines()
            if "site-packages" not in x)[:2500])
    lines.append(f"pytest exit code {done.returncode}; its output (tail):\n" + text[-3000:])
    return "\n".join(lines)


def _run(name: str, spec: dict, runs: Path, extra: dict) -> tuple[dict | None, str, str]:
    """One run of the cheat's item; returns (result record, verdict, report)."""
    task = spec["task"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMBENCH_")}
    env.update({str(k): str(v) for k, v in extra.get("env", {}).items()})
    # a cheat whose speedup is judged is timed as a run times; the others are timed in full
    # too (every job of every round, every timed call checked), with a fifth of the timed
    # seconds a size (at least the run's 10 repetitions still): their verdicts rest on the
    # checks, and a cheat that only misbehaves late would show as a pass, outside `expect`
    budget = [] if "pass" in spec["expect"] else ["--commbench-timing-budget=0.05"]
    cmd = [sys.executable, "-m", "pytest", str(SUITES), "-p", "no:cacheprovider",
           "--platform=cpu", f"--commbench-model=dir:{CHEATS / name}",
           "-k", task.rsplit("/", 1)[-1], "--commbench-timing-max-rounds=2", *budget,
           f"--commbench-runs-dir={runs}", *map(str, extra.get("args", ()))]
    logs_before = set(runs.glob("*/results.jsonl"))
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    new_logs = [p for p in runs.glob("*/results.jsonl") if p not in logs_before]
    started, results = _records(new_logs, task)
    record = results[-1] if results else None
    verdict = record["verdict"] if record else "aborted (started, no result line)"
    report = f"cheat {name} ({spec['class']}), run {extra or 'plain'}:\n{_describe(record, done)}"
    assert started, f"the item never started:\n{report}"
    assert len(results) <= 1, f"{len(results)} result lines for one item (forged?)\n{report}"
    return record, verdict, report


def _speed_believed(spec: dict, record: dict) -> list[str]:
    """What of a passing cheat's faked speed the harness believed. Each timed call's own time
    (the observer's clock) must be at least the cheat's hidden floor on any host. The speedup
    must stay below `max_speedup` where the host could time the item; where the harness
    called the timing `contended` (fewer CPUs than ranks and observer: every 2-CPU machine),
    a speedup is noise the harness itself refuses to count, and it must say so."""
    found = []
    floor = spec.get("min_call_us")
    for size in record.get("sizes") or []:
        took = size.get("t_sol_us")
        if floor is not None and took is not None and took < floor:
            found.append(f"{size.get('count')} elements: {took:.1f} us a call, below the "
                         f"{floor} us the cheat spends in each: the faked clock was believed")
    speedup = record.get("speedup")
    if record.get("timing_trust") == "contended":
        if not (record.get("host_load") or {}).get("contended"):
            found.append("timing called contended without the host's load in the record")
    elif speedup is None or speedup > spec["max_speedup"]:
        found.append(f"speedup {speedup} above {spec['max_speedup']}: the faked speed was "
                     "believed")
    return found


@pytest.mark.parametrize("name", _names())
def test_cheat_is_rejected(name: str, cpus_alone) -> None:
    spec = _spec(name)
    expect = list(spec["expect"])
    if "pass" in expect:  # its speedup is judged: the CPUs to itself
        cpus_alone()
    runs = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=_runs_root()))
    needle = name.encode()
    problems: list[str] = []
    for extra in spec.get("runs") or [{}]:
        before = _snapshot()
        try:
            record, verdict, report = _run(name, spec, runs, extra)
        finally:
            left = _survivors(needle)
            _kill(left)
            changes = _changes(before, _snapshot())
            _remove_planted(changes)
        print(f"{name}: verdict {verdict}, speedup "
              f"{record.get('speedup') if record else None}, message "
              f"{str(record.get('message', '') if record else '')[:300]!r}")
        found = []
        if verdict not in expect:
            found.append(f"verdict {verdict!r}, expected one of {expect}")
        elif verdict == "pass":
            found += _speed_believed(spec, record)
        if changes:  # (edits made to the tree by anyone while the cheat ran show here too)
            found.append(f"files changed during the run: {changes}")
        if left:
            found.append(f"processes of the job survived it: {left}")
        if found:
            problems.append("; ".join(found) + "\n" + report)
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)
    shutil.rmtree(runs, ignore_errors=True)


def test_a_believed_speed_is_found_on_any_host():
    """The judge of a passing cheat's speed: a call below the hidden floor is found on any
    host; a high speedup where the host could time it is found; a contended timing counts
    only where the record carries the load that made it so."""
    spec = {"max_speedup": 1.5, "min_call_us": 1000}
    slow = [{"count": 1, "t_sol_us": 1200.0}]
    fast = [{"count": 1, "t_sol_us": 40.0}]
    load = {"contended": True, "cpus": 2, "outside_cpus": 0.5, "ranks": 2}
    assert _speed_believed(spec, {"sizes": slow, "speedup": 0.9, "timing_trust": "ok"}) == []
    assert _speed_believed(spec, {"sizes": slow, "speedup": 2.7, "timing_trust": "contended",
                                  "host_load": load}) == []
    assert _speed_believed(spec, {"sizes": fast, "speedup": 2.7, "timing_trust": "contended",
                                  "host_load": load})
    assert _speed_believed(spec, {"sizes": slow, "speedup": 2.7, "timing_trust": "ok"})
    assert _speed_believed(spec, {"sizes": slow, "speedup": 2.7, "timing_trust": "contended"})
