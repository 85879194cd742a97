"""Editable regions: parse a template, merge a model's reply, and prove nothing else changed.

A region is

    # >>> COMMBENCH EDIT body          (// for C-like languages)
    ...what the model writes...
    # <<< COMMBENCH EDIT

Marker lines belong to the fixed text, so a solution that drops or renames a marker is
tampered with, exactly like one that edits the harness around it.

Lines are what the compiler sees: text breaks only at \\n, \\r\\n and \\r (as Python's tokenizer
and C compilers do), never at the other characters `str.splitlines` breaks at (form feed,
vertical tab, \\x1c-\\x1e, \\x85, \\u2028, \\u2029), which would let a solution hide a fixed line
inside a comment the checker believed ended before it. And a region must end where its end
marker stands: the markers of a solution must be real comments at the same nesting as the
template's (not inside a string, a block comment, an open bracket or an `#if`), and a Python
region may not dedent below its markers (which would take the fixed text after it into a
block of its own).
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass

from .verdicts import Rejected, Verdict

BEGIN = re.compile(r"^[ \t]*(#|//)[ \t]*>>> COMMBENCH EDIT[ \t]+(?P<name>[A-Za-z0-9_.-]+)[ \t]*$")
END = re.compile(r"^[ \t]*(#|//)[ \t]*<<< COMMBENCH EDIT[ \t]*$")
FENCE_OPEN = re.compile(r"^```[^`]*$")
FENCE_CLOSE = re.compile(r"^```[ \t]*$")
# a reply longer than this is no solution: no task's solution is near it, and a reply of tens
# of megabytes must not cost the harness its memory or time
MAX_REPLY_CHARS = 1_000_000
# what may trail a line without changing it (Python and C both take these for blanks)
TRAILING_BLANKS = " \t\f"
BOM = "\ufeff"  # a UTF-8 byte order mark, as a reply read as text begins with it


class RegionSyntaxError(ValueError):
    """Markers that do not pair up."""


@dataclass(frozen=True)
class Parsed:
    fixed: tuple[str, ...]  # len(regions) + 1 pieces of fixed text, markers included
    names: tuple[str, ...]
    bodies: tuple[str, ...]


def _newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _lines(text: str) -> list[str]:
    """Lines as the compiler sees them, each ending in "\\n" (but perhaps the last)."""
    parts = _newlines(text).split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def parse(text: str) -> Parsed:
    fixed, names, bodies = [], [], []
    current: list[str] = []
    body: list[str] | None = None
    for number, line in enumerate(_lines(text), 1):
        begin = BEGIN.match(line.rstrip("\n"))
        if begin:
            if body is not None:
                raise RegionSyntaxError(f"line {number}: region opened inside region {names[-1]!r}")
            current.append(line)
            fixed.append("".join(current))
            names.append(begin.group("name"))
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
    return [line.rstrip("\n").rstrip(TRAILING_BLANKS) for line in _lines(text)]


def fill(template: str, bodies: dict[str, str]) -> str:
    """The template with the named regions replaced (others keep the template's body)."""
    t = parse(template)
    unknown = set(bodies) - set(t.names)
    if unknown:
        raise KeyError(f"no such region: {', '.join(sorted(unknown))}")
    out = [t.fixed[0]]
    for i, name in enumerate(t.names):
        body = bodies.get(name, t.bodies[i])
        if body and not body.endswith(("\n", "\r")):
            body += "\n"
        out.append(body)
        out.append(t.fixed[i + 1])
    return "".join(out)


def verify(template: str, solution: str) -> None:
    """Raise Rejected(TAMPERED) if the solution differs from the template outside its regions
    (or its regions reach past their end markers); Rejected(COMPILE_ERROR) if a Python solution
    cannot even be split into tokens."""
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
    _same_structure(template, solution)


# -- regions end where their markers stand ---------------------------------------------------

@dataclass(frozen=True)
class _Marker:
    row: int  # 1-based line
    col: int  # where its comment starts
    region: str
    begin: bool
    python: bool  # a "#" marker (else "//")

    def describe(self) -> str:
        return f"the {'start' if self.begin else 'end'} marker of region {self.region!r}"


def _markers(text: str) -> list[_Marker]:
    found, name = [], ""
    for row, line in enumerate(_lines(text), 1):
        line = line.rstrip("\n")
        match = BEGIN.match(line) or END.match(line)
        if match:
            begin = match.re is BEGIN
            name = match.group("name") if begin else name
            col = len(line) - len(line.lstrip(" \t"))
            found.append(_Marker(row, col, name, begin, match.group(1) == "#"))
    return found


# What the compiler sees at a marker: where the marker is ("code" when it is a comment of its
# own in ordinary code), the bracket depth, the #if depth, and what the region before it did
# that it may not (close a bracket or an #if it did not open, dedent below its markers).
State = tuple


def _same_structure(template: str, solution: str) -> None:
    t_marks, s_marks = _markers(template), _markers(solution)
    if not t_marks or len(t_marks) != len(s_marks):
        return
    scan = _python_states if t_marks[0].python else _c_states
    wanted = scan(template, t_marks, strict=False)
    if wanted is None:  # the template itself cannot be read this way: nothing to compare
        return
    got = scan(solution, s_marks, strict=True)
    for mark, want, have in zip(s_marks, wanted, got):
        if have != want:
            raise Rejected(
                Verdict.TAMPERED,
                f"{mark.describe()} (line {mark.row}) is not where the region ends for the "
                f"compiler: {_explain(have, want)}",
                "a region's code must be complete in itself: every string, comment, bracket, "
                "block and #if it opens is closed before its end marker, and it closes none it "
                "did not open",
            )


def _explain(have: State, want: State) -> str:
    if have[0] != "code":
        return f"it is inside {have[0]}"
    if have[3]:
        return have[3]
    if have[1] != want[1]:
        return f"it is inside {have[1] - want[1]} more open bracket(s) than in the template"
    return f"it is inside {have[2] - want[2]} more #if block(s) than in the template"


def _python_states(text: str, marks: list[_Marker], strict: bool) -> list[State] | None:
    comments: dict[int, tuple[int, int]] = {}  # row -> (col, bracket depth) of its comment
    starts: list[tuple[int, int]] = []  # (row, col) of every logical line's first token
    lowest: list[tuple[int, int]] = []  # (row, depth) after every closing bracket
    depth, line_start = 0, True
    try:
        for tok in tokenize.generate_tokens(io.StringIO(_newlines(text)).readline):
            kind = tok.type
            if kind == tokenize.COMMENT:
                comments.setdefault(tok.start[0], (tok.start[1], depth))
            elif kind == tokenize.NEWLINE:
                line_start = True
            elif kind not in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
                if line_start:
                    starts.append(tok.start)
                    line_start = False
                if kind == tokenize.OP and tok.string in ("(", "[", "{"):
                    depth += 1
                elif kind == tokenize.OP and tok.string in (")", "]", "}"):
                    depth -= 1
                    lowest.append((tok.start[0], depth))
    except (tokenize.TokenError, SyntaxError) as exc:
        if not strict:
            return None
        raise Rejected(Verdict.COMPILE_ERROR,
                       f"the solution does not compile: it cannot be split into Python tokens: "
                       f"{exc}") from None
    states: list[State] = []
    for index, mark in enumerate(marks):
        seen = comments.get(mark.row)
        if seen is None or seen[0] != mark.col:
            states.append(("a string or an unfinished statement", 0, 0, ""))
            continue
        problem = ""
        opened = marks[index - 1] if index and not mark.begin else None
        if opened is not None and opened.begin and states[-1][0] == "code":
            entry = states[-1][1]
            inside = range(opened.row + 1, mark.row)
            shallow = [r for r, c in starts if r in inside and c < mark.col]
            # only code after the region can be taken into a block: a region that ends the
            # file (nothing but blank lines and comments after it) may dedent as it likes
            after = any(r > mark.row for r, _c in starts)
            if shallow and after:
                problem = (f"line {shallow[0]} of the region is indented less than its markers "
                           f"(that takes the text after the region into a block of the region's)")
            elif any(r in inside and d < entry for r, d in lowest):
                problem = "the region closes a bracket it did not open"
        states.append(("code", seen[1], 0, problem))
    return states


_C_IDENT = re.compile(r"[A-Za-z_]\w*")
_C_NUMBER = re.compile(r"\.?[0-9](?:[eEpP][+-]|'[0-9A-Za-z_]|[\w.])*")
_C_RAW_OPEN = re.compile(r'"([^()\\\s]{0,16})\(')
_C_BLANK = re.compile(r"[ \t\f\v]+")
_C_PREFIXES = {"u8", "u", "U", "L"}


def _c_states(text: str, marks: list[_Marker], strict: bool) -> list[State]:
    """A C/C++/CUDA lexer just deep enough to see comments, literals, line splices,
    preprocessor conditionals and brackets (what can carry code past a marker)."""
    del strict  # nothing makes this lexer fail: an unterminated literal runs to its line's end
    text = _newlines(text)
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
    at = {line_starts[m.row - 1] + m.col: i for i, m in enumerate(marks)}
    states: list[State] = [("a comment, a literal or a continued line", 0, 0, "")] * len(marks)
    depth = cond = 0
    entry: tuple[int, int] | None = None  # (depth, cond) where the open region began
    problem = ""
    i, n = 0, len(text)
    line_start, directive = True, False
    while i < n:
        c = text[i]
        if c == "\\" and text.startswith("\n", i + 1):  # a line splice: the line goes on
            i += 2
            continue
        if c == "\n":
            line_start, directive = True, False
            i += 1
            continue
        blank = _C_BLANK.match(text, i)
        if blank:
            i = blank.end()
            continue
        if line_start and c == "#":
            line_start, directive = False, True
            name = _C_IDENT.match(text, _C_BLANK.match(text, i + 1).end()
                                  if _C_BLANK.match(text, i + 1) else i + 1)
            word = name.group() if name else ""
            if word in ("else", "elif", "elifdef", "elifndef", "endif") and entry is not None \
                    and cond <= entry[1]:
                problem = problem or "the region closes an #if it did not open"
            if word in ("if", "ifdef", "ifndef"):
                cond += 1
            elif word == "endif":
                cond -= 1
            i += 1
            continue
        line_start = False
        if text.startswith("//", i):
            index = at.get(i)
            if index is not None and not directive:
                mark = marks[index]
                if mark.begin:
                    entry, problem = (depth, cond), ""
                else:
                    entry = None
                states[index] = ("code", depth, cond, "" if mark.begin else problem)
            i = _logical_end(text, i)
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif c == '"' or c == "'":
            i = _literal_end(text, i + 1, c)
        elif c.isdigit() or (c == "." and text[i + 1:i + 2].isdigit()):
            i = _C_NUMBER.match(text, i).end()
        elif c.isalpha() or c == "_":
            word = _C_IDENT.match(text, i)
            j = word.end()
            prefix = word.group()
            raw = _C_RAW_OPEN.match(text, j) if prefix.endswith("R") and \
                (prefix[:-1] in _C_PREFIXES or prefix == "R") else None
            if raw:
                end = text.find(")" + raw.group(1) + '"', raw.end())
                i = n if end < 0 else end + len(raw.group(1)) + 2
            elif prefix in _C_PREFIXES and text[j:j + 1] in ('"', "'"):
                i = _literal_end(text, j + 1, text[j])
            else:
                i = j
        else:
            if not directive and c in "([{":
                depth += 1
            elif not directive and c in ")]}":
                depth -= 1
                if entry is not None and depth < entry[0]:
                    problem = problem or "the region closes a bracket it did not open"
            i += 1
    return states


def _logical_end(text: str, pos: int) -> int:
    """Where the line holding `pos` ends (its newline), following line splices."""
    while True:
        nl = text.find("\n", pos)
        if nl < 0:
            return len(text)
        if text[nl - 1:nl] != "\\":
            return nl
        pos = nl + 1


def _literal_end(text: str, pos: int, quote: str) -> int:
    """Just past the literal whose text starts at `pos` (an unterminated one ends its line)."""
    n = len(text)
    while pos < n:
        ch = text[pos]
        if ch == "\\":
            pos += 2
        elif ch == quote:
            return pos + 1
        elif ch == "\n":
            return pos
        else:
            pos += 1
    return n


# -- model replies ---------------------------------------------------------------------------

def _fenced_blocks(text: str) -> list[str]:
    """The contents of the ``` fenced blocks of a reply (in one pass: a reply of many
    unclosed fences costs linear time)."""
    blocks, current = [], None
    for line in _lines(text):
        bare = line.rstrip("\n")
        if current is None:
            if FENCE_OPEN.match(bare):
                current = []
        elif FENCE_CLOSE.match(bare):
            blocks.append("".join(current))
            current = None
        else:
            current.append(line)
    return blocks


def extract_code(reply: str) -> str:
    """The code in a model's reply: the fenced block(s) holding region markers, else the largest."""
    blocks = _fenced_blocks(reply)
    if not blocks:
        return reply
    with_markers = [b for b in blocks if any(BEGIN.match(x.rstrip("\n")) for x in _lines(b))]
    if with_markers:
        return "\n".join(with_markers)
    return max(blocks, key=len)


def _usable_text(reply: str) -> None:
    if len(reply) > MAX_REPLY_CHARS:
        raise Rejected(Verdict.NO_SOLUTION,
                       f"the reply is {len(reply):,} characters long, more than the "
                       f"{MAX_REPLY_CHARS:,} a solution may have")
    try:
        reply.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Rejected(Verdict.NO_SOLUTION,
                       f"the reply is not valid UTF-8 text (undecodable or surrogate character "
                       f"at position {exc.start})") from None


def merge_reply(template: str, reply: str | None) -> str:
    """Turn a model reply into a full solution file.

    The reply may be the whole file (then it must match the template outside its regions) or
    only the regions (marker lines around each new body). Raises Rejected(NO_SOLUTION) when the
    reply holds nothing usable (empty, not text, absurdly large) and Rejected(TAMPERED) when it
    changes the harness; nothing a reply holds makes it raise anything else.
    """
    if reply is not None and reply.startswith(BOM):
        reply = reply[len(BOM):]  # an encoding mark some writers put first, not text
    if reply is None or not reply.strip():
        raise Rejected(Verdict.NO_SOLUTION, "the reply is empty")
    _usable_text(reply)
    t = parse(template)  # the benchmark's own template: its errors are not the model's
    try:
        return _merge(template, t, reply)
    except RegionSyntaxError as exc:
        raise Rejected(Verdict.TAMPERED, f"region markers broken in the reply: {exc}") from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise Rejected(Verdict.NO_SOLUTION, f"the reply cannot be processed: "
                                            f"{exc.__class__.__name__}: {str(exc)[:200]}") from None


def _merge(template: str, t: Parsed, reply: str) -> str:
    code = extract_code(reply)
    r = parse(code)
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
