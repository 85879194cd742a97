"""The prompt a model gets for a task: the task's own prompt, the platform it will run on,
the file to complete and the contract of its editable regions. Nothing from the reference,
the mutants or the seed."""

from __future__ import annotations

from typing import Any

from ..regions import parse
from ..tasks import Task

FENCE = {"cuda": "cuda", "python": "python"}
PLATFORM_KEYS = ("platform", "gpu", "gpu_count", "interconnect", "gpu0_gpu1_link", "cuda",
                 "driver", "nccl", "nvshmem", "mpi", "mpi4py", "cupy", "numpy", "python", "cpu")


def build(task: Task, fingerprint: dict[str, Any]) -> str:
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

## How to answer

Edit only the regions between the marker lines `{comment} >>> COMMBENCH EDIT <name>` and
`{comment} <<< COMMBENCH EDIT` (regions: {', '.join(names)}). Reply with the whole file in one
fenced code block, or with only the regions, each with its two marker lines and your code
between them. Anything changed outside the regions is rejected, and so are calls the task
forbids{_FORBID.get(task.language, ".")}
{_STATE.get(task.language, "")}"""


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
