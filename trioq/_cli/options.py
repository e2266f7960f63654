"""The database options every command takes: ``--dsn``, ``--schema``, ``--json``."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["database_options"]


def database_options(*, in_group: bool = False) -> argparse.ArgumentParser:
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
        "--schema", help="trioq's schema (default: trioq)", **(given or {"default": "trioq"})
    )
    options.add_argument("--json", action="store_true", help="print JSON instead of text", **given)
    return options
