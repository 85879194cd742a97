"""The option table: every option of the plugin once, with its parser, default and help.

An option is `--commbench-<name>` (or `--platform`) on the command line, `COMMBENCH_<NAME>` in
the environment and `commbench_<name>` in the ini file; `option_sources.lookup` reads them in
that order, each through the table's parser. `pytest --help` (plugin.py) and docs/options.md
(optionsdoc.py) are written from this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from . import option_values as values
from .platforms import GENERIC, NAMES, PROFILES


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
    Option("model", values.text, "reference", MODEL_DESC),
    Option("platform", values.text, "auto", PLATFORM_DESC),
    Option("seed", values.integer, None, SEED_DESC),
    Option("timeout", values.seconds, None, TIMEOUT_DESC),
    Option("runs_dir", values.text, ".commbench/runs", RUNS_DESC),
    Option("scratch", values.text, None, SCRATCH_DESC),
    Option("build_cache", values.text, None, BUILD_CACHE_DESC),
    Option("resume", values.text, None, RESUME_DESC),
    Option("rounds", values.positive_count, 1, ROUNDS_DESC),
    Option("timing_rounds", values.positive_count, 2, TIMING_ROUNDS_DESC),
    Option("timing_max_rounds", values.positive_count, 6, MAX_ROUNDS_DESC),
    Option("timing_precision", values.fraction, 0.03, PRECISION_DESC),
    Option("timing_contended", values.choice("stop", "continue"), "stop", CONTENDED_DESC),
    Option("reps", values.count, 10, REPS_DESC),
    Option("warmup", values.count, 2, WARMUP_DESC),
    Option("timing_budget", values.nonnegative_seconds, 0.25, BUDGET_DESC, aliases=("budget",)),
    Option("max_reps", values.count, 200, MAX_REPS_DESC),
    Option("timing_wall", values.nonnegative_seconds, 2.5, WALL_DESC),
    Option("check_only", values.flag, False, CHECK_ONLY_DESC, flag=True),
    Option("compile_only", values.flag, False, COMPILE_ONLY_DESC, flag=True),
    Option("keep", values.flag, False, KEEP_DESC, flag=True),
    Option("shard", values.shard, None, SHARD_DESC),
    Option("run_name", values.run_name, None, RUN_NAME_DESC),
    Option("shared_node", values.flag, False, SHARED_NODE_DESC, flag=True),
    Option("ranks_per_gpu", values.positive_count, 1, RANKS_PER_GPU_DESC),
    Option("jobs_per_gpu", values.positive_count, 1, JOBS_PER_GPU_DESC),
    Option("gpu_batch", values.flag, False, GPU_BATCH_DESC, flag=True),
    Option("stress", values.count, 6, STRESS_DESC),
    Option("sanitizer", values.choice("auto", "off", "memcheck", "racecheck", "synccheck",
                                      "initcheck"), "off", SANITIZER_DESC),
    Option("thunderkittens", values.text, None, THUNDERKITTENS_DESC),
    Option("unsandboxed", values.flag, False, UNSANDBOXED_DESC, flag=True),
    Option("launcher", values.text, None, LAUNCHER_DESC),
    Option("hostfile", values.text, None, HOSTFILE_DESC),
    Option("ranks_per_node", values.positive_count, None, RANKS_PER_NODE_DESC),
    Option("base_url", values.text, None, BASE_URL_DESC),
    Option("models_file", values.text, None, MODELS_FILE_DESC),
    Option("regenerate", values.flag, False, REGENERATE_DESC, flag=True),
    Option("request_timeout", values.seconds, 900.0, REQUEST_TIMEOUT_DESC),
    Option("max_tokens", values.positive_count, None, MAX_TOKENS_DESC),
    Option("samples", values.positive_count, 1, SAMPLES_DESC),
    Option("temperature", values.number(float, 0, True, "a temperature"), None, TEMPERATURE_DESC),
    Option("budget_usd", values.number(float, 0, False, "US dollars"), None, BUDGET_USD_DESC),
    Option("agent", values.text, None, AGENT_DESC),
    Option("max_debug", values.positive_count, 3, MAX_DEBUG_DESC),
    Option("knowledge", values.on_off, "on", KNOWLEDGE_DESC),
    Option("hints", values.flag, False, HINTS_DESC, flag=True),
    Option("retrieval", values.on_off, "off", RETRIEVAL_DESC),
    Option("references", values.text, "references", "hidden references root (default: {default})",
           cli=False),
    Option("suites", values.text, "suites", "suites root, to name tasks by relative path "
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
