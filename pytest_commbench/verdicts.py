"""Verdicts: what the harness decided about one solution on one task."""

from __future__ import annotations

from enum import Enum


class Verdict(str, Enum):
    PASS = "pass"
    WRONG_ANSWER = "wrong_answer"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    TAMPERED = "tampered"
    FORBIDDEN = "forbidden"
    NO_SOLUTION = "no_solution"
    # the reply was cut at the output-token limit (finish_reason "length", stop_reason
    # "max_tokens"): neither built nor run, and counted against the model like no_solution
    TRUNCATED = "truncated"
    INFRA_ERROR = "infra_error"
    SKIPPED = "skipped"

    def __str__(self) -> str:  # so f-strings and JSON show "pass", not "Verdict.PASS"
        return self.value


#: verdicts that are the solution's fault (counted against the model)
MODEL_FAILURES = frozenset(
    {
        Verdict.WRONG_ANSWER,
        Verdict.COMPILE_ERROR,
        Verdict.RUNTIME_ERROR,
        Verdict.TIMEOUT,
        Verdict.TAMPERED,
        Verdict.FORBIDDEN,
        Verdict.NO_SOLUTION,
        Verdict.TRUNCATED,
    }
)
#: verdicts that leave a task out of the denominators
NOT_APPLICABLE = frozenset({Verdict.INFRA_ERROR, Verdict.SKIPPED})


class Rejected(Exception):
    """A solution was rejected before or while it ran; carries the verdict and why."""

    def __init__(self, verdict: Verdict, message: str, detail: str = "",
                 output: str = "") -> None:
        super().__init__(message)
        self.verdict = verdict
        self.message = message
        self.detail = detail
        self.output = output  # the solution's output (tail), where it ran
