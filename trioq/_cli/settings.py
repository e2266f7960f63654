"""The `trioq.Config` fields ``trioq serve`` takes from its command line and environment.

Each field a deployment may need to set is a `Setting`: a flag (``--lease 45s``) and an
environment variable (``TRIOQ_LEASE=45s``), read by its `Kind`. The Config serve runs takes
each field from the first of these that is set::

    the flag  >  the variable  >  the app's Config (--app MODULE:CONFIG)  >  Config's default

What is typed for this run beats what is set for every run, and the operator's word beats
the code's (a deployment cannot edit the app's Config; pgqueuer's CLI pinned its heartbeat,
and jobs ran twice). The fields that are not settings are in `EXCLUDED`, each with the
reason; ``tests/test_serve_settings.py`` fails for a field in neither.

A value that its kind or the field's own rule refuses (empty, not a number, negative, zero
where more is needed, NaN, huge, a NUL) is a ValueError that names the flag or the variable,
raised before the app is imported or anything starts. A DSN is never quoted.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .._config import Config, QueueConfig, parse_address
from .._db.statements import validate_schema_name
from .._job import check_queue_name
from .._pg.errors import check_dsn
from .._registry import Registry
from .options import seconds, shown

__all__ = ["EXCLUDED", "KINDS", "SETTINGS", "Given", "Kind", "Setting", "add_settings",
           "build_config", "given_settings", "serve_config"]  # fmt: skip

#: The most a count setting takes (slots, connections, threads, rows, events).
MAX_COUNT = 1_000_000
#: The most bytes a size setting takes: Postgres stores no larger value (1 GB).
MAX_BYTES = 2**30


@attrs.frozen
class Kind:
    """How a setting's text is read: ``parse(text, source)`` is the value, or a ValueError
    that names ``source`` (``--lease`` or ``$TRIOQ_LEASE``)."""

    name: str
    metavar: str
    example: str
    parse: Callable[[str, str], Any]


def _seconds_or_off(text: str, source: str) -> float | None:
    if text.strip().lower() == "off":
        return None
    try:
        return seconds(text, source)
    except ValueError as ex:
        raise ValueError(f"{ex}, or off") from None


def _count(maximum: int) -> Callable[[str, str], int]:
    def parse(text: str, source: str) -> int:
        found = re.fullmatch(r"[0-9]{1,10}", text.strip())  # ASCII: int() takes "٣", "1_0"
        if found is None or not 1 <= int(found[0]) <= maximum:
            raise ValueError(f"{source} {shown(text)}: use a whole number from 1 to {maximum:,}")
        return int(found[0])

    return parse


_SWITCH = {"on": True, "true": True, "yes": True, "1": True,
           "off": False, "false": False, "no": False, "0": False, "auto": None}  # fmt: skip


def _switch(text: str, source: str) -> bool | None:
    value = _SWITCH.get(text.strip().lower(), "?")
    if value == "?":
        raise ValueError(f"{source} {shown(text)}: use on, off or auto")
    return value  # type: ignore[return-value]


def _on_off(text: str, source: str) -> bool:
    value = _SWITCH.get(text.strip().lower())
    if value is None:
        raise ValueError(f"{source} {shown(text)}: use on or off")
    return value


def _checked(check: Callable[[str], object]) -> Callable[[str, str], Any]:
    """A text kind whose ``check`` raises a message that quotes the value itself."""

    def parse(text: str, source: str) -> Any:
        try:
            check(text)
        except (TypeError, ValueError) as ex:
            raise ValueError(f"{source}: {ex}") from None
        return text

    return parse


def _dsn(text: str, source: str) -> str:
    return check_dsn(text, what=source)  # says what is wrong, never quotes the DSN


def _queues(text: str, source: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError(f"{source} {shown(text)}: give one or more queue names, a,b,c")
    for name in names:
        _checked(check_queue_name)(name, source)
    return names


#: Every kind a setting may have (the tests try each kind's bad values on every setting).
KINDS = {kind.name: kind for kind in (
    Kind("seconds", "DURATION", "30s", seconds),
    Kind("seconds_or_zero", "DURATION", "30s", lambda text, source: seconds(text, source,
                                                                          zero=True)),
    Kind("seconds_or_off", "DURATION|off", "1d", _seconds_or_off),
    Kind("count", "N", "10", _count(MAX_COUNT)),
    Kind("bytes", "BYTES", "1048576", _count(MAX_BYTES)),
    Kind("switch", "on|off|auto", "on", _switch),
    Kind("on_off", "on|off", "off", _on_off),
    Kind("dsn", "URL", "postgresql://app@db/app", _dsn),
    Kind("schema", "SCHEMA", "trioq", _checked(validate_schema_name)),
    Kind("queues", "a,b", "email,sms", _queues),
    Kind("address", "HOST:PORT", "127.0.0.1:9100", lambda text, source: (
        parse_address(text, source) and text)),
)}  # fmt: skip

_FIELDS = attrs.fields_dict(Config)


@attrs.frozen
class Setting:
    """A Config field (``field``) as a flag of ``trioq serve`` and environment variables
    (``env``, the first one set counts; default ``TRIOQ_`` and the flag's name)."""

    field: str
    flag: str
    kind: Kind
    help: str
    env: tuple[str, ...] = attrs.field()
    #: False: the flag is one of the database options every command takes (--dsn, --schema).
    own_flag: bool = True

    @env.default
    def _env(self) -> tuple[str, ...]:
        return ("TRIOQ_" + self.dest.upper(),)

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def read(self, text: str, source: str) -> Any:
        """The value of ``text`` given by ``source``, checked by the kind and the field."""
        if not text.strip():
            where = "is set but empty: unset it" if source.startswith("$") else "is empty: drop it"
            raise ValueError(f"{source} {where} (then: the app's Config, else the default) or "
                             f"give a value such as {self.kind.example}")  # fmt: skip
        value = self.kind.parse(text, source)
        field = _FIELDS[self.field]
        if self.field == "queues":  # names and slots, checked by the kind
            return value
        try:  # the field's own rule (an upper bound, a converter), in the flag's words
            converted = field.converter(value) if callable(field.converter) else value
            if field.validator is not None:
                field.validator(None, field, converted)
        except (TypeError, ValueError) as ex:
            raise ValueError(f"{source} {_quoted(self, text)}: {ex}") from None
        return value


def _quoted(setting: Setting, text: str) -> str:
    return "(not shown: it may hold a password)" if setting.kind.name == "dsn" else shown(text)


def _s(field: str, flag: str, kind: str, help: str, **more: Any) -> Setting:
    return Setting(field=field, flag=flag, kind=KINDS[kind], help=help, **more)


#: The deployable fields, in the order of `trioq.Config`.
SETTINGS = (
    _s("dsn", "--dsn", "dsn", "the database", env=("TRIOQ_DSN", "DATABASE_URL"), own_flag=False),
    _s("session_dsn", "--session-dsn", "dsn",
       "when --dsn is a transaction-mode pooler (PgBouncer): a DSN straight to Postgres for "
       "LISTEN, the liveness lock and --migrate; the pooled connections then prepare no "
       "statements"),
    _s("prepared_statements", "--prepared-statements", "switch",
       "prepare statements on the server (auto: unless --session-dsn names a pooler)"),
    _s("schema", "--schema", "schema", "trioq's schema", own_flag=False),
    _s("queues", "--queues", "queues", "the queues to serve, each with its QueueConfig from "
       "the app, else QueueConfig() (default: the app's)"),
    _s("queues", "--concurrency", "count", "slots per served queue (default: the app's, else 10)"),
    _s("lease", "--lease", "seconds", "how long a claim holds without a heartbeat"),
    _s("heartbeat_interval", "--heartbeat-interval", "seconds",
       "how often the leases are extended (at most a third of the lease)"),
    _s("poll_interval", "--poll-interval", "seconds", "claim without a notification this often"),
    _s("sweep_interval", "--sweep-interval", "seconds", "return expired leases this often"),
    _s("liveness_interval", "--liveness-interval", "seconds",
       "ping the workers row, and check for dead workers, this often"),
    _s("liveness_grace", "--liveness-grace", "seconds",
       "a worker whose lock is free and that has not pinged this long is dead (at least twice "
       "the liveness interval)"),
    _s("shutdown_grace", "--shutdown-grace", "seconds_or_zero",
       "a graceful stop waits this long for running jobs"),
    _s("sync_threads", "--sync-threads", "count", "threads for sync handlers"),
    _s("pool_size", "--pool-size", "count", "the runtime's own connections"),
    _s("app_pool_size", "--app-pool-size", "count", "connections for handlers"),
    _s("max_payload_bytes", "--max-payload-bytes", "bytes", "the largest args a job may have"),
    _s("max_result_bytes", "--max-result-bytes", "bytes", "the largest kept result"),
    _s("max_progress_bytes", "--max-progress-bytes", "bytes",
       "the largest value job.progress() takes (at most 1 MiB)"),
    _s("progress_interval", "--progress-interval", "seconds",
       "write each running job's latest progress at most this often"),
    _s("group_commit", "--group-commit", "on_off",
       "job.transaction() without shared= joins a shared transaction (on) or has its own"),
    _s("shared_transactions", "--shared-transactions", "count",
       "shared transactions open at once"),
    _s("shared_transaction_jobs", "--shared-transaction-jobs", "count",
       "the most jobs one shared transaction commits (at most 64)"),
    _s("unknown_task_timeout", "--unknown-task-timeout", "seconds",
       "a job of a task nobody knows goes to dead_jobs after this long"),
    _s("loop_blocked_warning", "--loop-blocked-warning", "seconds",
       "warn when the trio loop has not run for this long"),
    _s("history_interval", "--history-interval", "seconds", "write the job history this often"),
    _s("history_retention", "--history-retention", "seconds", "keep the job history this long"),
    _s("retain_done", "--retain-done", "seconds_or_off",
       "keep kept done rows this long (off: for ever)"),
    _s("retain_cancelled", "--retain-cancelled", "seconds_or_off",
       "keep cancelled rows this long (off: for ever)"),
    _s("retain_dead", "--retain-dead", "seconds_or_off",
       "keep dead jobs this long (off: for ever)"),
    _s("prune_interval", "--prune-interval", "seconds_or_off",
       "prune this often (off: this process never prunes)"),
    _s("prune_batch", "--prune-batch", "count", "rows one pruning statement deletes at most"),
    _s("stranded_interval", "--stranded-interval", "seconds_or_off",
       "look for waiting jobs that can never be freed this often (off: never)"),
    _s("vacuum_interval", "--vacuum-interval", "seconds_or_off",
       "look at the jobs table's dead tuples this often while working (off: leave them to "
       "autovacuum)"),
    _s("vacuum_threshold", "--vacuum-threshold", "count",
       "vacuum the jobs table once its dead tuples pass this plus a tenth of its live ones"),
    _s("hook_timeout", "--hook-timeout", "seconds", "an event callback is cancelled after this"),
    _s("hook_concurrency", "--hook-concurrency", "count", "event callbacks running at once"),
    _s("hook_buffer", "--hook-buffer", "count", "events waiting for the callbacks at most"),
    _s("metrics", "--metrics", "address",
       "serve Prometheus metrics on http://HOST:PORT/metrics (port 0: any free one; "
       "HOST:FIRST-LAST: the first free one; with --processes N, N consecutive ports)"),
    _s("metrics_depth_interval", "--metrics-depth-interval", "seconds",
       "read the queue depths for the metrics at most this often"),
    _s("metrics_depth_cap", "--metrics-depth-cap", "count", "count each depth up to this"),
    _s("tracing", "--tracing", "switch",
       "a span per execution (auto: when the app set a tracer provider)"),
)

#: The fields that are not settings, and why.
EXCLUDED = {
    "registry": "an object: the tasks, given by --app MODULE:ATTRIBUTE",
    "cron": "objects (a task and its args each): the app's code",
    "handle_signals": "always on: serve is the process, and stops on SIGINT and SIGTERM",
    "worker_id": "must differ for every process, and a flag or a variable is given to every "
    "worker of --processes N and every replica alike: two processes with one id would share "
    "their leases (the default, host:pid:random, is unique)",
}


def add_settings(parser: argparse.ArgumentParser) -> None:
    """The flags of `SETTINGS` that serve owns, in a group of their own in ``--help``."""
    group = parser.add_argument_group("Config settings", (
        "Each is the flag, else its TRIOQ_ variable, else the app's Config, else Config's\n"
        "default. DURATION: 90s, 30m, 12h, 7d or plain seconds (0.5)."))  # fmt: skip
    for setting in SETTINGS:
        if setting.own_flag:
            variables = ", ".join(f"${name}" for name in setting.env)
            default = _default(setting)
            group.add_argument(setting.flag, metavar=setting.kind.metavar,
                               help=f"{setting.help} ({variables}{default})")  # fmt: skip


def _default(setting: Setting) -> str:
    """``; default: 30s``, or nothing when the help says it."""
    if setting.field == "queues":
        return ""
    return "; default: " + _value(setting, _FIELDS[setting.field].default)


def _value(setting: Setting, value: Any) -> str:
    if value is None:
        return "auto" if setting.kind.name == "switch" else "none"
    if setting.kind.name.startswith("seconds"):
        value = value.total_seconds() if hasattr(value, "total_seconds") else value
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if value >= size and value % size == 0:
                return f"{value / size:g}{unit}"
        return f"{value:g}s"
    return str(value)


@attrs.frozen
class Given:
    """A setting given: where (``--lease`` or ``$TRIOQ_LEASE``), as what text, its value."""

    source: str
    text: str
    value: Any

    def shown(self, setting: Setting) -> str:
        return f"{self.source} {_quoted(setting, self.text)}"


def given_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[Setting, Given]:
    """Each setting given, by its flag (in ``args``) or else its variable. ValueError for a
    bad one, naming the flag or the variable."""
    found: dict[Setting, Given] = {}
    for setting in SETTINGS:
        text, source = getattr(args, setting.dest, None), setting.flag
        if text is None:
            name = next((name for name in setting.env if name in environ), None)
            if name is None:
                continue
            text, source = environ[name], f"${name}"
        found[setting] = Given(source, text, setting.read(text, source))
    return found


def serve_config(
    args: argparse.Namespace, app: Config | Registry, environ: Mapping[str, str]
) -> Config:
    """The Config ``trioq serve`` runs for ``app`` (`build_config` of `given_settings`)."""
    return build_config(given_settings(args, environ), app)


def build_config(given: Mapping[Setting, Given], app: Config | Registry) -> Config:
    """``app``'s Config (a Registry's: ``Config(registry=app)``) with the given settings and
    ``handle_signals=True``. A value that does not go with the others (a heartbeat longer
    than a third of the lease) is a ValueError naming the flags and variables it involves."""
    config = app if isinstance(app, Config) else Config(registry=app)
    values = {setting.dest: one.value for setting, one in given.items()}
    changes = {setting.field: one.value for setting, one in given.items()
               if setting.field != "queues"}  # fmt: skip
    names = values.get("queues") or list(config.served_queues())
    slots = {name: config.queues.get(name, QueueConfig()) for name in names}
    if "concurrency" in values:  # the slots change; the app's limits (global_concurrency) stay
        slots = {n: attrs.evolve(q, concurrency=values["concurrency"]) for n, q in slots.items()}
    try:
        return attrs.evolve(config, queues=slots, handle_signals=True, **changes)
    except (TypeError, ValueError) as ex:
        involved = [one.shown(setting) for setting, one in given.items()
                    if re.search(rf"\b{setting.field}\b", str(ex))]  # fmt: skip
        if not involved:
            raise
        raise ValueError(f"{ex} (given: {', '.join(involved)})") from None
