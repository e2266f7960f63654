"""The database options every command takes (``--dsn``, ``--schema``, ``--json``), and the
two shapes of a command: `command` (``trioq check``) and `group` (``trioq dead list``)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

__all__ = ["MAX_JOB_ID", "Commands", "bounded", "command", "database_options", "group", "job_id"]

if TYPE_CHECKING:  # subscriptable for type checkers only
    Commands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Commands = argparse._SubParsersAction


def database_options(
    *, in_group: bool = False, schema_help: str = "trioq's schema (default: trioq)"
) -> argparse.ArgumentParser:
    """The options, for ``parents=[...]``.

    ``in_group``: for the subcommands of a group (``trioq dead list``), whose group parser
    takes the options too and holds their defaults. argparse copies every value a
    subcommand's parser sets over the group's, so a default there would silently undo
    ``trioq dead --dsn URL list``; these set only what is given.
    """
    given: dict[str, Any] = {"default": argparse.SUPPRESS} if in_group else {}
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--dsn",
        help="Postgres DSN (default: $TRIOQ_DSN, $DATABASE_URL, else the embedded Postgres)",
        **given,
    )
    options.add_argument(
        "--schema", help=schema_help, **(given or {"default": "trioq"})
    )
    options.add_argument("--json", action="store_true", help="print JSON instead of text", **given)
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


#: The largest job id (ids are bigints, and their identity starts at 1).
MAX_JOB_ID = 2**63 - 1
_DIGITS = re.compile(r"[0-9]{1,19}")


def job_id(text: str) -> int:
    """An argparse ``type``: a job's id, a whole number from 1 to `MAX_JOB_ID` in ASCII
    digits. Anything else is a usage error, before the database is asked (which would
    answer ``bigint out of range``)."""
    value = int(text) if _DIGITS.fullmatch(text) else 0
    if not 1 <= value <= MAX_JOB_ID:
        raise argparse.ArgumentTypeError(
            f"a job id is a whole number from 1 to {MAX_JOB_ID}, got {text!r}"
        )
    return value
