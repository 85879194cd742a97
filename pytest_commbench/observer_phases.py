"""Phase statistics of a job's calls: the time the observer took of each call, and the charge
for the untimed phases around it (a staged backend's upload and fetch) where a job's phases
run longer than its item's reference job's."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Timing:
    """One call as the observer saw it: `call` from the last gate to the last "done"; on a
    staged (GPU) backend also the untimed phases around it, whose length the solution can
    stretch with work of its own: `before`, the longest upload (inputs written to the rank's
    "ready", its whole device idle) and `after`, the fetch of the outputs (all ranks done to
    the last "saved"). See `charged`."""

    call: float
    before: float = 0.0
    after: float = 0.0


PHASE_TOLERANCE = (0.25, 20e-6)  # (fraction of the baseline, seconds) never charged


def charged(timings: list[Timing], baseline: tuple[float, float] | None) -> list[float]:
    """Each call's time with the untimed phases' systematic excess added: a solution that
    says it is done before its work is (the rank's process can write any word) or does the
    work while its inputs are uploaded makes those phases longer than the reference's. Per
    job and phase, the median over its calls is compared with the baseline, `baseline`
    being the medians of the item's warm-up reference job (None: untimed jobs, the warm-up
    itself); what exceeds it by more than PHASE_TOLERANCE is added to every call of the job,
    the reference's jobs included. Medians, so that a copy that was slow once (pageable
    memory, a page fault) charges nothing; the tolerance, so that job-to-job drift does not."""
    if baseline is None or not timings:
        return [t.call for t in timings]
    extra = 0.0
    for got, base in ((float(np.median([t.before for t in timings])), baseline[0]),
                      (float(np.median([t.after for t in timings])), baseline[1])):
        extra += max(0.0, got - base - PHASE_TOLERANCE[0] * base - PHASE_TOLERANCE[1])
    return [t.call + extra for t in timings]


def phase_baseline(timings: list[Timing]) -> tuple[float, float] | None:
    """The medians of a reference job's upload and fetch phases (None: no calls)."""
    if not timings:
        return None
    return (float(np.median([t.before for t in timings])),
            float(np.median([t.after for t in timings])))
