"""The database options every command takes (``--dsn``, ``--schema``, ``--json``), the
two shapes of a command: `command` (``trioq check``) and `group` (``trioq dead list``), and
the durations options are given in (`seconds`, `duration`)."""

from __future__ import annotations

import argparse
import datetime as dt
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

__all__ = [
    "Commands", "bounded", "command", "database_options", "duration", "group", "seconds",
    "shown",
]  # fmt: skip

if TYPE_CHECKING:  # subscriptable for type checkers only
    Commands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Commands = argparse._SubParsersAction


def database_options(
    *, in_group: bool = False, schema_help: str = "trioq's schema (default: trioq)",
    dsn_help: str = "Postgres DSN (default: $TRIOQ_DSN, $DATABASE_URL, else the embedded "
    "Postgres)", json_help: str = "print JSON instead of text",
) -> argparse.ArgumentParser:  # fmt: skip
    """The options, for ``parents=[...]``.

    ``in_group``: for the subcommands of a group (``trioq dead list``), whose group parser
    takes the options too and holds their defaults. argparse copies every value a
    subcommand's parser sets over the group's, so a default there would silently undo
    ``trioq dead --dsn URL list``; these set only what is given.
    """
    given: dict[str, Any] = {"default": argparse.SUPPRESS} if in_group else {}
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--dsn", help=dsn_help, **given)
    options.add_argument(
        "--schema", help=schema_help, **(given or {"default": "trioq"})
    )
    options.add_argument("--json", action="store_true", help=json_help, **given)
    return options


def command(
    commands: Commands, name: str, *, help: str, epilog: str | None = None,
    parents: Sequence[argparse.ArgumentParser] = (), description: str | None = None,
) -> argparse.ArgumentParser:  # fmt: skip
    """A command: its line in ``--help``, its description (by default the help as a
    sentence) and its examples (``epilog``, printed as written)."""
    return commands.add_parser(
        name, parents=list(parents), help=help,
        description=description or help[0].upper() + help[1:] + ".", epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip


def group(
    commands: Commands, common: argparse.ArgumentParser, name: str, *, help: str,
    epilog: str, description: str | None = None,
) -> tuple[Commands, argparse.ArgumentParser]:  # fmt: skip
    """A command with subcommands (``trioq dead list``): its subcommands, and the database
    options to give each of them. The group takes the options too, so ``trioq dead --dsn
    URL list`` uses the URL and ``trioq dead --dsn URL`` is a usage error that names no
    DSN; its subcommands' options set only what is given (see `database_options`)."""
    parser = command(commands, name, parents=[common], help=help, description=description,
                     epilog=epilog)  # fmt: skip
    subs = parser.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")
    return subs, database_options(in_group=True)


def bounded(
    kind: Callable[[str], float], low: float, high: float, *, above: bool = False
) -> Callable[[str], Any]:
    """An argparse ``type``: ``kind`` of the text, from ``low`` (or more than it, with
    ``above``) to ``high``; anything else is a usage error that says the range."""
    lowest = f"more than {low:g}" if above else f"{low:g}"

    def parse(text: str) -> float:
        value = kind(text)
        if not (low < value if above else low <= value) or not value <= high:
            raise argparse.ArgumentTypeError(f"must be {lowest} to {high:g}, got {text!r}")
        return value

    return parse


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: ASCII digits only: ``\d`` (and ``float``) take "٣" and other scripts' digits.
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd]?)")
#: The longest duration an option takes: 100 years.
MAX_SECONDS = 100 * 365 * 86400


def shown(text: str) -> str:
    """``text`` quoted for an error message, cut to 60 characters (an option's value may be
    anything, a megabyte included)."""
    return repr(text) if len(text) <= 60 else repr(text[:57]) + "..."


def seconds(text: str, option: str, *, zero: bool = False) -> float:
    """The seconds of a duration such as ``90s``, ``30m``, ``12h``, ``7d``, ``0.5`` (a bare
    number is seconds); more than 0 (at least 0 with ``zero``) and less than 100 years.
    Anything else (empty, negative, NaN, ``1e400``, another script's digits) is a ValueError
    that names ``option`` and quotes the text."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        least = "0 or more" if zero else "more than 0"
        raise ValueError(f"{option} {shown(text)}: use seconds ({least}) or a number "
                         "with s, m, h or d, such as 90s, 30m, 7d")  # fmt: skip
    value = float(match[1]) * _UNITS[match[2] or "s"]
    least_ok = value >= 0 if zero else value > 0
    if not least_ok or not value < MAX_SECONDS:
        least = "at least 0" if zero else "more than 0"
        raise ValueError(f"{option} {shown(text)}: must be {least} and less than 100 years")
    return value


def duration(text: str, option: str) -> dt.timedelta:
    """`seconds` as a timedelta: a cut-off that matched everything would delete everything."""
    return dt.timedelta(seconds=seconds(text, option))
