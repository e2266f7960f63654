"""``trioq stress``: a load test against Postgres with exactly-once verification."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import psycopg
import trio

from .._exceptions import EmbeddedPostgresError, SchemaError, leaves
from .._pg.dsn import configured_dsn
from .._pg.embedded import EmbeddedPostgres
from .._pg.errors import check_dsn
from .._stress.failover import replicated_pair
from .._stress.report import StressReport, render
from .._stress.run import MODES, TRANSACTIONS, StressError, StressOptions, Target, run_stress
from .options import Commands, checked, command, dsn

__all__ = ["add_stress_parser"]

#: Errors that are the user's to fix (or the environment's): one line on stderr, exit 1.
_EXPECTED = (StressError, psycopg.OperationalError, SchemaError, EmbeddedPostgresError, ValueError)

_EPILOG = """\
examples:
  trioq stress                                    # 20,000 jobs, 2 workers x 50 slots
  trioq stress --jobs 2000 --kill-every 1 --json report.json
  trioq stress --mode steady --rate 2000 --duration 30 --work-ms 5
  trioq stress --dsn postgresql://app@db/app --terminate-every 2 --quiet --json -
  trioq stress --mode steady --rate 300 --duration 30 --work-ms 200 --kill-at 10
  trioq stress --mode steady --rate 300 --duration 30 --pin-xmin-at 5 --pin-xmin-for 20
  trioq stress --dsn postgresql://app@10.0.0.1/app --processes 4 --kill-host-at 3 \\
      --launcher 'ip netns exec h1' --launcher 'ip netns exec h2'

The run uses its own schema (--schema, default trioq_stress), emptied at the start:
never the application's jobs. With no DSN (--dsn, $TRIOQ_DSN, $DATABASE_URL) it runs on
the embedded Postgres. Chaos flags make the lease 2 s, heartbeat 0.5 s and sweep 0.5 s
unless --lease/--heartbeat/--sweep say otherwise. Each fault's recovery time (next
completion, caught up, a killed worker's jobs done elsewhere) is in the report.

exit codes: 0 verified; 1 error (no report); 2 usage; 4 verification failed (lost,
duplicate, dead or unexplained jobs, or a --sigterm-at stop that left jobs running or
did not exit cleanly); 5 the queue did not drain within --timeout.
See docs/stress.md.
"""


def add_stress_parser(commands: Commands, common: argparse.ArgumentParser) -> None:
    """Register ``trioq stress``.

    ``common`` is not a parent here: stress has its own ``--schema`` default and its
    ``--json`` takes a file, so only ``--dsn`` is shared (re-declared alike).
    """
    del common
    sub = command(
        commands, "stress",
        help="load-test Postgres with real workers: throughput, latency, exactly-once check",
        description="Enqueue jobs, run them in real worker processes, measure throughput, "
        "pickup latency and CPU, and verify that every job completed exactly once.",
        epilog=_EPILOG,
    )  # fmt: skip
    sub.add_argument(
        "--dsn", type=dsn,
        help="Postgres DSN (default: $TRIOQ_DSN, $DATABASE_URL, else the embedded one)",
    )  # fmt: skip
    sub.add_argument(
        "--pooler-dsn", metavar="URL", type=dsn,
        help="the workers' pools go through URL (a transaction-mode PgBouncer to the --dsn "
        "database); their LISTEN and liveness lock, and this driver, stay on --dsn",
    )  # fmt: skip
    sub.add_argument("--schema", default="trioq_stress", help="the run's own schema (emptied)")
    _host_flags(sub)
    _workload_flags(sub)
    _chaos_flags(sub)
    sub.add_argument("--timeout", type=float, default=600.0, help="drain timeout, s (600)")
    sub.add_argument("--json", metavar="FILE", type=_report_file,
                     help="write the JSON report to FILE (- = stdout)")  # fmt: skip
    sub.add_argument("--quiet", action="store_true", help="no live progress line on stderr")
    sub.set_defaults(handler=_stress, parser=sub)


def _file(text: str) -> str:
    """Where the report goes: checked before the run, not when it is written at its end."""
    if not text or "\x00" in text:
        raise ValueError(f"{text!r} is not a file name (- is stdout)")
    return text


_report_file = checked(_file)


def _moment(sub: argparse.ArgumentParser, flag: str, help: str) -> None:
    """A flag that says when something happens: S seconds into the run."""
    sub.add_argument(flag, type=float, metavar="S", help=help)


def _host_flags(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--launcher", action="append", default=[], metavar="CMD",
        help="run workers on a host of their own: each --launcher is one host, a command "
        "prefix that execs the worker command on this machine (e.g. 'ip netns exec h1'); "
        "--processes are spread round-robin over them (default: plain children of this one)",
    )  # fmt: skip
    sub.add_argument(
        "--host-dsn", action="append", default=[], metavar="URL", type=dsn,
        help="the DSN the workers of each --launcher connect with (once per --launcher, in "
        "order; default --dsn): how that host reaches the database",
    )  # fmt: skip
    _moment(sub, "--kill-host-at", "S s in, SIGKILL every worker of one --launcher host that "
            "holds running jobs; none is started there again (a lost host: the others must "
            "finish its jobs)")


def _workload_flags(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--mode", choices=MODES, default="burn-down", help="(burn-down)")
    sub.add_argument("--jobs", type=int, default=20_000, help="burn-down backlog (20000)")
    sub.add_argument("--rate", type=float, help="steady: jobs enqueued per second")
    sub.add_argument("--duration", type=float, help="steady: seconds of production")
    sub.add_argument("--processes", type=int, default=2, help="worker processes (2)")
    sub.add_argument("--concurrency", type=int, default=50, help="job slots per process (50)")
    sub.add_argument("--pool-size", type=int, default=8, help="runtime connections per process (8)")
    sub.add_argument(
        "--app-pool-size", type=int, default=10,
        help="handler connections per process (10): each job's transaction holds one",
    )  # fmt: skip
    sub.add_argument(
        "--transactions", choices=TRANSACTIONS, default="own",
        help="where each job's ledger row commits with its completion: a transaction of its "
        "own (job.transaction()), one shared with other jobs' (shared=True), the statement "
        "given to job.complete_with() (one), or to complete_with(shared=True) (one-shared) "
        "(own)",
    )  # fmt: skip
    sub.add_argument("--work-ms", type=float, default=0.0, help="synthetic work per job, ms (0)")
    sub.add_argument("--payload-bytes", type=int, default=0, help="padding in each job's args")


def _chaos_flags(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--kill-every", type=float, metavar="S", help="SIGKILL a worker every S s")
    _moment(sub, "--terminate-every", "pg_terminate_backend the workers' connections every S s")
    _moment(sub, "--restart-postgres-at", "stop and start the embedded Postgres S s into the run")
    _moment(sub, "--failover-at", "run on a primary and a synchronous standby of the run's own "
            "(from the embedded binaries), SIGKILL the primary S s in and promote the standby")
    _fault_flags(sub)
    sub.add_argument("--lease", type=float, help="job lease, s (30; 2 with chaos)")
    sub.add_argument("--heartbeat", type=float, help="heartbeat interval, s (5; 0.5 with chaos)")
    sub.add_argument("--sweep", type=float, help="sweep interval, s (5; 0.5 with chaos)")


def _fault_flags(sub: argparse.ArgumentParser) -> None:
    _moment(sub, "--kill-at", "SIGKILL, once, a worker that holds running jobs S s in; restart it")
    _moment(sub, "--starve-at", "S s in, idle connections take every connection slot but "
            "--starve-leave, cutting the workers' connections (only on a server of your own)")
    sub.add_argument("--starve-for", type=float, metavar="D", help="starve for D s (10)")
    sub.add_argument(
        "--starve-leave", type=int, metavar="N", help="slots left to the workers (3 per process)"
    )
    _moment(sub, "--pin-xmin-at", "S s in, an idle-in-transaction session pins the xmin horizon")
    sub.add_argument("--pin-xmin-for", type=float, metavar="D", help="pin for D s (10)")
    _moment(sub, "--sigterm-at", "S s in, SIGTERM every worker (graceful stop), time the exits, "
            "start new ones")
    sub.add_argument("--grace", type=float, default=5.0, help="the workers' shutdown grace, s (5)")


def _options(args: argparse.Namespace) -> StressOptions:
    try:
        return StressOptions(
            mode=args.mode, jobs=args.jobs, processes=args.processes,
            concurrency=args.concurrency, rate=args.rate, duration=args.duration,
            work_ms=args.work_ms, payload_bytes=args.payload_bytes, schema=args.schema,
            timeout=args.timeout, kill_every=args.kill_every,
            terminate_every=args.terminate_every, restart_postgres_at=args.restart_postgres_at,
            failover_at=args.failover_at,
            lease=args.lease, heartbeat=args.heartbeat, sweep=args.sweep,
            pool_size=args.pool_size, app_pool_size=args.app_pool_size, quiet=args.quiet,
            transactions=args.transactions,
            kill_at=args.kill_at, starve_at=args.starve_at, starve_for=args.starve_for,
            starve_leave=args.starve_leave, pin_xmin_at=args.pin_xmin_at,
            pin_xmin_for=args.pin_xmin_for, sigterm_at=args.sigterm_at, grace=args.grace,
            launchers=args.launcher, host_dsns=args.host_dsn, kill_host_at=args.kill_host_at,
        )  # fmt: skip
    except ValueError as ex:
        args.parser.error(str(ex))  # exits with 2
        raise


def _stress(args: argparse.Namespace) -> int:
    options = _options(args)
    try:
        report = _run(options, args.dsn, args.pooler_dsn)
    except BaseException as ex:  # trio wraps errors of concurrent tasks in exception groups
        found = leaves(ex)
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in found):
            raise KeyboardInterrupt from None  # `trioq` exits with 130
        if not all(isinstance(leaf, _EXPECTED) for leaf in found):
            raise
        print(f"trioq: error: {found[0]}", file=sys.stderr)
        return 1
    _output(report, args.json)
    return report.exit_code


def _run(options: StressOptions, cli_dsn: str | None, pooler: str | None) -> StressReport:
    dsn = configured_dsn(cli_dsn)
    for host_dsn in options.host_dsns:
        check_dsn(host_dsn, what="--host-dsn")
    if pooler is not None and options.host_dsns:
        raise StressError("--pooler-dsn and --host-dsn together are not supported: the pooler "
                          "would be reached from every host at one address")  # fmt: skip
    if pooler is not None:
        check_dsn(pooler, what="--pooler-dsn")
        if dsn is None:
            raise StressError("--pooler-dsn needs --dsn (or $TRIOQ_DSN): the database behind it")
    if options.failover_at is not None:
        if dsn is not None or options.launchers or options.restart_postgres_at is not None:
            raise StressError("--failover-at runs on a pair of servers of its own: not with "
                              "--dsn, --launcher or --restart-postgres-at")  # fmt: skip
        with replicated_pair(EmbeddedPostgres.from_env()) as pair:  # main thread, before trio.run
            return trio.run(run_stress, options, Target(dsn=pair.dsn(), pair=pair))
    if dsn is not None:
        return trio.run(run_stress, options, Target(dsn=dsn, pooler_dsn=pooler))
    embedded = EmbeddedPostgres.from_env()
    owned = not embedded.status().running
    with embedded.running() as status:  # main thread, before trio.run
        target = Target(dsn=status.dsn, embedded=embedded, owned=owned)
        return trio.run(run_stress, options, target)


def _output(report: StressReport, json_file: str | None) -> None:
    data: dict[str, Any] = report.to_json()
    text = json.dumps(data, indent=2, default=str)
    if json_file == "-":
        print(text)
        return
    print(render(report))
    if json_file:
        with open(json_file, "w") as f:
            f.write(text + "\n")
