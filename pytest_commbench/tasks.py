"""The task manifest (`task.toml`): schema, validation and the Task object built from it.

A bad manifest raises ManifestError naming the file and the key, so collection can show one
clear line instead of a traceback.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import sys
from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .profiles import NAMES, PROFILES

MANIFEST = "task.toml"

CATEGORIES = ("p2p", "collective", "ep", "fusion", "utility")
LIBRARIES = (
    "cuda-runtime", "nccl", "nccl-device", "nvshmem", "ibverbs", "mscclpp", "deepep",
    "thunderkittens", "vllm", "sglang", "cupy", "torch", "mpi", "hip-runtime", "rccl",
)
DIFFICULTIES = ("easy", "medium", "hard")
SETUPS = ("bare-metal", "library-based")
LANGUAGES = {"python": ".py", "cuda": ".cu", "hip": ".hip", "c++": ".cpp", "c": ".c"}
BETTER = ("higher", "lower")
# how bytes are counted for bandwidth metrics, as nccl-tests does
BYTES_RULES = ("busbw", "algbw", "none")
# what the harness sets up for a solution before the first call (see rank/gpu.py)
# what the rank harness sets up for a task; "host-exchange": the C ABI's host helpers
# (ctx->allgather/broadcast/barrier) work in every call, not only in set-up calls
FIXTURES = ("nccl", "ipc", "nvshmem", "host-exchange", "torch")
# GPU vendors a manifest's `vendors` may name (with those of the platform profiles)
VENDORS = ("amd", "intel", "nvidia")
DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8")
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
            "int8": 1, "uint8": 1}
MAX_COUNT = 1 << 31  # elements of one size
MAX_BUFFER_BYTES = 1 << 34  # one rank's buffer of one size: 16 GiB
MAX_CASE_BYTES = 1 << 36  # one buffer of one size over all ranks (the controller holds it): 64 GiB
# bounds on what a manifest may ask for (a hostile or mistyped one must not take the session's
# memory or time before any item runs): docs/writing-tasks.md lists them
MAX_MANIFEST_BYTES = 1 << 20  # a task.toml
MAX_SIZES = 64  # entries of `sizes`
MAX_RANKS_LIST = 16  # entries of `ranks`
MAX_WORLD = 4096  # ranks of one job
MAX_TRIALS = 64  # `check.trials`
MAX_TIMEOUT_S = 24 * 3600.0  # `timeout`
MAX_STRINGS = 256  # entries of a list of names (`forbid`, `requires`, `platforms`...)
MAX_PARAMS_BYTES = 1 << 16  # `check.params`, as JSON
# whether a task's ranks may span nodes (`nodes`): "one" (every rank on one node: the task
# uses what only one node has, CUDA or HIP IPC, NVLink, NVSHMEM's load/store, symmetric
# memory, or says nothing) or "any" (its ranks talk only through MPI or a network library,
# NCCL, RCCL, torch.distributed: they may be on several nodes; marker `span_nodes`)
NODES = ("one", "any")
SPAN_MARKER = "span_nodes"
#: what only one node has: a task that requires or is given one of these runs on one node
ONE_NODE_REQUIRES = ("cuda-ipc", "hip-ipc", "nvlink")
ONE_NODE_FIXTURES = ("ipc",)


class ManifestError(Exception):
    """A task.toml that cannot be used; the message names the file and the key."""

    def __init__(self, path: Path, key: str, message: str) -> None:
        self.path, self.key = path, key
        super().__init__(f"{path}: key '{key}': {message}")


def _marker(kind: str, value: str) -> str:
    return f"{kind}_{value.replace('-', '_').replace('+', 'p')}"


def marker_names() -> list[str]:
    """Every marker a task can carry (each value a manifest may name), for registering them."""
    return [_marker(kind, value) for kind, values in (
        ("category", CATEGORIES), ("library", LIBRARIES), ("difficulty", DIFFICULTIES),
        ("setup", SETUPS), ("tier", TIERS)) for value in values] + [SPAN_MARKER]


@dataclass(frozen=True)
class CheckSpec:
    op: str
    dtypes: tuple[str, ...]
    rtol: float
    atol: float
    params: dict[str, Any] = field(default_factory=dict)
    trials: int = 2
    # the last trial makes one rank late (its inputs written, and on a GPU uploaded, only at
    # its own gate): a solution must not touch a peer's buffers before that peer's call began
    late_rank: bool = True
    # the stress phase (calls back to back, a rank held back before some) runs for the task
    stress: bool = True


@dataclass(frozen=True)
class MetricSpec:
    name: str
    unit: str
    better: str
    bytes: str


@dataclass(frozen=True)
class Task:
    """One benchmark task: what a model is shown and how the harness runs it."""

    dir: Path
    relpath: str  # path below the suites root, e.g. "collective/ring_allreduce"
    title: str
    category: str
    library: str
    difficulty: str
    setup: str
    language: str
    entry: str
    platforms: tuple[str, ...]
    vendors: tuple[str, ...]
    ranks: tuple[int, ...]
    requires: tuple[str, ...]
    timeout: float
    sizes: tuple[int, ...]
    forbid: tuple[str, ...]
    fixtures: tuple[str, ...]
    workspace: int  # bytes of IPC-shared device workspace per rank (0: none)
    check: CheckSpec
    metric: MetricSpec
    template: Path
    prompt: Path
    # the CommBench paper's example this task corresponds to ("example049_..."), if any:
    # coverage of the paper is counted from it
    upstream: str = ""
    # the method (how an expert would go about it), shown to a model only when a run asks
    # for hints: the prompt is the contract (`hints.md` beside the manifest, or `hints = ...`)
    hints: Path | None = None
    # the answer owns the set-up (buffers, IPC exchange, flag layout): the harness hands it
    # only its inputs, outputs and the set-up helpers
    own_setup: bool = False
    # "any": its ranks may span nodes (a placement over nodes spreads them); "one": every
    # rank of a job on one node (see NODES)
    nodes: str = "one"

    @property
    def spans_nodes(self) -> bool:
        return self.nodes == "any"

    @property
    def name(self) -> str:
        return self.dir.name

    @property
    def suffix(self) -> str:
        return LANGUAGES[self.language]

    def markers(self) -> list[str]:
        """Marker names for -m selection (hyphens become underscores)."""
        return [_marker("category", self.category), _marker("library", self.library),
                _marker("difficulty", self.difficulty), _marker("setup", self.setup),
                _marker("tier", "own-setup" if self.own_setup else "harness-setup"),
                *([SPAN_MARKER] if self.spans_nodes else [])]


# who sets the world up: the harness (buffers mapped, workspace laid out: the answer fills in
# the communication) or the answer (it allocates, registers and exchanges what it needs over
# the set-up helpers, as a library does)
TIERS = ("harness-setup", "own-setup")

_TOP_KEYS = {
    "title", "category", "library", "difficulty", "setup", "language", "entry", "platforms",
    "vendors", "ranks", "requires", "timeout", "sizes", "forbid", "check", "metric", "template",
    "prompt", "fixtures", "workspace", "upstream", "hints", "tier", "nodes",
}
_CHECK_KEYS = {"op", "dtypes", "rtol", "atol", "params", "trials", "late_rank", "stress"}
_METRIC_KEYS = {"name", "unit", "better", "bytes"}


class _Reader:
    def __init__(self, path: Path, data: dict[str, Any], prefix: str = "") -> None:
        self.path, self.data, self.prefix = path, data, prefix

    def fail(self, key: str, message: str) -> ManifestError:
        return ManifestError(self.path, self.prefix + key, message)

    def unknown(self, allowed: set[str]) -> None:
        for key in sorted(self.data):
            if key not in allowed:
                raise self.fail(key, f"unknown key (allowed: {', '.join(sorted(allowed))})")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.data:
            if default is ...:
                raise self.fail(key, "missing")
            return default
        value = self.data[key]
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.fail(key, f"expected {_kind_name(kind)}, got a boolean")
        if not isinstance(value, kind):
            raise self.fail(key, f"expected {_kind_name(kind)}, got {type(value).__name__}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: Any = ...) -> str:
        value = self.get(key, str, default)
        if value not in choices:
            raise self.fail(key, f"{value!r} is not one of {', '.join(choices)}")
        return value

    def strings(self, key: str, default: Any = ..., choices: Container[str] | None = None,
                what: str = ""):
        value = self.get(key, list, default)
        if len(value) > MAX_STRINGS:
            raise self.fail(key, f"{len(value)} entries, more than {MAX_STRINGS}")
        for v in value:
            if not isinstance(v, str) or not v:
                raise self.fail(key, "expected a list of non-empty strings")
            if choices is not None and v not in choices:
                if what:
                    raise self.fail(key, f"{v!r} is not a known {what} (known: "
                                         f"{', '.join(sorted(choices))})")
                raise self.fail(key, f"{v!r} is not one of {', '.join(choices)}")
        return tuple(value)

    def number(self, key: str, default: Any = ..., minimum: float = 0.0,
               inclusive: bool = True) -> float:
        value = float(self.get(key, (int, float), default))
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            raise self.fail(key, f"must be a finite number {'>=' if inclusive else '>'} "
                                 f"{minimum:g}, got {value}")
        return value

    def ints(self, key: str, minimum: int, default: Any = ...) -> tuple[int, ...]:
        value = self.get(key, list, default)
        if not value:
            raise self.fail(key, "must not be empty")
        for v in value:
            if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
                raise self.fail(key, f"expected a list of integers >= {minimum}")
        return tuple(value)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a table"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _workspace(top: _Reader) -> int:
    value = top.get("workspace", int, 0)
    if value < 0 or value > 1 << 34:
        raise top.fail("workspace", "bytes must be between 0 and 16 GiB")
    return value


def _task_file(top: _Reader, task_dir: Path, key: str, default: str) -> Path:
    """A file the manifest names (`template`, `prompt`): a relative path inside the task's
    folder, with no "..", that is a file and, links resolved, still lies inside the folder
    (a link out of it could serve the hidden reference as the template)."""
    name = top.get(key, str, default)
    pure = PurePosixPath(name)
    if not name.strip() or "\x00" in name or "\\" in name:
        raise top.fail(key, f"{name!r} is not a file name")
    if pure.is_absolute() or name.startswith("~"):
        raise top.fail(key, f"{name!r} is an absolute path: a task's files lie in its folder")
    if ".." in pure.parts:
        raise top.fail(key, f"{name!r} climbs out of the task's folder ('..')")
    path = task_dir / name
    try:
        real, root = path.resolve(strict=True), task_dir.resolve(strict=True)
    except (OSError, RuntimeError):
        raise top.fail(key, f"file {name} does not exist beside the manifest") from None
    if real != root and root not in real.parents:
        raise top.fail(key, f"{name!r} leads to {real}, outside the task's folder {root} "
                            "(a symbolic link)")
    if not real.is_file():
        raise top.fail(key, f"file {name} does not exist beside the manifest")
    return path


def _sizes(top: _Reader, dtypes: tuple[str, ...], ranks: tuple[int, ...]) -> tuple[int, ...]:
    """The sizes (elements per rank), each bounded: at most MAX_COUNT elements, a rank's
    buffer at most MAX_BUFFER_BYTES and one buffer over all ranks at most MAX_CASE_BYTES
    in the task's widest dtype (the controller makes every rank's inputs and the oracle's
    answer)."""
    sizes = top.ints("sizes", 0)
    if len(sizes) > MAX_SIZES:
        raise top.fail("sizes", f"{len(sizes)} sizes, more than the {MAX_SIZES} a task may have")
    width = max((ITEMSIZE.get(d, 8) for d in dtypes), default=8)
    world = max(ranks)
    for count in sizes:
        if count > MAX_COUNT:
            raise top.fail("sizes", f"{count} elements is more than the {MAX_COUNT} (2^31) a "
                                    "size may have")
        if count * width > MAX_BUFFER_BYTES:
            raise top.fail("sizes", f"{count} elements of {width} bytes is "
                                    f"{count * width / 2**30:.1f} GiB per rank, more than "
                                    f"{MAX_BUFFER_BYTES >> 30} GiB")
        if count * width * world > MAX_CASE_BYTES:
            raise top.fail("sizes", f"{count} elements of {width} bytes at {world} ranks is "
                                    f"{count * width * world / 2**30:.1f} GiB per buffer, more "
                                    f"than {MAX_CASE_BYTES >> 30} GiB")
    return sizes


def load_task(manifest: Path, suites_root: Path, platforms: Container[str] | None = None,
              vendors: Container[str] | None = None) -> Task:
    """Read and validate one task.toml. `platforms` and `vendors` are the names its lists may
    hold (default: the built-in platforms and the known vendors)."""
    manifest = Path(manifest)
    platforms = NAMES if platforms is None else platforms
    vendors = (tuple(sorted({*VENDORS, *(p.vendor for p in PROFILES.values())}))
               if vendors is None else vendors)
    try:
        if manifest.stat().st_size > MAX_MANIFEST_BYTES:
            raise ManifestError(manifest, "<file>", f"larger than {MAX_MANIFEST_BYTES} bytes "
                                                    "(no task needs that much)")
        data = tomllib.loads(manifest.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(manifest, "<toml>", f"not valid TOML: {exc}") from None
    except RecursionError:
        raise ManifestError(manifest, "<toml>", "arrays or tables nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise ManifestError(manifest, "<file>", f"not UTF-8 text: {exc}") from None
    except OSError as exc:
        raise ManifestError(manifest, "<file>", f"cannot read: {exc}") from None
    top = _Reader(manifest, data)
    top.unknown(_TOP_KEYS)
    task_dir = manifest.parent

    language = top.choice("language", tuple(LANGUAGES))
    template = _task_file(top, task_dir, "template", "template" + LANGUAGES[language])
    prompt = _task_file(top, task_dir, "prompt", "prompt.md")
    hints = (_task_file(top, task_dir, "hints", "hints.md")
             if "hints" in data or (task_dir / "hints.md").exists() else None)

    check_data = top.get("check", dict)
    chk = _Reader(manifest, check_data, "check.")
    chk.unknown(_CHECK_KEYS)
    from .checks import known_ops  # late: checks import numpy

    op = chk.get("op", str)
    if op not in known_ops():
        raise chk.fail("op", f"unknown operation {op!r} (known: {', '.join(sorted(known_ops()))})")
    rtol = chk.number("rtol", 0.0)
    atol = chk.number("atol", 0.0)
    trials = chk.get("trials", int, 2)
    if not 1 <= trials <= MAX_TRIALS:
        raise chk.fail("trials", f"must be 1 to {MAX_TRIALS}, got {trials}")
    params = chk.get("params", dict, {})
    try:
        params_bytes = len(json.dumps(params))
    except (TypeError, ValueError, RecursionError):
        raise chk.fail("params", "must be a table of plain values") from None
    if params_bytes > MAX_PARAMS_BYTES:
        raise chk.fail("params", f"{params_bytes} bytes as JSON, more than {MAX_PARAMS_BYTES}")
    check = CheckSpec(
        op=op,
        dtypes=chk.strings("dtypes", ("float64",), DTYPES),
        rtol=rtol,
        atol=atol,
        params=dict(params),
        trials=trials,
        late_rank=chk.get("late_rank", bool, True),
        stress=chk.get("stress", bool, True),
    )

    met = _Reader(manifest, top.get("metric", dict), "metric.")
    met.unknown(_METRIC_KEYS)
    metric = MetricSpec(
        name=met.get("name", str),
        unit=met.get("unit", str),
        better=met.choice("better", BETTER),
        bytes=met.choice("bytes", BYTES_RULES, "none"),
    )

    timeout = top.number("timeout", 60, minimum=0, inclusive=False)
    if timeout > MAX_TIMEOUT_S:
        raise top.fail("timeout", f"{timeout:g} s is more than {MAX_TIMEOUT_S:g} s (a day)")
    entry = top.get("entry", str)
    if not entry.isidentifier():
        raise top.fail("entry", f"{entry!r} is not a function name")
    # the task's place in the suite as the suite names it: a task folder linked in from
    # elsewhere keeps the category of the folder it is linked into
    relpath = task_dir.name
    for inside, root in ((Path(os.path.abspath(task_dir)), Path(os.path.abspath(suites_root))),
                         (task_dir.resolve(), suites_root.resolve())):
        try:
            relpath = inside.relative_to(root).as_posix()
            break
        except ValueError:
            continue
    ranks = top.ints("ranks", 1)
    if len(ranks) > MAX_RANKS_LIST or max(ranks) > MAX_WORLD:
        raise top.fail("ranks", f"at most {MAX_RANKS_LIST} world sizes of at most {MAX_WORLD} "
                                "ranks each")
    sizes = _sizes(top, check.dtypes, ranks)
    requires = top.strings("requires", ())
    fixtures = top.strings("fixtures", (), FIXTURES)
    workspace = _workspace(top)
    nodes = top.choice("nodes", NODES, "one")
    one_node = sorted({*requires} & {*ONE_NODE_REQUIRES} | {*fixtures} & {*ONE_NODE_FIXTURES})
    if nodes == "any" and (one_node or workspace):
        what = ", ".join(one_node) or f"workspace = {workspace} (an IPC-shared device area)"
        raise top.fail("nodes", f"\"any\" for a task that uses what only one node has "
                                f"({what}): its ranks share memory, so they stay on one node")
    return Task(
        dir=task_dir,
        relpath=relpath,
        title=top.get("title", str),
        category=top.choice("category", CATEGORIES),
        library=top.choice("library", LIBRARIES),
        difficulty=top.choice("difficulty", DIFFICULTIES),
        setup=top.choice("setup", SETUPS),
        language=language,
        entry=entry,
        platforms=top.strings("platforms", ..., platforms, "platform"),
        vendors=top.strings("vendors", (), vendors, "vendor"),
        ranks=ranks,
        requires=requires,
        timeout=float(timeout),
        sizes=sizes,
        forbid=top.strings("forbid", ()),
        fixtures=fixtures,
        workspace=workspace,
        check=check,
        metric=metric,
        template=template,
        prompt=prompt,
        upstream=_upstream(top),
        hints=hints,
        own_setup=top.choice("tier", TIERS, "harness-setup") == "own-setup",
        nodes=nodes,
    )


@functools.cache
def commbench_examples() -> dict[int, str]:
    """The CommBench repository's example directories by number (data/commbench_examples.txt)."""
    text = (Path(__file__).parent / "data" / "commbench_examples.txt").read_text()
    names = [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]
    return {int(name[7:10]): name for name in names}


def _upstream(top: _Reader) -> str:
    value = top.get("upstream", str, "")
    if not value:
        return value
    known = commbench_examples()
    if value in known.values():
        return value
    m = re.match(r"example(\d{3})", value)
    hint = (f" (example {m.group(1)} is {known[int(m.group(1))]!r})"
            if m and int(m.group(1)) in known else "")
    raise top.fail("upstream", f"{value!r} is not an example of the CommBench repository{hint}")


def load_suite(root: Path) -> tuple[list[Task], list[str]]:
    """Every task below a suites root, in path order, and the messages of the manifests that
    do not load (the listings and tools that walk a whole suite)."""
    tasks, errors = [], []
    for manifest in sorted(Path(root).rglob(MANIFEST)):
        try:
            tasks.append(load_task(manifest, root))
        except ManifestError as exc:
            errors.append(str(exc))
    return tasks, errors


def task_hash(task: Task, references: Path) -> str:
    """A digest of everything that makes the task what it is: its folder (manifest, prompt,
    template and any file they name), its hidden reference, and the oracle's code (the check
    module of its op and the checks' shared base). Results of a task whose hash differs were
    measured against another task, and reports keep them apart."""
    return _task_hash(str(task.dir), str(Path(references) / task.relpath), task.check.op)


@functools.cache
def _task_hash(task_dir: str, ref_dir: str, op: str) -> str:
    import hashlib

    from . import checks

    digest = hashlib.sha256()

    def add(label: str, path: Path) -> None:
        try:
            data = path.read_bytes()
        except OSError:
            data = b"(unreadable)"
        digest.update(f"{label}\0{len(data)}\0".encode())
        digest.update(data)

    for root, label in ((Path(task_dir), "task"), (Path(ref_dir), "reference")):
        if root.is_dir():
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                if "__pycache__" not in path.parts:
                    add(f"{label}/{path.relative_to(root).as_posix()}", path)
    try:
        module = sys.modules[type(checks.get(op)).__module__]
        files = {Path(module.__file__), Path(checks.__file__).with_name("base.py")}
    except (KeyError, AttributeError, TypeError):
        files = set()
    for path in sorted(files):
        add(f"oracle/{path.name}", path)
    return digest.hexdigest()[:16]
