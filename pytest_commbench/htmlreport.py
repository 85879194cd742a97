"""The leaderboard as a static site a person can click through (`commbench report --html DIR`).

Built from a board (`leaderboard.build`) alone, with the models' kept replies where they are
found, and readable from the file system with no network: every page carries its own style and
script, nothing is fetched. Pages:

- `index.html`: the leaderboard (intervals, tiers; click a column to sort), Pass x GM drawn
  with its intervals (one colour per model, the same on every page), the task x model matrix
  coloured by verdict and band, and each model's failure anatomy;
- `tasks/<task>.html`: per model and world size, the verdict, its message and evidence, the
  speedup with its interval, the per-size figures, the rounds (verdict and speedup of each),
  tokens, cost, date and the endpoint asked, the run's fingerprint, and the reply judged
  (the scored round's, highlighted with Pygments);
- `models/<model>.html`: the model's failure anatomy and every item it was judged on.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .leaderboard import (
    Board,
    Entry,
    anatomy_columns,
    fingerprint_line,
    leaderboard_rows,
)
from .leaderboard.text import _dash
from .models.conversation import sample_folder
from .record import ResultLine, Size
from .report import _num, _pct, bandwidths, model_colours, money
from .scoring import FAST_P, outcomes, record_band

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 78em;
       padding: 0 1em; color: #222; }
h1, h2, h3 { font-weight: 600; } h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0; } td, th { padding: .25em .6em;
  border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } th.sortable { cursor: pointer; } td.num { text-align: right;
  font-variant-numeric: tabular-nums; white-space: nowrap; }
a { color: #1a5fb4; text-decoration: none; } a:hover { text-decoration: underline; }
.v-pass { background: #d7f0d2; } .v-pass.b-Better { background: #9fd89a; }
.v-pass.b-Degraded, .v-pass.b-Severely-degraded { background: #eef5c8; }
.v-wrong_answer, .v-tampered, .v-forbidden { background: #f7c9c9; }
.v-compile_error, .v-runtime_error, .v-timeout, .v-aborted { background: #f9dcc0; }
.v-no_solution, .v-truncated { background: #e6e0f0; }
.v-skipped, .v-infra_error, .v-none { background: #eee; color: #777; }
.muted { color: #777; } .swatch { display: inline-block; width: .8em; height: .8em;
  margin-right: .35em; border-radius: 2px; vertical-align: baseline; }
pre { background: #f7f7f7; padding: .6em; overflow-x: auto; white-space: pre-wrap; }
.reply pre { white-space: pre; } .item { border-top: 2px solid #ccc; margin-top: 1.5em; }
"""

SORT_SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.classList.add("sortable");
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.from(body.rows);
      var up = th.dataset.dir !== "up"; th.dataset.dir = up ? "up" : "down";
      function key(r) { var c = r.cells[col]; var v = c.dataset.sort !== undefined ?
        c.dataset.sort : c.textContent; var n = parseFloat(v); return isNaN(n) ? v : n; }
      rows.sort(function (a, b) { var x = key(a), y = key(b);
        if (typeof x === "number" && typeof y === "number") return up ? x - y : y - x;
        return up ? String(x).localeCompare(String(y)) : String(y).localeCompare(String(x)); });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""


def slug(name: str) -> str:
    """A file name for a task or model."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "x"


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _iv(lo: float | None, hi: float | None, pct: bool) -> str:
    if lo is None or hi is None:
        return ""
    f = _pct if pct else _num
    return f' <span class="muted">[{f(lo)}, {f(hi)}]</span>'


def _page(title: str, body: str, depth: int = 0) -> str:
    home = "../" * depth + "index.html"
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{STYLE}{_pygments_css()}</style></head>"
            f"<body><nav><a href=\"{home}\">leaderboard</a></nav><h1>{_e(title)}</h1>{body}"
            f"<script>{SORT_SCRIPT}</script></body></html>\n")


def _pygments_css() -> str:
    from pygments.formatters import HtmlFormatter

    return HtmlFormatter(style="default").get_style_defs(".highlight")


def _cell_class(r: ResultLine | None) -> str:
    if r is None:
        return "v-none"
    band = record_band(r).replace(" ", "-") if r.passed else ""
    return f"v-{slug(r.verdict)}" + (f" b-{band}" if band else "")


def _short(r: ResultLine | None) -> str:
    if r is None:
        return "not run"
    if r.passed and r.result.speedup is not None:
        return f"pass {r.result.speedup:.2f}x"
    return r.verdict


def _item(r: ResultLine) -> str:
    """An item's row key: its task and world size."""
    world = "?" if r.item.world is None else r.item.world
    return f"{r.item.task or r.item.nodeid} np{world}"


# -- the reply ----------------------------------------------------------------------------------

def scored_round(r: ResultLine) -> int:
    """The round whose answer a record's verdict and speedup are: as refinement keeps it, the
    fastest passing round (the first of equals), else the last; a record of no history had
    one round. The kept replies may hold later rounds (another run's, with more rounds)."""
    history = [h for h in r.result.round_history or () if isinstance(h.round, int)]
    if not history:
        return 1
    best = None
    for h in history:
        if h.passed and (best is None or (h.speedup or 0) > (best.speedup or 0)):
            best = h
    return int((best or history[-1]).round)


def reply_path(r: ResultLine, replies: Callable[[ResultLine], Path | None]) -> Path | None:
    """The kept reply a record was judged on: its scored round's (an agent run's: the step
    it stands by)."""
    root = replies(r)
    if root is None or not r.item.task:
        return None
    model = str(r.item.model or "") + ("+hints" if r.item.hints else "")
    folder = sample_folder(root, model, str(r.item.task), r.item.sample or 0)
    if r.item.agent:
        from .agent import standing_answer

        return standing_answer(folder / str(r.item.agent))
    path = folder / f"r{scored_round(r)}" / "reply.md"
    return path if path.is_file() else None


def highlight_reply(text: str) -> str:
    """A reply as HTML: its code blocks highlighted by their fence's language (Pygments), the
    prose between them as it is."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import TextLexer, get_lexer_by_name
    from pygments.util import ClassNotFound

    out, at = [], 0
    for m in re.finditer(r"^```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)^```[ \t]*$", text, re.M | re.S):
        if m.start() > at:
            out.append(f"<pre>{_e(text[at:m.start()].strip())}</pre>")
        try:
            lexer = get_lexer_by_name(m.group(1).lower()) if m.group(1) else TextLexer()
        except ClassNotFound:
            lexer = TextLexer()
        out.append(highlight(m.group(2), lexer, HtmlFormatter()))
        at = m.end()
    rest = text[at:].strip()
    if rest:
        out.append(f"<pre>{_e(rest)}</pre>")
    return "".join(out)


# -- pages --------------------------------------------------------------------------------------

def _colours(board: Board) -> dict[str, str]:
    return model_colours([e.label for e in board.entries])


def _swatch(colour: str) -> str:
    return f'<span class="swatch" style="background:{colour}"></span>'


def _leaderboard(board: Board, colours: dict[str, str]) -> str:
    head = ("<tr><th>rank</th><th>tier</th><th>model</th><th>tasks</th><th>pass</th>"
            "<th>Pass Rate</th><th>PASS+Good</th><th>GM-Speedup</th><th>Pass x GM</th>"
            "<th>$/task</th>" + "".join(f"<th>fast_{p:g}</th>" for p in FAST_P) + "</tr>")
    rows = []
    for row, e in zip(leaderboard_rows(board), board.entries):
        cells = [f'<td class="num">{_e(_dash(row.rank))}</td>',
                 f'<td class="num">{_e(_dash(row.tier))}</td>',
                 f'<td data-sort="{_e(e.label)}">{_swatch(colours[e.label])}'
                 f'<a href="models/{slug(e.label)}.html">{_e(e.label)}</a></td>',
                 f'<td class="num">{row.tasks}</td>', f'<td class="num">{row.passes}</td>']
        for metric, pct in (("pass_rate", True), ("pass_good", True), ("gm_speedup", False),
                            ("pass_x_gm", False)):
            value = getattr(row, metric)
            shown = _pct(value) if pct else _num(value)
            cells.append(f'<td class="num" data-sort="{-1 if value is None else value}">'
                         f'{shown}{_iv(*(row.interval(metric) or (None, None)), pct)}</td>')
        price = row.price
        cells.append(f'<td class="num" data-sort="{-1 if price is None else price}">'
                     f'{"-" if price is None else f"{price:.4f}"}</td>')
        for p in FAST_P:
            value = row.fast_p(p)
            cells.append(f'<td class="num" data-sort="{-1 if value is None else value}">'
                         f'{_pct(value)}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<table class="sortable" id="leaderboard"><thead>{head}</thead><tbody>'
            + "".join(rows) + "</tbody></table>")


def _figure(board: Board, colours: dict[str, str]) -> str:
    """Pass x GM per model as an SVG bar chart: each bar with its 90% interval and its count
    of passes; a zero bar is drawn as a line at the axis so it is seen."""
    entries = board.entries
    if not entries:
        return ""
    top = max([1.0] + [(e.intervals.pass_x_gm or [0, 0])[1] or 0 for e in entries]
              + [e.scores.pass_x_gm or 0 for e in entries])
    bar, gap, height, left = 40, 56, 180, 40
    width = left + len(entries) * (bar + gap) + gap

    def y(v: float) -> float:
        return 10 + height * (1 - v / top)

    parts = [f'<svg id="pass-x-gm" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height + 60}" role="img" aria-label="Pass x GM per model">',
             f'<line x1="{left}" y1="{y(0)}" x2="{width}" y2="{y(0)}" stroke="#888"/>',
             f'<text x="4" y="{y(top) + 4}" font-size="11">{top:.2f}</text>',
             f'<text x="4" y="{y(0) + 4}" font-size="11">0</text>']
    for i, e in enumerate(entries):
        x = left + gap + i * (bar + gap)
        v = e.scores.pass_x_gm or 0.0
        h = max(y(0) - y(v), 1.5)
        parts.append(f'<rect x="{x}" y="{y(0) - h}" width="{bar}" height="{h}" '
                     f'fill="{colours[e.label]}"><title>{_e(e.label)}: {v:.3f}</title></rect>')
        iv = e.intervals.pass_x_gm
        if iv:
            cx = x + bar / 2
            parts.append(f'<line x1="{cx}" y1="{y(iv[0])}" x2="{cx}" y2="{y(iv[1])}" '
                         'stroke="#222"/>')
        parts.append(f'<text x="{x + bar / 2}" y="{y(0) - h - 4}" font-size="11" '
                     f'text-anchor="middle">{e.scores.passes}/{e.scores.applicable}</text>')
        name = e.label if len(e.label) <= 16 else e.label[:15] + "\u2026"
        parts.append(f'<text x="{x + bar / 2}" y="{y(0) + 16}" font-size="10" '
                     f'text-anchor="middle">{_e(name)}<title>{_e(e.label)}</title></text>')
    parts.append("</svg>")
    return "".join(parts)


def _matrix(board: Board) -> str:
    """Items x entries; an entry with several samples of an item shows how many passed. Items
    every entry skipped are left out (counted under the table)."""
    items: dict[str, dict[str, list[ResultLine]]] = {}
    for e in board.entries:
        for r in e.solutions:
            items.setdefault(_item(r), {}).setdefault(e.label, []).append(r)
    skipped = [k for k, by in items.items()
               if all(r.verdict == "skipped" for rs in by.values() for r in rs)]
    head = "<tr><th>task</th>" + "".join(
        f'<th><a href="models/{slug(e.label)}.html">{_e(e.label)}</a></th>'
        for e in board.entries) + "</tr>"
    rows = []
    for key in sorted(set(items) - set(skipped)):
        some = next(iter(items[key].values()))[0]
        task = str(some.item.task or key)
        cells = [f'<td><a href="tasks/{slug(task)}.html">{_e(key)}</a></td>']
        for e in board.entries:
            rs = items[key].get(e.label) or []
            if len(rs) > 1:
                passed = [r for r in rs if r.passed]
                shown, r = f"{len(passed)}/{len(rs)} pass", (passed or rs)[0]
            else:
                r = rs[0] if rs else None
                shown = _short(r)
            title = _e("; ".join(x.result.message for x in rs if x.result.message))
            cells.append(f'<td class="{_cell_class(r)}" title="{title[:300]}" '
                         f'data-sort="{_e(shown)}">{_e(shown)}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    note = (f'<p class="muted">{len(skipped)} items skipped for every model (not shown).</p>'
            if skipped else "")
    return (f'<table class="sortable" id="matrix"><thead>{head}</thead><tbody>'
            + "".join(rows) + "</tbody></table>" + note)


def _anatomy_table(entries: list[Entry], table_id: str) -> str:
    shown = anatomy_columns(entries)
    head = "<tr><th>model</th>" + "".join(f"<th>{_e(o)}</th>" for o in shown) + "</tr>"
    rows = []
    for e in entries:
        counts = outcomes(e.solutions)
        cells = "".join(f'<td class="num">{counts.get(o, 0)}</td>' for o in shown)
        rows.append(f'<tr><td><a href="{"" if table_id == "model-anatomy" else "models/"}'
                    f'{slug(e.label)}.html">{_e(e.label)}</a></td>{cells}</tr>')
    return (f'<table class="sortable" id="{table_id}"><thead>{head}</thead><tbody>'
            + "".join(rows) + "</tbody></table>")


def index_page(board: Board, command: str = "") -> str:
    colours = _colours(board)
    body = [f"<p>{_e(fingerprint_line(board.fingerprint))}</p>"]
    if command:
        body.append(f"<p class=\"muted\">{_e(command)}</p>")
    body += ["<h2>Leaderboard</h2>",
             "<p>Ranked by Pass x GM; 90% intervals in brackets; a tier changes where "
             "adjacent intervals separate; fast_p: the share of the tasks that pass with a "
             "speedup above p. Click a column to sort.</p>",
             _leaderboard(board, colours),
             "<h2>Pass x GM</h2>", _figure(board, colours),
             "<h2>Tasks x models</h2>",
             "<p>Each item's verdict (a pass with its speedup), coloured by verdict and, for "
             "a pass, its band. Click a task for every model's answer and evidence.</p>",
             _matrix(board),
             "<h2>Failure anatomy</h2>", _anatomy_table(board.entries, "anatomy")]
    if board.unranked:
        body += ["<h2>Not ranked</h2>", "<p>Runs of no solution (the checker's mutants).</p>",
                 _anatomy_table(board.unranked, "unranked")]
    return _page("CommBench leaderboard", "".join(body))


def _sizes_table(sizes: Iterable[Size | Mapping[str, Any]]) -> str:
    """Per size both sides' times and, for a bandwidth metric, their algbw and busbw (as
    nccl-tests prints them; busbw where the task names it), and the speedup."""
    sizes = [Size.of(s) for s in sizes]
    if not sizes:
        return ""
    bw = any(bandwidths(s)[0] is not None for s in sizes)
    head = ("<tr><th>count</th><th>dtype</th><th>bytes</th><th>reference us</th>"
            "<th>solution us</th>"
            + ("<th>algbw GB/s (ref / sol)</th><th>busbw GB/s (ref / sol)</th>" if bw else "")
            + "<th>speedup</th></tr>")

    def pair(s: Size, which: int) -> str:
        ref, sol = bandwidths(s, "ref")[which], bandwidths(s)[which]
        return f'<td class="num">{_num(ref, 2)} / {_num(sol, 2)}</td>'

    rows = "".join(
        f'<tr><td class="num">{_e(s.count)}</td><td>{_e(s.dtype)}</td>'
        f'<td class="num">{_e(s.bytes)}</td><td class="num">{_num(s.t_ref_us, 2)}</td>'
        f'<td class="num">{_num(s.t_sol_us, 2)}</td>'
        + (pair(s, 0) + pair(s, 1) if bw else "")
        + f'<td class="num">{_num(s.speedup)}</td></tr>' for s in sizes)
    return f'<table class="sizes"><thead>{head}</thead><tbody>{rows}</tbody></table>'


def _evidence(r: ResultLine, replies: Callable[[ResultLine], Path | None],
              board_fp: dict) -> str:
    a = r.result
    parts = [f'<p>verdict <span class="{_cell_class(r)}">{_e(r.verdict)}</span>']
    if a.speedup is not None:
        ci = a.speedup_ci90 or (None, None)
        parts.append(f" &middot; speedup {_num(a.speedup)}{_iv(ci[0], ci[1], False)}")
        band = record_band(r)
        if band:
            parts.append(f" &middot; {_e(band)}")
        if a.timing_trust:
            parts.append(f" &middot; timing {_e(a.timing_trust)}")
    if a.rounds and a.round_history:
        parts.append(f" &middot; passed in round {_e(a.round)}" if a.round
                     else f" &middot; {len(a.round_history)} rounds")
        if a.round and scored_round(r) != a.round:
            parts.append(f" &middot; judged: round {scored_round(r)} (its fastest pass)")
    parts.append("</p>")
    if a.message:
        parts.append(f"<p>{_e(a.message)}</p>")
    if a.detail:
        parts.append(f"<details><summary>evidence</summary><pre>{_e(a.detail)}</pre></details>")
    if a.output:
        parts.append(f"<details><summary>output</summary><pre>{_e(a.output)}</pre></details>")
    parts.append(_sizes_table(a.sizes))
    parts.append(_history_table(r))
    parts.append(_asked(r))
    fp = r.fingerprint
    parts.append(f'<p class="muted">run {_e(r.item.run)}, seed {_e(r.seed)}'
                 + (f": {_e(fingerprint_line(fp))}" if fp and fp != board_fp else "") + "</p>")
    path = reply_path(r, replies)
    if path is not None:
        text = path.read_text(errors="replace")
        parts.append(f'<details class="reply" open><summary>reply ({_e(path.parent.name)}, '
                     f"the answer judged)</summary>{highlight_reply(text)}</details>")
    return "".join(parts)


def _history_table(r: ResultLine) -> str:
    """Each refinement round (or agent iteration) with its verdict and speedup."""
    history = r.result.round_history or ()
    if not history:
        return ""
    agent = bool(r.item.agent)
    head = ("<tr><th>" + ("iteration" if agent else "round") + "</th>"
            + ("<th>step</th>" if agent else "") + "<th>verdict</th><th>speedup</th>"
            "<th>message</th></tr>")
    rows = "".join(
        f'<tr><td class="num">{_e(h.round)}</td>'
        + (f"<td>{_e(h.role)}</td>" if agent else "")
        + f'<td class="v-{slug(str(h.verdict or "aborted"))}">{_e(h.verdict)}'
        f'</td><td class="num">{_num(h.speedup)}</td>'
        f'<td>{_e(str(h.message or "")[:200])}</td></tr>' for h in history)
    return f'<table class="rounds"><thead>{head}</thead><tbody>{rows}</tbody></table>'


def _asked(r: ResultLine) -> str:
    """What answering cost and where it was asked: tokens, cost (unknown where no price was
    had), when the item ended, and the endpoints its requests went to (a registry name
    pointed at another server shows that server)."""
    usage = r.result.usage
    facts = []
    if usage.tokens_in or usage.tokens_out:
        facts.append(f"tokens {int(usage.tokens_in or 0):,} in / "
                     f"{int(usage.tokens_out or 0):,} out")
    facts.append(f"cost {money(usage.cost if usage.known else None)}"
                 + (" (replayed: kept from an earlier request)" if usage.replayed else ""))
    when = r.finished or r.started
    if when:
        facts.append(f"{'finished' if r.finished else 'started'} {when}")
    endpoints, models = usage.endpoints()
    if endpoints:
        facts.append(f"endpoint {', '.join(endpoints)}"
                     + (f" (model id {', '.join(models)})" if models else ""))
    return f'<p class="asked">{" &middot; ".join(_e(f) for f in facts)}</p>'


def task_page(task: str, board: Board, replies: Callable[[ResultLine], Path | None]) -> str:
    colours = _colours(board)
    body, first = [], None
    for e in board.entries:
        for r in sorted((r for r in e.solutions if r.item.task == task),
                        key=lambda r: (r.item.world or 0, str(r.item.candidate))):
            first = first or r
            who = e.label + (f" {r.item.candidate}" if r.item.candidate else "")
            body.append(f'<div class="item" id="{slug(who)}-np{_e(r.item.world)}">'
                        f'<h3>{_swatch(colours[e.label])}<a href="../models/{slug(e.label)}'
                        f'.html">{_e(who)}</a>, np{_e(r.item.world)}</h3>'
                        f"{_evidence(r, replies, board.fingerprint)}</div>")
    about = ""
    if first:
        item = first.item
        facts = [item.category, item.library, item.difficulty]
        if item.task_hash:
            facts.append(f"task hash {item.task_hash}")
        about = (f"<p>{_e(item.title)}</p><p class=\"muted\">"
                 + " &middot; ".join(_e(f) for f in facts if f)
                 + f"</p><p class=\"muted\">{_e(fingerprint_line(board.fingerprint))}</p>")
    return _page(task, about + "".join(body), depth=1)


def model_page(entry: Entry) -> str:
    rows = "".join(
        f'<tr><td><a href="../tasks/{slug(str(r.item.task))}.html">{_e(_item(r))}</a></td>'
        f'<td class="{_cell_class(r)}">{_e(_short(r))}</td><td>{_e(r.result.message)[:200]}'
        "</td></tr>" for r in sorted(entry.solutions, key=_item))
    s = entry.scores
    standing = (f"rank {entry.rank}, tier {entry.tier}" if entry.rank is not None
                else "not ranked (no task judged)")
    body = (f"<p>{standing}: Pass Rate {_pct(s.pass_rate)}, "
            f"GM-Speedup {_num(s.gm_speedup)}, Pass x GM {_num(s.pass_x_gm)} over "
            f"{s.applicable} tasks</p><h2>Failure anatomy</h2>"
            + _anatomy_table([entry], "model-anatomy")
            + '<h2>Items</h2><table class="sortable" id="items"><thead><tr><th>item</th>'
              "<th>verdict</th><th>message</th></tr></thead><tbody>" + rows + "</tbody></table>")
    return _page(entry.label, body, depth=1)


def write(board: Board, out: Path, replies: Callable[[ResultLine], Path | None],
          command: str = "") -> list[Path]:
    """Write the site into `out`; returns the pages written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "tasks").mkdir(exist_ok=True)
    (out / "models").mkdir(exist_ok=True)
    written = []

    def put(path: Path, text: str) -> None:
        path.write_text(text, encoding="utf-8")
        written.append(path)

    put(out / "index.html", index_page(board, command))
    tasks = sorted({str(r.item.task) for e in board.entries for r in e.solutions
                    if r.item.task})
    for task in tasks:
        put(out / "tasks" / f"{slug(task)}.html", task_page(task, board, replies))
    for e in [*board.entries, *board.unranked]:
        put(out / "models" / f"{slug(e.label)}.html", model_page(e))
    return written
