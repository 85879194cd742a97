"""The engine: one item's evaluation, split by job.

- `flow.evaluate` — the one entry: an answer (a reply as a value) built, run and judged
  (`ItemResult`); `flow.produce` asks a model source for one, an outage as `infra_error`;
- `measure` — the timing policy (check job, warm-up, ABBA rounds, adaptive stopping,
  per-size figures, trust), driving jobs through the job runner it is given;
- `job.run_job` — the real job runner (staging, guards, sandbox, the observer);
- `blame` — who ended a failed job; `tidy` — an item's folder after its verdict;
- `refinement.refine` — direct prompting with refinement, a strategy over `evaluate` (the agent is
  another, in `agent.py`);
- `plan`, `result` (and `..settings`, built by the session) — what these pass each other (`result.Usage`: what an item's
  answers cost, kept alike by every strategy).
"""

from ..settings import RunSettings, Settings
from .flow import evaluate, produce
from .plan import InfraError, JobRunner, Outcome, Plan
from .refinement import feedback, refine
from .result import ItemResult, Usage, first_pass

__all__ = ["evaluate", "produce", "refine", "feedback", "ItemResult", "Usage", "first_pass", "RunSettings",
           "Settings", "Plan", "Outcome", "InfraError", "JobRunner"]
