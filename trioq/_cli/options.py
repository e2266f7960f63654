"""The database options every command takes (``--dsn``, ``--schema``, ``--json``), and the
two shapes of a command: `command` (``trioq check``) and `group` (``trioq dead list``)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from .._db.statements import validate_schema_name
from .._job import check_queue_name, check_task_name
from .._pg.errors import check_dsn

__all__ = [
    "MAX_JOB_ID", "Commands", "bounded", "checked", "command", "data_dir", "database_options",
    "dsn", "group", "job_id", "queue_name", "schema", "task_name",
]  # fmt: skip

T = TypeVar("T")

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
        "--dsn", type=dsn,
        help="Postgres DSN (default: $TRIOQ_DSN, $DATABASE_URL, else the embedded Postgres)",
        **given,
    )  # fmt: skip
    options.add_argument(
        "--schema", type=schema, help=schema_help, **(given or {"default": "trioq"})
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
    ``above``) to ``high``; anything else (not a number, nan) is a usage error that says
    the range."""
    what = "a whole number" if kind is int else "a number"
    lowest = f"more than {low:g}" if above else f"{low:g}"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not (low < value if above else low <= value) or not value <= high:
            raise argparse.ArgumentTypeError(f"must be {what} from {lowest} to {high:g}, "
                                             f"got {text!r}")  # fmt: skip
        return value

    return parse


def checked(check: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse ``type`` from a rule that raises ValueError: its message is the usage
    error (an ``ArgumentTypeError``, which argparse shows as it is: for other errors it
    would echo the value, a DSN's password with it)."""

    def parse(text: str) -> T:
        try:
            return check(text)
        except ValueError as ex:
            raise argparse.ArgumentTypeError(str(ex)) from None

    return parse


def _dsn(text: str) -> str:
    if not text.strip():
        raise ValueError(
            "empty: give a DSN, or leave --dsn out to use $TRIOQ_DSN, $DATABASE_URL or the "
            "embedded Postgres (an empty --dsn was taken as none: another database than the "
            "one meant, when the variable that should have held it was unset)"
        )
    return check_dsn(text, what="the DSN")


def _data_dir(text: str) -> Path:
    if not text:
        raise ValueError("empty: name a directory, or leave --data-dir out for the default")
    if "\x00" in text:
        raise ValueError(f"{text!r} holds a NUL character")
    try:
        text.encode()
    except UnicodeEncodeError:
        raise ValueError(f"{text!r} is not UTF-8: the path of the server's socket, in it, "
                         "goes in the DSN") from None  # fmt: skip
    return Path(text)


#: ``--dsn``: libpq must parse it (`check_dsn`, which never echoes it); never empty.
dsn = checked(_dsn)
#: ``--schema``: a trioq schema name (`validate_schema_name`).
schema = checked(validate_schema_name)
#: ``--queue``, ``trioq queue pause NAME``: a queue name (`check_queue_name`).
queue_name = checked(check_queue_name)
#: ``--task``: a task name (`check_task_name`).
task_name = checked(check_task_name)
#: ``trioq db --data-dir``: a directory the embedded server can use (not empty, no NUL,
#: UTF-8).
data_dir = checked(_data_dir)


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
