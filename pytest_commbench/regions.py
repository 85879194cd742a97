"""Editable regions: parse a template, merge a model's reply, and prove nothing else changed.

A region is

    # >>> COMMBENCH EDIT body          (// for C-like languages)
    ...what the model writes...
    # <<< COMMBENCH EDIT

Marker lines belong to the fixed text, so a solution that drops or renames a marker is
tampered with, exactly like one that edits the harness around it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .verdicts import Rejected, Verdict

BEGIN = re.compile(r"^[ \t]*(#|//)[ \t]*>>> COMMBENCH EDIT[ \t]+(?P<name>[A-Za-z0-9_.-]+)[ \t]*$")
END = re.compile(r"^[ \t]*(#|//)[ \t]*<<< COMMBENCH EDIT[ \t]*$")
FENCE = re.compile(r"^```[^\n`]*\n(.*?)^```[ \t]*$", re.S | re.M)


class RegionSyntaxError(ValueError):
    """Markers that do not pair up."""


@dataclass(frozen=True)
class Parsed:
    fixed: tuple[str, ...]  # len(regions) + 1 pieces of fixed text, markers included
    names: tuple[str, ...]
    bodies: tuple[str, ...]


def _lines(text: str) -> list[str]:
    return text.replace("\r\n", "\n").replace("\r", "\n").splitlines(keepends=True)


def parse(text: str) -> Parsed:
    fixed, names, bodies = [], [], []
    current: list[str] = []
    body: list[str] | None = None
    for number, line in enumerate(_lines(text), 1):
        if BEGIN.match(line.rstrip("\n")):
            if body is not None:
                raise RegionSyntaxError(f"line {number}: region opened inside region {names[-1]!r}")
            current.append(line)
            fixed.append("".join(current))
            names.append(BEGIN.match(line.rstrip("\n")).group("name"))
            current, body = [], []
        elif END.match(line.rstrip("\n")):
            if body is None:
                raise RegionSyntaxError(f"line {number}: region closed but none is open")
            bodies.append("".join(body))
            current, body = [line], None
        elif body is not None:
            body.append(line)
        else:
            current.append(line)
    if body is not None:
        raise RegionSyntaxError(f"region {names[-1]!r} is never closed")
    fixed.append("".join(current))
    if len(set(names)) != len(names):
        raise RegionSyntaxError("two regions share a name")
    return Parsed(tuple(fixed), tuple(names), tuple(bodies))


def _norm(text: str) -> list[str]:
    """Compare fixed text modulo line endings and trailing blanks (never the code itself)."""
    lines = [line.rstrip() for line in _lines(text)]
    return lines


def fill(template: str, bodies: dict[str, str]) -> str:
    """The template with the named regions replaced (others keep the template's body)."""
    t = parse(template)
    unknown = set(bodies) - set(t.names)
    if unknown:
        raise KeyError(f"no such region: {', '.join(sorted(unknown))}")
    out = [t.fixed[0]]
    for i, name in enumerate(t.names):
        body = bodies.get(name, t.bodies[i])
        if body and not body.endswith("\n"):
            body += "\n"
        out.append(body)
        out.append(t.fixed[i + 1])
    return "".join(out)


def verify(template: str, solution: str) -> None:
    """Raise Rejected(TAMPERED) if the solution differs from the template outside its regions."""
    t = parse(template)
    try:
        s = parse(solution)
    except RegionSyntaxError as exc:
        raise Rejected(Verdict.TAMPERED, f"region markers broken: {exc}") from None
    if s.names != t.names:
        raise Rejected(
            Verdict.TAMPERED,
            f"regions are {list(s.names)}, the template has {list(t.names)}",
        )
    for index, (want, got) in enumerate(zip(t.fixed, s.fixed)):
        w, g = _norm(want), _norm(got)
        if index == len(t.fixed) - 1:  # trailing blank lines at the end of file do not count
            while w and not w[-1]:
                w.pop()
            while g and not g[-1]:
                g.pop()
        if w != g:
            for k in range(max(len(w), len(g))):
                a = w[k] if k < len(w) else "<end>"
                b = g[k] if k < len(g) else "<end>"
                if a != b:
                    where = "before the first region" if index == 0 else f"after region {t.names[index - 1]!r}"
                    raise Rejected(
                        Verdict.TAMPERED,
                        f"text outside the editable regions changed ({where}, line {k + 1} of that part)",
                        f"template: {a!r}\nsolution: {b!r}",
                    )


def extract_code(reply: str) -> str:
    """The code in a model's reply: the fenced block(s) holding region markers, else the largest."""
    blocks = FENCE.findall(reply.replace("\r\n", "\n"))
    if not blocks:
        return reply
    with_markers = [b for b in blocks if BEGIN.search(b) or any(BEGIN.match(x) for x in b.splitlines())]
    if with_markers:
        return "\n".join(with_markers)
    return max(blocks, key=len)


def merge_reply(template: str, reply: str | None) -> str:
    """Turn a model reply into a full solution file.

    The reply may be the whole file (then it must match the template outside its regions) or
    only the regions (marker lines around each new body). Raises Rejected(NO_SOLUTION) when the
    reply holds nothing usable and Rejected(TAMPERED) when it changes the harness.
    """
    if reply is None or not reply.strip():
        raise Rejected(Verdict.NO_SOLUTION, "the reply is empty")
    code = extract_code(reply)
    try:
        r = parse(code)
    except RegionSyntaxError as exc:
        raise Rejected(Verdict.TAMPERED, f"region markers broken in the reply: {exc}") from None
    t = parse(template)
    if not r.names:
        raise Rejected(Verdict.NO_SOLUTION, "the reply has no code between COMMBENCH EDIT markers")
    unknown = [n for n in r.names if n not in t.names]
    if unknown:
        raise Rejected(Verdict.TAMPERED, f"the reply has regions the template does not: {unknown}")
    outside = "".join(r.fixed)
    markers_only = all(BEGIN.match(x) or END.match(x) or not x.strip() for x in _norm(outside))
    if markers_only:  # regions only: splice them in
        solution = fill(template, dict(zip(r.names, r.bodies)))
    else:
        solution = code
    verify(template, solution)
    return solution
