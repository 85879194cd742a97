"""The prompt a model gets for a task: the task's own prompt, the platform it will run on,
the file to complete and the contract of its editable regions. Nothing from the reference,
the mutants or the seed."""

from __future__ import annotations

import re
from typing import Any

from ..build import INCLUDE_DIR
from ..regions import parse
from ..tasks import Task

FENCE = {"cuda": "cuda", "hip": "cpp", "python": "python"}
PLATFORM_KEYS = ("platform", "gpu", "gpu_count", "interconnect", "gpu0_gpu1_link", "cuda",
                 "driver", "nccl", "nvshmem", "mpi", "mpi4py", "cupy", "numpy", "python", "cpu")


def build(task: Task, fingerprint: dict[str, Any], hints: bool = False) -> str:
    """The first prompt; `hints` adds the task's hints (its `hints.md`: the method, shown only
    when a run asks for it)."""
    template = task.template.read_text(encoding="utf-8")
    names = parse(template).names
    comment = "#" if task.language == "python" else "//"
    machine = "\n".join(f"- {k}: {fingerprint[k]}" for k in PLATFORM_KEYS if k in fingerprint)
    sizes = ", ".join(str(n) for n in task.sizes)
    return f"""# {task.title}

{task.prompt.read_text(encoding="utf-8").strip()}

## Where it runs

The harness runs your solution with {', '.join(str(r) for r in task.ranks)} ranks (one process
per rank{', one GPU each' if task.language == 'cuda' else ''}), on sizes {sizes} (elements), and
compares its time with an expert solution's. This machine:
{machine}

## The file to complete: `{task.template.name}`

```{FENCE.get(task.language, '')}
{template.rstrip()}
```

{headers(template)}## How to answer

Edit only the regions between the marker lines `{comment} >>> COMMBENCH EDIT <name>` and
`{comment} <<< COMMBENCH EDIT` (regions: {', '.join(names)}). Reply with the whole file in one
fenced code block, or with only the regions, each with its two marker lines and your code
between them. Anything changed outside the regions is rejected, and so are calls the task
forbids{_FORBID.get(_kind(task), ".")}{_always(task)}
{_STATE.get(_kind(task), "")}
{calls(task)}{hints_section(task, hints)}"""


# how the task's `forbid` list is applied
_FORBID = {
    "python": """: a forbidden name may not appear in your code as a name it uses (a call, an
attribute, an import, a keyword argument or a string); names it only defines, such as the
function you complete, do not count. Calls made some other way are refused while it runs.""",
    "cuda": """: a forbidden function may not be among the symbols the built library uses,
and one called some other way (looked up at run time) ends the rank.""",
}


# what a solution may keep between calls, and what every call must do itself
_STATE = {
    "python": """
Your code lives in the regions. It may import modules, define helpers and keep state from
one call to the next (buffers, communicators or requests set up on the first call, kept in a
module-level dict through `globals()`), and it may start threads. But every call must do its
own work: each call gets fresh inputs (never a repeat or a shift of earlier ones), and its
outputs must be complete when it returns; work left to a thread after the return is outside
the call and its outputs are checked as they are at that moment.
""",
    "cuda": """
Your code lives in the regions. It may define kernels and helpers and keep state from one
call to the next (buffers or handles set up once, in static variables), but every call must
do its own work: each call gets fresh inputs (never a repeat or a shift of earlier ones), and
its outputs must be complete once the rank's whole device is idle after the call returns.
""",
}


def refinement(task: Task, round_: int, previous: str, feedback: str) -> str:
    """What a later round adds: the previous answer and what the harness said about it."""
    return f"""
## Round {round_}: your previous answer and what the harness found

Your previous answer (round {round_ - 1}):

{previous.strip() or '(empty)'}

The harness's verdict on it:

```
{feedback.strip()}
```

Answer again, in the same form: correct first, then fast.
"""


def headers(template: str) -> str:
    """The harness's own headers the template includes (the C ABI of the call, the set-up
    helpers' signatures): part of the contract, so shown whole."""
    shown = []
    for name in re.findall(r'^\s*#\s*include\s*"([^"/]+)"', template, re.M):
        path = INCLUDE_DIR / name
        if path.is_file() and name not in shown:
            shown.append(name)
    return "".join(f"""## The harness's header `{name}` (included by the template)

```cpp
{(INCLUDE_DIR / name).read_text(encoding="utf-8").rstrip()}
```

""" for name in shown)


def _always(task: Task) -> str:
    """What every compiled answer may not use besides the task's own list (build.py's
    native_forbid), said where it applies: a failure for it is never an unstated rule."""
    if _kind(task) != "cuda":
        return ""
    lookups = (" Where the task forbids anything, the built library may not look functions "
               "up at run time either (`dlopen`, `dlsym`, `cuGetProcAddress`, "
               "`cudaGetDriverEntryPoint*`)." if task.forbid else "")
    return (f"{lookups} No answer may use CUPTI (`cupti*`), the Python C API (`Py*`), MPI's "
            "dynamic processes, or NVLink multicast (`cuMulticast*`, `multimem`).")


def _kind(task: Task) -> str:
    """The prompt's wording for the task's language: compiled (cuda, hip) or python."""
    return "python" if task.language == "python" else "cuda"


def calls(task: Task) -> str:
    """How the harness calls and checks every task's answer: the ordering and ownership rules
    its checks enforce, stated once for all tasks (a task's prompt adds its own)."""
    held = ("""
- **One call at a time, one rank late.** The first calls of every size are made one at a time
  (every rank's call begins together). In some of them one rank's call begins a few
  milliseconds after the others', and that rank's inputs are put in place (and its outputs
  poisoned) only then: until a rank's call has begun, its buffers belong to its caller, so no
  rank may read a peer's inputs or write a peer's outputs before that peer's call has begun.
  Each rank's outputs are taken the moment its own call is complete (its call returned and
  its device idle), not when the last rank is done: a rank may not leave its outputs for a
  peer to finish later.""" if task.check.late_rank else """
- **One call at a time.** The first calls of every size are made one at a time, every rank's
  call beginning together.""")
    device = " on the host or on its device" if task.language != "python" or _on_gpu(task) else ""
    first = ("\n  In the first call of every size one rank, chosen at random, may have its stream"
             "\n  held back on its device after its call has begun." if _on_gpu(task) else "")
    return f"""
## How every call is made and checked

- Every call is made on all ranks, with fresh random inputs (never a repeat or a shift of
  earlier ones); every output is poisoned (NaN, or the integer minimum) before the call and
  compared after it with an independent oracle: bit for bit where data is only moved, within
  the rounding of the reduction where values are summed.{held}
- **Inputs are taken back at completion.** The moment a rank's call is complete (its call
  returned and its device idle), its inputs are its caller's again and are overwritten at
  once: no peer may read them after that.{first}
- **Calls back to back.** Then, at every size that fits, several calls are made in a row on
  every rank with no synchronization between them (as a training loop makes them), each on
  buffers of its own, with one rank, chosen at random, held back{device} before some of
  them; every output of every call is checked. Whatever your code keeps from one call to
  the next (flags, counters, scratch data, connections) must stay right when a peer is a
  call or more ahead of or behind this rank.
- The timed calls are checked too, on fresh inputs. A call that never ends is a timeout.
"""


def _on_gpu(task: Task) -> bool:
    return any(p != "cpu" for p in task.platforms)


def hints_section(task: Task, hints: bool) -> str:
    """The task's hints (how an expert would go about it), only when asked for."""
    if not hints or task.hints is None:
        return ""
    return f"""
## Hints

{task.hints.read_text(encoding="utf-8").strip()}
"""
