"""Where an option's value comes from: the command line, else the environment
(COMMBENCH_<NAME>), else the ini file (commbench_<name>), else the table's default; each source
parsed and checked by the option's one parser, and a bad value a usage error that says where
it came from."""

from __future__ import annotations

import os
from typing import Any

import pytest

from .options import ALIASES, DEFAULTS, PARSERS, flag_name


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
