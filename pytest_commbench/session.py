"""Run-wide state: resolved settings, the model, the platform, the secret seed, the log.

Every option comes from the command line, else the environment (COMMBENCH_<NAME>), else the
ini file (commbench_<name>), else its default; all three are parsed and checked by the same
function, and a bad value is a usage error that says where it came from.

A run lives in one directory: its results log (`results.jsonl`) and `run.json`, written when
the first item is about to run, which holds the run's secret seed so that `--commbench-resume`
can finish a killed run with the same inputs. Jobs never see the runs directory. One session
at a time uses a run directory (`results.RunLock`, taken when the run's file is written or,
resuming, before anything else; its xdist workers share it): a second `--commbench-resume`
of a run whose session still lives is a usage error naming that session's pid.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from . import shards
from .platforms import GENERIC, NAMES, PROFILES, detect
from .record import ResultLine
from .results import ResultsLog, RunBusy, RunLock, finished
from .settings import RunSettings
from .verdicts import Verdict

STATE = pytest.StashKey["CommbenchState"]()
RUN_FILE = "run.json"
AGENT_NAMES = ("geak",)  # the built-in agents (agent.py)



# -- parsing option values (the command line, the environment and ini files alike) ----------

def _number(kind: type, minimum: float, inclusive: bool, what: str) -> Callable[[str], Any]:
    def parse(text: str):
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise pytest.UsageError(f"expected {what}, got {text!r}") from None
        if kind is float and not math.isfinite(value):
            raise pytest.UsageError(f"expected {what}, got {text!r}")
        if value < minimum or (value == minimum and not inclusive):
            sign = ">=" if inclusive else ">"
            raise pytest.UsageError(f"expected {what} {sign} {minimum:g}, got {text}")
        return value

    return parse


def _integer(text: str) -> int:
    try:
        return int(str(text).strip(), 0)
    except ValueError:
        raise pytest.UsageError(f"expected an integer, got {text!r}") from None


def _on_off(text: str) -> str:
    word = str(text).strip().lower()
    if word in ("1", "true", "yes", "on"):
        return "on"
    if word in ("0", "false", "no", "off"):
        return "off"
    raise pytest.UsageError(f"expected on or off, got {text!r}")


def _choice(*words: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        word = str(text).strip().lower()
        if word not in words:
            raise pytest.UsageError(f"expected one of {', '.join(words)}, got {text!r}")
        return word

    return parse


def _text(text: str) -> str:
    if not str(text).strip():
        raise pytest.UsageError("expected a value, got nothing")
    return str(text)


def _shard(text: str) -> shards.Shard:
    try:
        return shards.parse(text)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def _run_name(text: str) -> str:
    try:
        return shards.parse_name(text)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def _flag(text: str) -> bool:
    word = str(text).strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise pytest.UsageError(f"expected true or false (1/0, yes/no, on/off), got {text!r}")


count = _number(int, 0, True, "a whole number")
positive_count = _number(int, 1, True, "a whole number")
seconds = _number(float, 0, False, "seconds")
nonnegative_seconds = _number(float, 0, True, "seconds")
fraction = _number(float, 0, True, "a fraction")

@dataclass(frozen=True)
class Option:
    """One option: `--commbench-<name>` (or `--platform`), ini key `commbench_<name>`,
    environment variable `COMMBENCH_<NAME>`; one parser for all three."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    flag: bool = False  # given on the command line with no value
    cli: bool = True  # False: an ini key (and environment variable) only
    # former names, still read (command line, environment, ini) with a warning to rename
    aliases: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The help text, its "{default}" the table's default (written nowhere else)."""
        shown = f"{self.default:g}" if isinstance(self.default, float) else str(self.default)
        return self.help.replace("{default}", shown)


MODEL_DESC = "where solutions come from: reference, template, mutants, dir:PATH or a registered model"


def _platform_desc() -> str:
    """The --platform help, from the platforms' own registry (a new profile is listed with
    nothing written here); a profile `auto` never picks says so."""
    named = [f"{n} (by name only)" if n in PROFILES and not PROFILES[n].detected else n
             for n in NAMES]
    generic = " or ".join(GENERIC.values())
    return (f"platform to run on: auto (default: this machine's GPUs' profile, {generic} "
            f"for GPUs no profile names, else cpu), {', '.join(named)}, or a registered one")


PLATFORM_DESC = _platform_desc()
SEED_DESC = "secret seed of the random inputs (default: a fresh one per run, printed)"
TIMEOUT_DESC = "per-job deadline in seconds (default: the task manifest's timeout)"
RUNS_DESC = "where result logs and scratch directories go (default {default})"
SCRATCH_DESC = ("where items' scratch directories (inputs, outputs) go instead of the runs "
                "directory, e.g. a tmpfs such as /dev/shm for large sizes")
BUILD_CACHE_DESC = ("a folder of built solutions kept between runs, found again by their source, "
                    "task and build recipe (default: each run builds into its own folder); "
                    "`commbench compile --cache` fills it ahead of a run")
RESUME_DESC = ("finish a killed run: RUN is its id under the runs directory or its directory; "
               "items it finished are reported from its log, the rest run with its seed")
ROUNDS_DESC = ("refinement rounds: after a failure, or a pass whose readable speedup is below "
               "1 (a band named: not contended, not inconclusive), the model is asked again with the verdict and its evidence, up to this many "
               "generations per task (default {default})")
TIMING_ROUNDS_DESC = "interleaved reference/solution timing rounds per item, at least (default {default})"
MAX_ROUNDS_DESC = ("at most this many timing rounds: they are added while the speedup is less "
                   "precise than --commbench-timing-precision (default {default})")
PRECISION_DESC = ("relative uncertainty of an item's speedup (standard error, from how much "
                  "the jobs scatter, at its 90% upper bound for so few jobs) below which no "
                  "more timing rounds are added (default {default})")
REPS_DESC = "timed repetitions per size per job (default {default})"
WARMUP_DESC = "untimed warm-up calls per size per job (default {default})"
BUDGET_DESC = ("seconds of timed work per size per job; repetitions go on past --commbench-reps "
               "until it is spent (default {default}; formerly --commbench-budget)")
MAX_REPS_DESC = "at most this many timed repetitions per size per job (default {default})"
WALL_DESC = ("seconds per size per job the timed repetitions may take in all, drawing, writing "
             "and checking their fresh inputs included (at least 3 repetitions whatever it "
             "is; default {default}): what bounds the jobs of the largest sizes")
KEEP_DESC = "keep the scratch directories of passing items too"
RANKS_PER_GPU_DESC = ("shared placement: put up to N ranks on one GPU, so an item of W ranks runs "
                      "where ceil(W/N) GPUs are visible (each job gets an MPS daemon of its "
                      "own); checks correctness on fewer GPUs, its timings are not NVLink "
                      "figures (default {default}: one GPU per rank)")
JOBS_PER_GPU_DESC = ("with --commbench-ranks-per-gpu above 1: up to N untimed jobs (check-only "
                     "items, mutants, templates) run on one GPU side by side, each under its "
                     "own MPS daemon, so that -n N checks a suite faster on one GPU (bounded by "
                     "the CPUs: 5 jobs gave 2-3x on a 16-core H200 host); "
                     "a timed job still has its GPUs to itself (default {default})")
GPU_BATCH_DESC = ("GPU jobs time short calls as batches of back-to-back calls, each on a buffer "
                  "set of its own with its inputs uploaded just before it (as CPU jobs do); "
                  "checked on the CPU through the staged protocol and, for correctness, on one "
                  "GPU with ranks sharing it (default off: one call per timed repetition)")
STRESS_DESC = ("calls made back to back after each size's correctness calls, with no "
               "synchronization between them and a rank held back before some (what a gated "
               "call hides: dropped barriers, stale flags, reused scratch); 0 turns the "
               "phase off (default {default})")
SANITIZER_DESC = ("a compiled answer also runs its smallest sizes' correctness calls under "
                  "NVIDIA's compute-sanitizer, a finding being a wrong answer with the "
                  "checker's report: off (default), auto (memcheck where compute-sanitizer is "
                  "installed, else nothing), or a tool: memcheck, racecheck, synccheck, "
                  "initcheck. Verified on CUDA-runtime answers; NCCL, NVSHMEM and "
                  "ThunderKittens answers are not yet known to run under it")
SHARED_NODE_DESC = ("timed items lease only the GPUs they use instead of the whole node "
                    "(faster with -n, but neighbours may disturb the numbers)")
THUNDERKITTENS_DESC = ("the ThunderKittens repository (or its include/ folder): its headers build the "
                      "ThunderKittens tasks, which are skipped without them (default: the "
                      "COMMBENCH_THUNDERKITTENS environment variable)")
LAUNCHER_DESC = ("what starts a job's ranks over nodes: mpirun (default; mpiexec alike), "
                 "'srun --mpi=pmix' or 'flux run', a program's path, and any arguments of "
                 "its own; every rank's node is named in its command")
HOSTFILE_DESC = ("the nodes a job's ranks may run on (an MPI hostfile: 'node slots=N', "
                 "'node:N' or a name per slot); default: the batch system's allocation "
                 "(Slurm, PBS, LSF, Flux) where it has several nodes, else this host only")
RANKS_PER_NODE_DESC = ("ranks of a job on each node, filled in order, for tasks that may "
                       "span nodes (manifest nodes = \"any\", marker span_nodes; the others "
                       "keep all their ranks on one node); default: what the allocation or "
                       "hostfile says of every node alike, else a job's ranks spread evenly")
UNSANDBOXED_DESC = ("run jobs without their sandbox where namespaces are not available "
                    "(recorded in every result's fingerprint; a solution can then reach the "
                    "harness)")
BASE_URL_DESC = ("endpoint of the model's server, in the form its SDK takes (OpenAI-compatible: "
                 ".../v1; Anthropic: the host root); overrides the registry's")
MODELS_FILE_DESC = "a TOML file of models that extends or overrides the shipped registry"
REGENERATE_DESC = ("ask the model again even where the runs directory keeps a reply for the "
                   "task (otherwise kept replies are reused and no request is sent)")
REQUEST_TIMEOUT_DESC = ("seconds a streamed reply may go without a new chunk, reasoning included "
                        "(default {default}; a whole request is capped at 4 hours)")
CONTENDED_DESC = ("stop (default): no timing rounds past --commbench-timing-rounds where the host "
                  "is contended (more CPUs busy than there are: no number of rounds makes such a "
                  "timing readable); continue: add them as elsewhere")
MAX_TOKENS_DESC = ("output tokens a model may use for one reply, reasoning included (default: "
                   "the registry's max_tokens; a server that lists its context length is "
                   "asked for no more than fits after the prompt)")
SAMPLES_DESC = ("independent answers per task (each an item, e.g. [np2-s1]); pass@k for every "
                "k up to it in the summary (default {default})")
TEMPERATURE_DESC = "sampling temperature (default: the registry's, else the provider's)"
CHECK_ONLY_DESC = ("correctness only: every item's trials and checked repetitions, no reference "
                  "job and no timing (passes have no speedup)")
COMPILE_ONLY_DESC = ("build each answer with the platform's hidden recipe and stop there: a "
                    "compile error or a forbidden symbol is the verdict, a build is a pass "
                    "marked compile-only; no GPU needed (e.g. --platform=mi325x builds for "
                    "gfx942 on any machine)")
AGENT_DESC = ("agent mode: geak (generate, evaluate, reflect on a failure, optimize a pass), or "
              "a registered agent; each sample is one agent run, --commbench-rounds bounds "
              "its evaluated iterations (default: off, direct prompting)")
MAX_DEBUG_DESC = ("agent mode: consecutive fix attempts that end in the same error before the "
                  "agent restarts from a fresh generation (default {default})")
KNOWLEDGE_DESC = ("agent mode: on (default) adds the suite's knowledge pack of each library the "
                  "task uses to the prompts; off for the ablation")
HINTS_DESC = ("add each task's hints (its hints.md: how an expert would go about it) to the "
              "prompts; a task's prompt alone is its contract (default off: results with hints "
              "are another configuration of the model in every report)")
RETRIEVAL_DESC = ("agent mode: on adds the prompt and template of the most similar other task "
                  "(never a reference) to the first prompt (default off)")
SHARD_DESC = ("run part K of N (1 <= K <= N) of the selected items, split by task (all "
              "world sizes of a task in one part) the same way on every machine; the parts of "
              "one run share --commbench-run-name and `commbench report` merges them")
RUN_NAME_DESC = ("a name the shards of one run share, kept in each shard's run.json (default: "
                 "inside a Slurm job array, slurm-<array job id>)")
BUDGET_USD_DESC = ("US dollars a task's answers may cost: no further refinement round once "
                   "spent (needs the model's prices)")

#: every option, in the order `pytest --help` lists them
OPTIONS: list[Option] = [
    Option("model", _text, "reference", MODEL_DESC),
    Option("platform", _text, "auto", PLATFORM_DESC),
    Option("seed", _integer, None, SEED_DESC),
    Option("timeout", seconds, None, TIMEOUT_DESC),
    Option("runs_dir", _text, ".commbench/runs", RUNS_DESC),
    Option("scratch", _text, None, SCRATCH_DESC),
    Option("build_cache", _text, None, BUILD_CACHE_DESC),
    Option("resume", _text, None, RESUME_DESC),
    Option("rounds", positive_count, 1, ROUNDS_DESC),
    Option("timing_rounds", positive_count, 2, TIMING_ROUNDS_DESC),
    Option("timing_max_rounds", positive_count, 6, MAX_ROUNDS_DESC),
    Option("timing_precision", fraction, 0.03, PRECISION_DESC),
    Option("timing_contended", _choice("stop", "continue"), "stop", CONTENDED_DESC),
    Option("reps", count, 10, REPS_DESC),
    Option("warmup", count, 2, WARMUP_DESC),
    Option("timing_budget", nonnegative_seconds, 0.25, BUDGET_DESC, aliases=("budget",)),
    Option("max_reps", count, 200, MAX_REPS_DESC),
    Option("timing_wall", nonnegative_seconds, 2.5, WALL_DESC),
    Option("check_only", _flag, False, CHECK_ONLY_DESC, flag=True),
    Option("compile_only", _flag, False, COMPILE_ONLY_DESC, flag=True),
    Option("keep", _flag, False, KEEP_DESC, flag=True),
    Option("shard", _shard, None, SHARD_DESC),
    Option("run_name", _run_name, None, RUN_NAME_DESC),
    Option("shared_node", _flag, False, SHARED_NODE_DESC, flag=True),
    Option("ranks_per_gpu", positive_count, 1, RANKS_PER_GPU_DESC),
    Option("jobs_per_gpu", positive_count, 1, JOBS_PER_GPU_DESC),
    Option("gpu_batch", _flag, False, GPU_BATCH_DESC, flag=True),
    Option("stress", count, 6, STRESS_DESC),
    Option("sanitizer", _choice("auto", "off", "memcheck", "racecheck", "synccheck", "initcheck"),
           "off", SANITIZER_DESC),
    Option("thunderkittens", _text, None, THUNDERKITTENS_DESC),
    Option("unsandboxed", _flag, False, UNSANDBOXED_DESC, flag=True),
    Option("launcher", _text, None, LAUNCHER_DESC),
    Option("hostfile", _text, None, HOSTFILE_DESC),
    Option("ranks_per_node", positive_count, None, RANKS_PER_NODE_DESC),
    Option("base_url", _text, None, BASE_URL_DESC),
    Option("models_file", _text, None, MODELS_FILE_DESC),
    Option("regenerate", _flag, False, REGENERATE_DESC, flag=True),
    Option("request_timeout", seconds, 900.0, REQUEST_TIMEOUT_DESC),
    Option("max_tokens", positive_count, None, MAX_TOKENS_DESC),
    Option("samples", positive_count, 1, SAMPLES_DESC),
    Option("temperature", _number(float, 0, True, "a temperature"), None, TEMPERATURE_DESC),
    Option("budget_usd", _number(float, 0, False, "US dollars"), None, BUDGET_USD_DESC),
    Option("agent", _text, None, AGENT_DESC),
    Option("max_debug", positive_count, 3, MAX_DEBUG_DESC),
    Option("knowledge", _on_off, "on", KNOWLEDGE_DESC),
    Option("hints", _flag, False, HINTS_DESC, flag=True),
    Option("retrieval", _on_off, "off", RETRIEVAL_DESC),
    Option("references", _text, "references", "hidden references root (default: {default})",
           cli=False),
    Option("suites", _text, "suites", "suites root, to name tasks by relative path "
           "(default: {default})", cli=False),
]
#: `pytest --help` lists the options in these groups, in this order (the rest under "run")
GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "run": ("what runs, and where its results go", (
        "model", "platform", "seed", "check_only", "compile_only", "timeout", "runs_dir", "scratch",
        "build_cache", "resume", "shard", "run_name", "keep", "unsandboxed")),
    "models": ("asking models (registry models, openai:ID, anthropic:ID)", (
        "rounds", "samples", "temperature", "budget_usd", "base_url", "models_file",
        "regenerate", "request_timeout", "max_tokens", "hints", "agent", "max_debug",
        "knowledge", "retrieval")),
    "timing": ("timing against the reference", (
        "timing_rounds", "timing_max_rounds", "timing_precision", "timing_contended",
        "reps", "warmup",
        "timing_budget", "max_reps", "timing_wall")),
    "placement": ("where ranks run on GPU machines", (
        "ranks_per_gpu", "jobs_per_gpu", "shared_node", "gpu_batch", "thunderkittens",
        "launcher", "hostfile", "ranks_per_node")),
}


def group_of(name: str) -> str:
    return next((g for g, (_, names) in GROUPS.items() if name in names), "run")


DEFAULTS = {o.name: o.default for o in OPTIONS}
#: an option's former names (each still read, with a warning)
ALIASES: dict[str, tuple[str, ...]] = {o.name: o.aliases for o in OPTIONS if o.aliases}
#: how each option's text becomes its value (and what is wrong with it)
PARSERS: dict[str, Callable[[str], Any]] = {o.name: o.parse for o in OPTIONS}
#: options given on the command line as a flag, with no value
FLAGS = tuple(o.name for o in OPTIONS if o.flag)


def flag_name(name: str) -> str:
    return "--platform" if name == "platform" else f"--commbench-{name.replace('_', '-')}"


def labelled(name: str, shown: str | None = None) -> Callable[[str], Any]:
    """The command-line parser of an option: its errors name the option as it was given
    (`shown`: a former name)."""
    parse = PARSERS[name]

    def parse_argument(text: str):
        try:
            return parse(text)
        except pytest.UsageError as exc:
            raise pytest.UsageError(f"{shown or flag_name(name)}: {exc}") from None

    return parse_argument


def lookup(config: pytest.Config, name: str) -> tuple[Any, str]:
    """(value, where it came from): command line > environment > ini > default; at each
    level the option's own name first, then its former names (see `renamed`)."""
    names = (name, *ALIASES.get(name, ()))
    for each in names:
        value = config.getoption(f"commbench_{each}", None)
        if value is not None and value is not False:
            return value, flag_name(each)
    parse = PARSERS[name]
    for each in names:
        var = f"COMMBENCH_{each.upper()}"
        env = os.environ.get(var)
        if env not in (None, ""):
            where = f"{var}={env!r} (environment)"
            try:
                return parse(env), where
            except pytest.UsageError as exc:
                raise pytest.UsageError(f"{where}: {exc}") from None
    for each in names:
        try:
            ini = config.getini(f"commbench_{each}")
        except ValueError:  # a former name not registered (a plugin's own config)
            continue
        if ini not in (None, "", []):
            where = f"commbench_{each} = {ini!r} (ini file {config.inipath})"
            try:
                return parse(ini), where
            except pytest.UsageError as exc:
                raise pytest.UsageError(f"{where}: {exc}") from None
    return DEFAULTS.get(name), f"{flag_name(name)} (default)"


def given(config: pytest.Config, name: str) -> bool:
    """Whether the user set this option (anywhere), rather than leaving its default."""
    return name in PARSERS and not lookup(config, name)[1].endswith("(default)")


def renamed(config: pytest.Config) -> list[str]:
    """One line per option given under a former name: what it is called now."""
    lines = []
    for name, former in ALIASES.items():
        where = lookup(config, name)[1]
        for old in former:
            for spelled, now in ((flag_name(old), flag_name(name)),
                                 (f"COMMBENCH_{old.upper()}=", f"COMMBENCH_{name.upper()}"),
                                 (f"commbench_{old} ", f"commbench_{name}")):
                if where == spelled or where.startswith(spelled):
                    lines.append(f"{spelled.rstrip('= ')} is now {now} (the former name is "
                                 "still read)")
    return lines


def setting(config: pytest.Config, name: str) -> Any:
    return lookup(config, name)[0]


# -- the run ----------------------------------------------------------------------------------

class KnownNames:
    """Platform (or vendor) names a manifest may list: the built-ins, the one in use, and any a
    plugin's pytest_commbench_make_platform answers to."""

    def __init__(self, builtin, in_use: str, ask: Callable[[str], bool] | None = None) -> None:
        self.names = set(builtin) | {in_use}
        self.ask = ask
        self._asked: dict[str, bool] = {}

    def __contains__(self, name: object) -> bool:
        if name in self.names:
            return True
        if self.ask is None or not isinstance(name, str):
            return False
        if name not in self._asked:
            try:
                self._asked[name] = bool(self.ask(name))
            except Exception:  # noqa: BLE001 - a plugin that cannot make it does not know it
                self._asked[name] = False
        return self._asked[name]

    def __iter__(self):
        return iter(sorted(self.names))


@dataclass
class CommbenchState:
    config: pytest.Config
    model: Any
    platform: Any
    seed: int
    run_id: str
    run_dir: Path
    runs_dir: Path
    work_dir: Path  # items' scratch directories (inputs, outputs, jobs)
    build_dir: Path  # built solutions (the run's own, or --commbench-build-cache)
    references: Path
    suites: Path
    settings: RunSettings  # the options the engine reads, resolved once
    log: ResultsLog
    resume_upto: int | None = None  # resuming: the bytes of the log the killed run left
    manifest_errors: int = 0
    known_platforms: Any = None
    known_vendors: Any = None
    agent: Any = None  # --commbench-agent: what runs a task's candidates (None: direct)
    _fingerprint: dict | None = None
    _resumed: dict[str, ResultLine] | None = field(default=None, repr=False)
    run_lock: RunLock | None = field(default=None, repr=False)  # one session per run folder
    shard: shards.Shard | None = None  # --commbench-shard: the part of the selection run here
    run_name: str | None = None  # the name the shards of one run share

    def item_seed(self, nodeid: str) -> int:
        """Per-item seed: the same item gets the same inputs on any worker, in any order."""
        h = hashlib.sha256(f"{self.seed}:{nodeid}".encode()).digest()
        return int.from_bytes(h[:8], "little")

    @property
    def fingerprint(self) -> dict:
        if self._fingerprint is None:
            self._fingerprint = {
                **self.platform.fingerprint(),
                "sandbox": "namespaces" if not self.settings.unsandboxed else "none (--commbench-unsandboxed)",
            }
        return self._fingerprint

    @property
    def resumed(self) -> dict[str, ResultLine]:
        """Result records the run being resumed already has, by node id (this model's only;
        an `infra_error` is no result: the machine's or the provider's fault, the item runs
        again)."""
        if self._resumed is None:
            self._resumed = {}
            if self.resume_upto and self.log.path.exists():
                self._resumed = {
                    nodeid: record
                    for nodeid, record in finished(self.log.path, self.resume_upto).items()
                    if record.item.model == self.model.name
                    and record.verdict != Verdict.INFRA_ERROR
                }
        return self._resumed

    @property
    def hidden(self) -> tuple[Path, ...]:
        """Trees no job may see, beside those the runner hides (the runs, this run, the project)."""
        return (self.runs_dir, self.run_dir, self.config.rootpath)

    def run_file(self) -> Path:
        return self.run_dir / RUN_FILE

    def write_run_file(self) -> None:
        """Record the run (its seed above all) before its first item: a killed session can then
        be resumed with the same inputs. Rewritten atomically, the resumes appended."""
        path = self.run_file()
        if self.run_lock is not None:
            try:
                self.run_lock.hold()
            except RunBusy as exc:
                raise pytest.UsageError(f"run {self.run_id} ({self.run_dir}): {exc}") from None
        now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        info = _read_run_file(path) or {}
        if info:
            info.setdefault("resumed", []).append(now)
        else:
            info = {"run": self.run_id, "seed": self.seed, "model": self.model.name,
                    "platform": self.platform.name, "started": now,
                    "args": list(self.config.invocation_params.args)}
            if self.shard is not None:
                info[shards.SHARD_KEY] = str(self.shard)
            if self.run_name:
                info[shards.NAME_KEY] = self.run_name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{RUN_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps(info, indent=1, default=str) + "\n")
        tmp.replace(path)


def _read_run_file(path: Path) -> dict | None:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _make(config: pytest.Config, kind: str, name: str, where: str):
    hook = getattr(config.hook, f"pytest_commbench_make_{kind}")
    try:
        obj = hook(config=config, name=name)
    except ValueError as exc:  # a name the maker knows, with a value it cannot use
        raise pytest.UsageError(f"{where}: {exc}") from None
    if obj is None:
        if kind == "model":
            names = [n for group in config.hook.pytest_commbench_model_names(config=config)
                     for n in group]
            raise pytest.UsageError(
                f"{where}: unknown model {name!r} (known: {', '.join(names)})")
        if kind == "agent":
            raise pytest.UsageError(
                f"{where}: unknown agent {name!r} (known: off, {', '.join(AGENT_NAMES)})")
        from .platforms import NAMES

        raise pytest.UsageError(
            f"{where}: unknown platform {name!r} (known: auto, {', '.join(NAMES)})")
    return obj


def _flux_output(argv: list[str]) -> str:
    import subprocess

    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _placement(config: pytest.Config):
    """Where jobs' ranks run (`nodes.resolve`): None where every job stays on this node."""
    from . import nodes

    names = ("launcher", "hostfile", "ranks_per_node")
    values = {name: setting(config, name) for name in names}
    hostfile = values["hostfile"]
    if hostfile:
        hostfile = str(config.invocation_params.dir / Path(hostfile).expanduser())
    try:
        return nodes.resolve(values["launcher"], hostfile, values["ranks_per_node"],
                             os.environ, sandboxed=not setting(config, "unsandboxed"),
                             run=_flux_output)
    except nodes.PlacementError as exc:
        named = [lookup(config, name)[1] for name in names if given(config, name)]
        where = ", ".join(named) or "the batch system's allocation"
        raise pytest.UsageError(f"{where}: {exc}") from None


def _resume_dir(config: pytest.Config, runs_dir: Path, value: str, where: str) -> Path:
    path = Path(value).expanduser()
    for candidate in ([path] if path.is_absolute() else
                      [config.invocation_params.dir / path, runs_dir / path]):
        if candidate.is_dir():
            return candidate.resolve()
    raise pytest.UsageError(f"{where}: no run {value!r} to resume (neither a run directory "
                            f"nor a run id under {runs_dir})")


def _resumed_seed(run_dir: Path, given: int | None, where: str) -> tuple[int, dict]:
    """The seed of the run being resumed (from run.json, else from its result lines)."""
    info = _read_run_file(run_dir / RUN_FILE) or {}
    seed = info.get("seed")
    log = run_dir / "results.jsonl"
    if seed is None and log.exists():
        seeds = {r.seed for r in finished(log).values() if r.seed is not None}
        seed = seeds.pop() if len(seeds) == 1 else None
    if seed is None:
        if given is None:
            raise pytest.UsageError(f"{where}: the seed of run {run_dir.name} is unknown (no "
                                    f"{RUN_FILE}); give it with --commbench-seed")
        return given, info
    if given is not None and int(given) != int(seed):
        raise pytest.UsageError(f"{where}: run {run_dir.name} has seed {seed}, not {given}: a "
                                "resumed run keeps its seed (leave --commbench-seed out)")
    return int(seed), info


def _shard_given(text: str | None) -> shards.Shard | None:
    return shards.parse(text) if text else None


def _fresh_shard(config: pytest.Config) -> tuple[shards.Shard | None, str | None]:
    """The shard of a new run and the name its shards share (a shard of several needs one:
    without it the report cannot tell which shards make one run)."""
    shard, where = lookup(config, "shard")
    name = setting(config, "run_name") or shards.default_name()
    if shard is not None and shard.count > 1 and not name:
        raise pytest.UsageError(
            f"{where}: give the shards of this run a name they all share "
            "(--commbench-run-name NAME, the same for every shard; inside a Slurm job array it "
            "is slurm-<array job id>): `commbench report` merges the shards of one name")
    return shard, name


def _resumed_shard(config: pytest.Config, run_id: str,
                   info: dict) -> tuple[shards.Shard | None, str | None]:
    """A resumed run keeps the shard and name its run.json records (given ones must agree)."""
    recorded, recorded_name = shards.of(info), info.get(shards.NAME_KEY)
    given, where = lookup(config, "shard")
    if given is not None and given != recorded:
        was = f"shard {recorded}" if recorded else "a run of every selected item (no shard)"
        raise pytest.UsageError(f"{where}: run {run_id} is {was}, not shard {given}: a resumed "
                                "run keeps its part (leave --commbench-shard out)")
    name, name_where = lookup(config, "run_name")
    if name is not None and name != recorded_name:
        raise pytest.UsageError(f"{name_where}: run {run_id} is named {recorded_name!r}, not "
                                f"{name!r}: a resumed run keeps its name")
    return recorded, recorded_name


def _check_writable(path: Path, what: str, where: str) -> None:
    """A usage error, before any item runs, where the run cannot write `path` (a folder it
    makes and writes into): the nearest folder of it that exists must take a new folder
    (one is made there and removed at once; nothing is left behind, even when collecting)."""
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(f"{existing} is not a folder")
        import tempfile

        os.rmdir(tempfile.mkdtemp(prefix=".commbench-probe-", dir=existing))
    except OSError as exc:
        raise pytest.UsageError(
            f"{where}: the {what} {path} cannot be written ({exc.__class__.__name__}: "
            f"{exc.strerror or exc}); give a folder this user can write to") from None


def create(config: pytest.Config) -> CommbenchState:
    root = config.rootpath
    workerinput = getattr(config, "workerinput", None)
    given_seed = setting(config, "seed")
    runs_dir = Path(setting(config, "runs_dir")).expanduser()
    if not runs_dir.is_absolute():
        runs_dir = root / runs_dir
    if not (workerinput and "commbench_seed" in workerinput):  # (a worker's run is made)
        _check_writable(runs_dir, "runs folder", lookup(config, "runs_dir")[1])
    model_name, model_where = lookup(config, "model")
    platform_name, platform_where = lookup(config, "platform")
    if platform_name == "auto":
        platform_name = detect()
    model = _make(config, "model", model_name, model_where)
    platform = _make(config, "platform", platform_name, platform_where)
    profile = platform.profile
    if profile is not None and profile.name not in PROFILES:
        config.issue_config_time_warning(pytest.PytestConfigWarning(
            f"no profile of the benchmark describes this machine's {profile.model}: platform "
            f"{profile.name} is made from its own properties ({profile.arch}, "
            f"{profile.gpus_per_node} GPUs, {profile.interconnect}; features "
            f"{', '.join(sorted(profile.features))}) and runs the {profile.vendor} tasks whose "
            "requirements it meets"), stacklevel=2)
    per_gpu, per_gpu_where = lookup(config, "ranks_per_gpu")
    if int(per_gpu) > 1:
        if not platform.has_gpus:
            raise pytest.UsageError(
                f"{per_gpu_where}: ranks per GPU is a placement of GPU platforms; platform "
                f"{platform.name} has no GPUs")
        platform.place(int(per_gpu), int(lookup(config, "jobs_per_gpu")[0]))
    platform.node_placement = _placement(config)
    if lookup(config, "compile_only")[0]:
        platform.compile_only = True  # nothing runs: a platform without its devices still builds
    tk, tk_where = lookup(config, "thunderkittens")
    if tk:
        from .toolchains.nvidia import THUNDERKITTENS_ENV, thunderkittens_include

        os.environ[THUNDERKITTENS_ENV] = str(Path(tk).expanduser().resolve())
        if thunderkittens_include() is None:
            raise pytest.UsageError(f"{tk_where}: no ThunderKittens headers (kittens.cuh) in "
                                    f"{tk} or its include/ folder")
    resume_upto = None
    worker = bool(workerinput and "commbench_seed" in workerinput)
    if worker:
        seed = workerinput["commbench_seed"]
        run_id = workerinput["commbench_run_id"]
        run_dir = Path(workerinput["commbench_run_dir"])
        resume_upto = workerinput.get("commbench_resume_upto")
        shard = _shard_given(workerinput.get("commbench_shard"))
        run_name = workerinput.get("commbench_run_name")
        run_lock = RunLock(run_dir)  # joined at the worker's first line (see below)
        config.add_cleanup(run_lock.release)
    else:
        resume, resume_where = lookup(config, "resume")
        if resume:
            run_dir = _resume_dir(config, runs_dir, resume, resume_where)
            run_id = run_dir.name
            run_lock = RunLock(run_dir)
            config.add_cleanup(run_lock.release)
            try:
                run_lock.hold()  # before the log is touched: one session per run folder
            except RunBusy as exc:
                raise pytest.UsageError(f"{resume_where}: run {run_id} cannot be resumed now: "
                                        f"{exc}") from None
            except OSError as exc:
                raise pytest.UsageError(f"{resume_where}: run {run_id} cannot be resumed: its "
                                        f"folder cannot be locked ({exc})") from None
            seed, info = _resumed_seed(run_dir, given_seed, resume_where)
            shard, run_name = _resumed_shard(config, run_id, info)
            for key, now in (("model", model.name), ("platform", platform.name)):
                if info.get(key) not in (None, now):
                    raise pytest.UsageError(
                        f"{resume_where}: run {run_id} is of {key} {info[key]!r}, not {now!r}")
            log = ResultsLog(run_dir / "results.jsonl")
            log.end_cleanly()
            resume_upto = log.path.stat().st_size if log.path.exists() else 0
        else:
            seed = given_seed if given_seed is not None else secrets.randbits(48)
            run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
            run_dir = runs_dir / run_id
            run_lock = RunLock(run_dir)  # taken when the run's file is written
            config.add_cleanup(run_lock.release)
            shard, run_name = _fresh_shard(config)
    # the run's own runs folder: a resumed run (given by its path) keeps using the replies
    # kept beside it, whatever --commbench-runs-dir says now (a worker: its controller's)
    runs_dir = run_dir.parent
    scratch = setting(config, "scratch")
    work_dir = (Path(scratch).expanduser() / run_id if scratch else run_dir) / "work"
    if not worker:
        _check_writable(work_dir, "folder of the run's jobs",
                        lookup(config, "scratch")[1] if scratch else
                        lookup(config, "runs_dir")[1])
    build_cache = setting(config, "build_cache")
    build_dir = Path(build_cache).expanduser() if build_cache else run_dir / "build"
    if build_cache and not worker:
        _check_writable(build_dir, "build cache", lookup(config, "build_cache")[1])
    from .platforms import NAMES
    from .tasks import VENDORS

    state = CommbenchState(
        config=config,
        model=model,
        platform=platform,
        seed=int(seed),
        run_id=run_id,
        run_dir=run_dir,
        runs_dir=runs_dir,
        work_dir=work_dir,
        build_dir=build_dir,
        references=root / setting(config, "references"),
        suites=root / setting(config, "suites"),
        settings=RunSettings.from_options(lambda name: setting(config, name)),
        log=ResultsLog(run_dir / "results.jsonl",
                       # a worker shares its controller's hold from its first line on
                       before_write=run_lock.join if worker else None),
        resume_upto=resume_upto,
        run_lock=run_lock,
        shard=shard,
        run_name=run_name,
    )
    agent_name, agent_where = lookup(config, "agent")
    if agent_name and agent_name.strip().lower() not in ("off", "none"):
        state.agent = _make(config, "agent", agent_name.strip(), agent_where)
    state.known_platforms = KnownNames(
        NAMES, platform.name,
        lambda name: config.hook.pytest_commbench_make_platform(config=config, name=name) is not None)
    state.known_vendors = KnownNames(
        {*VENDORS, *(p.vendor for p in PROFILES.values())}, platform.vendor)
    return state
