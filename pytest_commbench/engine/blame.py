"""Who ended a job that failed: the harness or the machine (an `InfraError`), or the
solution (the outcome's verdict stays, its message says how). Reads only what the job left
(its exit status and output, its ranks' status, stack and guard files, read as `jobfiles`
reads them: bounded, never following links) and believes none of it beyond what the solution
could not have written."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

from .. import jobfiles, observer
from ..rank import protocol
from ..verdicts import Verdict
from .plan import InfraError, Outcome

# Open MPI's report of a rank killed by a signal (mpirun 4.x and prterun 5.x say the same)
LAUNCHER_DEATH = re.compile(r"process\s+rank\s+(\d+)\s+with\s+PID\s+\d+\s+on\s+node\s+\S+\s+"
                            r"exited\s+on\s+signal\s+(\d+)(?:\s+\(([^)]*)\))?")


def killed_outside(result) -> None:
    """Raise InfraError where the job was killed from outside it: its first process (the
    sandbox's `unshare`, the controller's own child) died of a signal while the controller
    had sent none (`JobResult.killed` is the controller's record). Nothing inside the job can
    send `unshare` a signal: it lies outside the job's PID namespace, and no process of the
    job shares its process group (the launcher runs in a session of its own); the job's
    namespace init (which `unshare` mirrors) takes no signal from inside either. What is left
    is the machine's: someone outside, the kernel (the OOM killer)."""
    code = result.returncode
    if result.killed or code is None or code >= 0:
        return
    try:
        name = f" ({signal.Signals(-code).name})"
    except ValueError:
        name = ""
    raise InfraError(f"the job was killed from outside: its sandbox's first process ended by "
                     f"signal {-code}{name}, which the controller did not send and no process "
                     f"of the job can\n{result.output.strip()[-800:]}")


def stacks(out: Path, world: int) -> str:
    """The Python stacks a hung rank's watchdog wrote shortly before the deadline (quoted for
    whoever debugs the hang, never believed; read as `jobfiles` reads a job's files)."""
    parts = []
    for rank in range(world):
        data = jobfiles.read(out.parent, f"{out.name}/{protocol.stack_file(rank)}", 65536,
                             tail=True)
        text = data.decode(errors="replace").strip() if data else ""
        if text:
            parts.append(f"rank {rank}'s Python stack near the deadline:\n{text[-1500:]}")
    return "\n".join(parts)


LIMIT_LINE = re.compile(r"\[commbench sandbox\] stopped the job: ([^\n]*)")
# Open MPI 5's report of a rank that ended without MPI_Finalize (os._exit, exit())
IMPROPER = re.compile(r"process\s+rank\s+(\d+)\s+with\s+PID\s+\d+\s+on\s+node\s+\S+\s+"
                      r"exiting\s+improperly")
EXITED = re.compile(r"(?:rank|Process name: \[\[?[^\]]*?,)\s*(\d+)\]?.*?"
                    r"(?:exit(?:ed)?(?: with)?(?: non-zero)? (?:status|code)[:\s]+(\d+))",
                    re.S)


def blame(outcome: Outcome, result, out: Path, world: int, loaded: bool) -> None:
    """Who ended the job: before any rank said it was loading the solution, the harness or
    the machine (whatever the job's exit code, output or files say: nothing of the solution
    had run); afterwards a forbidden call (the guard's report), a rank that raised or died,
    always the solution."""
    if not loaded:
        # an exit code is evidence of the harness's failure only before any rank began to
        # load the solution: afterwards the solution can end its rank with any code it likes
        if result.returncode == protocol.RESOLVE_EXIT:
            raise InfraError("the run-time guard does not fit the MPI the ranks loaded: "
                             f"{result.output.strip()[-800:]}")
        raise InfraError(f"the job failed before the solution was loaded ({outcome.message}): "
                         f"{result.output.strip()[-800:] or 'no output'}")
    reports = observer.guard_reports(out, world)
    if reports:
        outcome.verdict = Verdict.FORBIDDEN
        what = reports[0].get("forbidden", "?")
        outcome.message = f"the solution called what this task forbids, at run time: {what}"
        outcome.detail = str(reports[0].get("detail", ""))[:2000]
        return
    if result.returncode == protocol.LIMIT_EXIT:
        # the sandbox stopped the job at one of its limits (processes, its folder's size, the
        # disk): the solution's failure; the sandbox's line says which (a solution printing
        # such a line changes only this message, never the verdict)
        said = LIMIT_LINE.findall(result.output)
        outcome.message = ("the job went past a limit of its sandbox and was stopped"
                           + (f": {said[-1].strip()[:500]}" if said else
                              f" (exit code {protocol.LIMIT_EXIT})"))
        return
    statuses = []
    for rank in range(world):
        # written by the rank's process: quoted, bounded, never trusted
        data = jobfiles.read(out.parent, f"{out.name}/{protocol.status_file(rank)}", 65536)
        try:
            status = json.loads(data) if data else None
        except Exception:  # noqa: BLE001
            status = None
        statuses.append(status if isinstance(status, dict) else None)
    if outcome.verdict is Verdict.TIMEOUT:
        stuck = [f"rank {r}: {str(s.get('phase'))[:100]}" for r, s in enumerate(statuses)
                 if isinstance(s, dict) and not s.get("done")]
        raised = [(r, s) for r, s in enumerate(statuses) if isinstance(s, dict) and s.get("error")]
        if raised:
            # a rank that raised and then hung in its abort (MPI_Abort can hang): its
            # exception is what tells; the verdict stays the timeout the observer saw
            rank, s = raised[0]
            outcome.message += (f"; rank {rank} had raised during {str(s.get('phase'))[:100]} "
                                f"(as its own status file says) and the job did not end after "
                                f"it: {str(s['error'])[:1500]}")
        outcome.detail = "\n".join(
            p for p in (outcome.detail, "status files: " + "; ".join(stuck) if stuck else "",
                        str(raised[0][1].get("traceback", ""))[-4000:] if raised else "",
                        stacks(out, world)) if p)
        return
    for rank, s in enumerate(statuses):
        if isinstance(s, dict) and s.get("error"):
            outcome.message = (f"rank {rank} raised during {str(s.get('phase'))[:100]} (as its "
                               f"own status file says): {str(s['error'])[:1500]}")
            outcome.detail = str(s.get("traceback", ""))[-6000:]
            return
    seen = LAUNCHER_DEATH.search(result.output)
    if seen:
        how = f"signal {seen.group(2)}{f' ({seen.group(3)})' if seen.group(3) else ''}"
        outcome.message = f"rank {seen.group(1)} died ({how}): {outcome.message}"
        return
    seen = IMPROPER.search(result.output)
    if seen:
        outcome.message = (f"rank {seen.group(1)} died (it left without finalizing MPI, e.g. "
                           f"os._exit): {outcome.message}")
        return
    seen = EXITED.search(result.output)
    if seen:
        outcome.message = f"rank {seen.group(1)} exited with code {seen.group(2)}: " \
                          f"{outcome.message}"
        return
    outcome.message += f" (launcher exit code {result.returncode})"
