"""The database options every command takes (``--dsn``, ``--schema``, ``--json``), the
two shapes of a command: `command` (``trioq check``) and `group` (``trioq dead list``), and
the durations options are given in (`seconds`, `duration`)."""

from __future__ import annotations

import argparse
import datetime as dt
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from .._db.statements import validate_schema_name
from .._job import check_queue_name, check_task_name
from .._pg.errors import check_dsn

__all__ = [
    "MAX_JOB_ID", "MIN_AGE", "Commands", "age", "bounded", "checked", "command", "data_dir",
    "database_options", "dsn", "duration", "group", "job_id", "queue_name", "schema",
    "seconds", "shown", "task_name",
]  # fmt: skip

T = TypeVar("T")

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
    options.add_argument("--dsn", type=dsn, help=dsn_help, **given)
    options.add_argument(
        "--schema", type=schema, help=schema_help, **(given or {"default": "trioq"})
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
    """`seconds` as a timedelta."""
    return dt.timedelta(seconds=seconds(text, option))


def time_or_duration(text: str, option: str) -> dt.datetime | dt.timedelta:
    """A time (ISO 8601; its zone and range are checked by the API, in its words) or a
    duration from now (`seconds`, 0 included), for ``trioq enqueue --start-by``."""
    if _DURATION.fullmatch(text.strip()):
        return dt.timedelta(seconds=seconds(text, option, zero=True))
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{option} {shown(text)}: use a duration from now (90s, 30m, 7d) or "
                         "a time with its zone, such as 2030-01-01T09:00+00:00") from None


#: The shortest age or window the command line takes: a purge cut-off under a second matches
#: every job that died before the command started (ask for that with --all), and a unique
#: window under a second is no window.
MIN_AGE = 1.0


def _age(text: str) -> dt.timedelta:
    try:
        value = seconds(text, "")
    except ValueError as ex:  # argparse names the option: "argument --older-than: '7x': ..."
        raise ValueError(str(ex).lstrip()) from None
    if value < MIN_AGE:
        raise ValueError(f"{shown(text)} is less than 1 second, the shortest duration taken "
                         "(a purge of every dead job is --all)")  # fmt: skip
    return dt.timedelta(seconds=value)


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
#: ``--older-than``, ``--unique-period``: a duration (`seconds`) of at least `MIN_AGE`.
age = checked(_age)
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
