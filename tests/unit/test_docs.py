"""The README and the docs hold what the plugin does: every `pytest` and `commbench` command a
page shows names only real options with valid values (pytest's own parser with the plugin
loaded, the `commbench` parser), the cheap ones run, relative links and their anchors resolve,
every page starts with its purpose and a link back to the README, and the options page lists
every registered option and subcommand (it is made from the option table and the parser)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_commbench import optionsdoc
from pytest_commbench.cli import build_parser, write_section
from pytest_commbench.models.builtin import BUILTIN_NAMES
from pytest_commbench.models.registry import names as registry_names
from pytest_commbench.platforms import GENERIC, NAMES

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]
#: what the README's quick start says, word for word (CI runs the second; tools/walk-through
#: the first)
QUICK_START = ('python3 -m venv .venv && .venv/bin/pip install -e ".[mpi]" && .venv/bin/pytest',
               'python3 -m venv .venv && .venv/bin/pip install -e ".[mpi,test]" && '
               '.venv/bin/pytest tests/unit tests/e2e -n auto')
#: `commbench` subcommands cheap enough to run for real (read-only, seconds)
CHEAP = {"tasks", "doctor", "models", "prompt"}


def _rel(page: Path) -> str:
    return str(page.relative_to(REPO))


def code_lines(text: str) -> list[str]:
    """The lines of a page's code blocks: fenced (shell or unnamed) and indented by four."""
    out: list[str] = []
    fence: str | None = None
    previous_blank = True
    in_indented = False
    for line in text.splitlines():
        stripped = line.strip()
        if fence is not None:
            if stripped.startswith("```"):
                fence = None
            elif fence in ("", "sh", "bash", "shell", "console"):
                out.append(stripped)
            continue
        if stripped.startswith("```"):
            fence = stripped[3:].strip()
            continue
        if line.startswith("    ") and (previous_blank or in_indented):
            in_indented = True
            out.append(stripped)
        elif stripped:
            in_indented = False
        previous_blank = not stripped
    return out


def commands() -> list[tuple[str, list[str]]]:
    """(page, argv) of every `pytest ...` and `commbench ...` command the pages show: lines
    joined at a trailing backslash, a `$ ` prompt, comments, environment assignments and
    `.venv/bin/` dropped, split at `&&`, `;` and `|`; `[--opt X]` read as `--opt X`. The
    options page's usage lines are `text` blocks: made by the parser, not commands."""
    found: list[tuple[str, list[str]]] = []
    for page in PAGES:
        joined: list[str] = []
        for line in code_lines(page.read_text(encoding="utf-8")):
            if joined and joined[-1].endswith("\\"):
                joined[-1] = joined[-1][:-1] + " " + line
            else:
                joined.append(line)
        for line in joined:
            line = line.removeprefix("$ ")
            line = re.sub(r"(?<=\s)\[([^\[\]]*)\]", r"\1", line)  # `[--world 4]`: optional
            # a shell's expansions in a batch script: arithmetic gives a number, a variable a
            # value the page cannot name (its checks are left to the parsers)
            line = re.sub(r"\$\(\([^()]*\)\)", "1", line)
            line = re.sub(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*", SHELL_VALUE, line)
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue
            part: list[str] = []
            for word in [*words, "&&"]:
                if word not in ("&&", "|", ";", "||"):
                    part.append(word)
                    continue
                while part and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", part[0]):
                    part.pop(0)
                if part:
                    part[0] = part[0].removeprefix(".venv/bin/")
                if part and part[0] in ("pytest", "commbench"):
                    found.append((_rel(page), part))
                part = []
    return found


SHELL_VALUE = "shell-value"  # what a shell variable of a page's script stands for


def _check_value(option: str, value: str) -> str | None:
    """What is wrong with a model or platform named on a page (the parsers take any text)."""
    if SHELL_VALUE in value:
        return None
    if option.endswith("platform"):
        known = {"auto", *NAMES, *GENERIC.values()}
        return None if value in known else f"unknown platform {value!r}"
    if option.endswith("model"):
        known = {*BUILTIN_NAMES, *registry_names()}
        if value in known or value.startswith(("dir:", "openai:", "anthropic:")):
            return None
        return f"unknown model {value!r}"
    return None


def _named_values(argv: list[str]) -> list[tuple[str, str]]:
    out = []
    for i, word in enumerate(argv):
        name, eq, value = word.partition("=")
        if name in ("--platform", "--commbench-model", "--commbench-platform"):
            if not eq and i + 1 < len(argv):
                value = argv[i + 1]
            out.append((name, value))
    return out


def test_the_pages_show_commands_at_all():
    found = commands()
    pages = {page for page, _ in found}
    assert {"README.md", "docs/running.md", "docs/models.md", "docs/platforms.md",
            "docs/reports.md", "docs/agent.md", "docs/options.md"} <= pages, pages
    assert sum(1 for _, argv in found if argv[0] == "commbench") >= 10


def test_every_pytest_command_of_the_docs_names_real_options(pytester):
    """Parsed by pytest's own parser with the plugin (and xdist) loaded: an unknown option or a
    value the option's parser refuses (a choice, a number) fails with the page and command."""
    problems = []
    for page, argv in commands():
        if argv[0] != "pytest":
            continue
        try:
            pytester.parseconfig(*argv[1:])
        except (pytest.UsageError, SystemExit) as exc:
            problems.append(f"{page}: {' '.join(argv)}: {exc}")
        for option, value in _named_values(argv):
            why = _check_value(option, value)
            if why:
                problems.append(f"{page}: {' '.join(argv)}: {why}")
    assert not problems, "\n".join(problems)


def test_every_commbench_command_of_the_docs_parses():
    """Parsed by the `commbench` parser itself: subcommand, options, choices, types."""
    problems = []
    for page, argv in commands():
        if argv[0] != "commbench":
            continue
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                build_parser().parse_args(argv[1:])
        except SystemExit as exc:
            if exc.code not in (0, None):  # --help exits 0
                problems.append(f"{page}: {' '.join(argv)}: {err.getvalue().strip()}")
        for option, value in _named_values(argv):
            why = _check_value(option, value)
            if why:
                problems.append(f"{page}: {' '.join(argv)}: {why}")
    assert not problems, "\n".join(problems)


def test_the_cheap_commbench_commands_of_the_docs_run():
    """`commbench --help` and the read-only commands the pages show (tasks, doctor, models,
    prompt) run from the repository root, each within a minute, without a traceback;
    doctor's exit status 1 means only that nothing can run here."""
    runs = [["commbench", "--help"]]
    runs += [argv for _, argv in commands()
             if argv[0] == "commbench" and len(argv) > 1 and argv[1] in CHEAP]
    seen: set[tuple[str, ...]] = set()
    started = time.monotonic()
    for argv in runs:
        if tuple(argv) in seen:
            continue
        seen.add(tuple(argv))
        done = subprocess.run([sys.executable, "-m", "pytest_commbench.cli", *argv[1:]],
                              cwd=REPO, capture_output=True, text=True, timeout=60)
        allowed = (0, 1) if argv[1] == "doctor" else (0,)
        assert done.returncode in allowed and "Traceback" not in done.stderr, \
            (argv, done.returncode, done.stderr[-2000:])
        assert done.stdout.strip(), argv
    assert {"tasks", "doctor", "models"} <= {a[1] for a in seen}
    assert time.monotonic() - started < 300


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    out: set[str] = set()
    counts: dict[str, int] = {}
    fence = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("```"):
            fence = not fence
        if fence or not line.startswith("#"):
            continue
        slug = _slug(line.lstrip("#"))
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_relative_links_and_their_anchors_resolve():
    problems = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                problems.append(f"{_rel(page)}: {target}: no {dest}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{_rel(page)}: {target}: no heading #{anchor} in {dest.name}")
    assert not problems, "\n".join(problems)


def test_every_page_says_its_purpose_and_links_back_and_the_readme_lists_every_page():
    readme = README.read_text(encoding="utf-8")
    for page in DOCS:
        lines = page.read_text(encoding="utf-8").splitlines()
        assert lines[0].startswith("# "), page.name
        head = " ".join(lines[1:8])
        first = head.strip().split(". ")[0]
        assert len(first) > 20, (page.name, first)  # a purpose, not a bare link
        assert "](../README.md)" in head, f"{page.name} does not link back to the README"
        assert f"](docs/{page.name})" in readme, f"the README does not list {page.name}"
    assert "## Contents" in readme


def test_the_readme_keeps_its_two_quick_start_commands_word_for_word():
    lines = README.read_text(encoding="utf-8").splitlines()
    for command in QUICK_START:
        assert f"    {command}" in lines
    walk = (REPO / "tools" / "walk-through").read_text()
    pattern = re.search(r"grep -m1 -E '(.+?)' README.md", walk).group(1)
    first = next(x for x in lines if re.search(pattern, x))
    assert first.strip() == QUICK_START[0]  # what the walk-through runs
    assert "pytest --commbench-model=kimi --platform=mi325x -n 4 --junitxml=out.xml" in \
        README.read_text(encoding="utf-8")  # the design card's command


def test_the_options_page_is_what_the_option_table_and_the_parser_make(tmp_path):
    page = REPO / "docs" / "options.md"
    copy = tmp_path / "options.md"
    copy.write_text(page.read_text(encoding="utf-8"))
    for name, text in optionsdoc.sections().items():
        write_section(copy, name, text)
    assert copy.read_text() == page.read_text(encoding="utf-8"), \
        "docs/options.md is stale: python -m pytest_commbench.optionsdoc docs/options.md"


def test_every_registered_option_and_subcommand_is_on_the_options_page():
    """What `pytest --help` and `commbench --help` list, each on the page: the flags, the ini
    keys and the subcommands, as the running plugin registers them."""
    text = (REPO / "docs" / "options.md").read_text(encoding="utf-8")
    shown = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
                           cwd=REPO, capture_output=True, text=True, timeout=120).stdout
    flags = set(re.findall(r"(--commbench-[a-z0-9-]+|--platform)[=\s]", shown))
    inis = set(re.findall(r"^\s+(commbench_[a-z0-9_]+) \(", shown, re.M))
    assert len(flags) > 30 and len(inis) > 30
    for flag in flags:
        assert f"`{flag}" in text, flag
    for ini in inis:
        assert f"`{ini}`" in text, ini
    usage = subprocess.run([sys.executable, "-m", "pytest_commbench.cli", "--help"],
                           capture_output=True, text=True, timeout=60).stdout
    subcommands = re.search(r"\{([a-z,]+)\}", usage).group(1).split(",")
    assert len(subcommands) > 8
    for name in subcommands:
        assert f"### commbench {name}\n" in text, name
