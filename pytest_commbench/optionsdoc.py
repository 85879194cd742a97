"""docs/options.md's reference parts, made from the option table and the `commbench` parser
themselves, so the page cannot drift from what the plugin and the CLI accept:

    python -m pytest_commbench.optionsdoc docs/options.md

rewrites the blocks between `<!-- commbench:options -->` and `<!-- commbench:commands -->`
markers; tests/unit/test_docs.py checks that the page holds what this would write."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .options import GROUPS, OPTIONS, flag_name, group_of

OPTIONS_SECTION = "options"
COMMANDS_SECTION = "commands"


def _default(value: object) -> str:
    if value is None:
        return ""
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    return f"; default `{shown}`"


def options_markdown() -> str:
    """Every option of the table, in `pytest --help`'s groups: its flag, ini key, environment
    variable, default and help."""
    lines: list[str] = []
    for group, (title, _names) in GROUPS.items():
        lines += [f"### {group}: {title}", ""]
        for option in OPTIONS:
            if group_of(option.name) != group:
                continue
            ini, env = f"commbench_{option.name}", f"COMMBENCH_{option.name.upper()}"
            if option.cli:
                metavar = "RUN" if option.name == "resume" else option.name.upper()
                value = "" if option.flag else f"={metavar}"
                head = f"- `{flag_name(option.name)}{value}`" + (" (a flag)" if option.flag else "")
                head += f": ini `{ini}`, environment `{env}`"
            else:
                head = f"- ini `{ini}` (no command-line flag), environment `{env}`"
            head += "" if option.flag else _default(option.default)
            if option.aliases:
                head += "; formerly " + ", ".join(
                    f"`{flag_name(a)}` (ini `commbench_{a}`, environment `COMMBENCH_{a.upper()}`)"
                    for a in option.aliases) + ", still read, with a warning"
            lines.append(f"{head}. {option.text}")
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def _shown(action: argparse.Action) -> str:
    """An argument as a usage line shows it."""
    if not action.option_strings:
        name = action.metavar or action.dest.upper()
        return {"?": f"[{name}]", "+": f"{name} [{name} ...]", "*": f"[{name} ...]"}.get(
            str(action.nargs), name)
    flag = max(action.option_strings, key=len)
    if action.nargs == 0:
        return flag
    return f"{flag} {action.metavar or action.dest.upper()}"


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:  # argparse keeps its subcommands nowhere public
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def commands_markdown(parser: argparse.ArgumentParser | None = None) -> str:
    """Every `commbench` subcommand: what it does, its usage and each argument's help."""
    from .cli import build_parser

    parser = parser or build_parser()
    lines: list[str] = []
    for name, summary, sub in _subcommands(parser):
        args = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
        usage = " ".join(_shown(a) if a.required or not a.option_strings else f"[{_shown(a)}]"
                         for a in args)
        lines += [f"### commbench {name}", "", f"{summary[:1].upper()}{summary[1:]}.", "",
                  "```text", f"commbench {name} {usage}".rstrip(), "```", ""]
        for a in args:
            text = (a.help or "").replace("%%", "%")
            if a.default and a.default != argparse.SUPPRESS and a.option_strings \
                    and "default" not in text:
                text += f"{'; ' if text else ''}default `{a.default}`"
            if a.choices:
                text += f"{'; ' if text else ''}one of {', '.join(map(str, a.choices))}"
            lines.append(f"- `{_shown(a)}`" + (f": {text}" if text else ""))
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def sections() -> dict[str, str]:
    return {OPTIONS_SECTION: options_markdown(), COMMANDS_SECTION: commands_markdown()}


def main(argv: list[str] | None = None) -> int:
    from .cli import write_section

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m pytest_commbench.optionsdoc docs/options.md", file=sys.stderr)
        return 2
    path = Path(argv[0])
    if not path.exists():
        print(f"optionsdoc: no {path} (its prose and markers come first)", file=sys.stderr)
        return 2
    for name, text in sections().items():
        write_section(path, name, text)
    print(f"optionsdoc: wrote the options and commands of {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
