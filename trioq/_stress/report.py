"""The report of a stress run: what it measured, what it verified, and its exit code.

Exit codes (also in ``docs/stress.md``): 0 verified; 1 an error stopped the run (no
report); 2 a usage error; 4 verification failed (jobs lost, completed twice, dead,
re-executed without a reason, or completed without being enqueued; or a ``--sigterm-at``
stop that left jobs running or did not exit cleanly); 5 the run did not
drain within ``--timeout`` (jobs left in the queue) but nothing else failed.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from .verify import Verification

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "CpuStats",
    "Rate",
    "StressReport",
    "exit_code",
    "render",
]

EXIT_OK = 0
EXIT_FAILED = 4
EXIT_TIMEOUT = 5


@attrs.frozen(kw_only=True)
class Rate:
    jobs: int
    seconds: float | None

    @property
    def per_second(self) -> float | None:
        return self.jobs / self.seconds if self.seconds else None


@attrs.frozen(kw_only=True)
class CpuStats:
    """CPU seconds over the measurement window (the drain, or the steady run and its drain)."""

    window_seconds: float
    workers: float
    postgres: float | None
    postgres_source: str
    driver: float
    machine_busy: float | None  # every process on the machine, ours included
    cores: int

    @property
    def others(self) -> float | None:
        """CPU used by processes that are neither ours nor the server's."""
        if self.machine_busy is None:
            return None
        return max(0.0, self.machine_busy - self.workers - (self.postgres or 0.0) - self.driver)


@attrs.frozen(kw_only=True)
class StressReport:
    options: dict[str, Any]
    database: dict[str, Any]
    enqueue: Rate
    steady: dict[str, Any] | None
    drain: Rate
    latency: dict[str, float | None]
    cpu: CpuStats
    chaos: dict[str, Any]
    workers: dict[str, Any]
    verification: Verification
    timed_out: bool

    @property
    def exit_code(self) -> int:
        return exit_code(self.verification, timed_out=self.timed_out)

    def to_json(self) -> dict[str, Any]:
        data = attrs.asdict(self, recurse=True)
        data["enqueue"]["rate"] = _round(self.enqueue.per_second)
        data["drain"]["rate"] = _round(self.drain.per_second)
        data["cpu"]["others"] = self.cpu.others
        data["cpu"].update(_per_job(self.cpu, self.drain.jobs))
        data["verification"]["passed"] = self.verification.passed
        data["exit_code"] = self.exit_code
        return data


def exit_code(verification: Verification, *, timed_out: bool) -> int:
    """4 for any failure but jobs left in the queue; 5 when those are the only one; else 0.

    (``timed_out`` alone fails nothing: a run that drained exactly at its deadline passes.)
    """
    if verification.passed:
        return EXIT_OK
    if verification.only_left:
        return EXIT_TIMEOUT
    return EXIT_FAILED


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _per_job(cpu: CpuStats, jobs: int) -> dict[str, float | None]:
    if not jobs:
        return {"workers_us_per_job": None, "postgres_us_per_job": None}
    return {
        "workers_us_per_job": round(cpu.workers / jobs * 1e6, 1),
        "postgres_us_per_job": None
        if cpu.postgres is None
        else round(cpu.postgres / jobs * 1e6, 1),
    }


# -- text ---------------------------------------------------------------------------------------


def _n(value: float | None, unit: str = "", digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}{unit}"


def _s(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _pooler_lines(database: dict[str, Any]) -> list[str]:
    pooler = database.get("pooler")
    if not pooler:
        return []
    return [f"  pooler:    {pooler} (the workers' pools; LISTEN and liveness direct)"]


def render(report: StressReport) -> str:
    """The human report, a few aligned lines."""
    o = report.options
    lines = [
        f"trioq stress: {o['mode']}, {o['processes']} processes x {o['concurrency']} slots, "
        f"work {o['work_ms']:g} ms, payload {o['payload_bytes']} B, schema {o['schema']}",
        f"  database:  {report.database['target']} (Postgres {report.database['server_version']}"
        f", fsync {report.database['fsync']}, synchronous_commit "
        f"{report.database['synchronous_commit']})",
        *_pooler_lines(report.database),
        *_load_lines(report),
        f"  drain:     {report.drain.jobs:,} jobs in {_n(report.drain.seconds, ' s', 2)} = "
        f"{_n(report.drain.per_second, ' jobs/s')} (first pickup -> last completion)",
        "  latency:   pickup (run_at -> handler start) "
        + "  ".join(f"{k} {_s(report.latency[k])}" for k in ("p50", "p95", "p99", "max")),
        *_cpu_lines(report.cpu, report.drain.jobs),
        _chaos_line(report.chaos),
        *_fault_lines(report.chaos),
        f"  workers:   {report.workers['started']} started, {report.workers['unexpected_exits']} "
        f"exited on their own, log: {report.workers['log_warnings']} warnings "
        f"({report.workers['log_lease_lost']} 'lost its lease'), "
        f"{report.workers['log_errors']} errors",
        *_host_lines(report.workers.get("hosts", [])),
        *_verify_lines(report),
    ]
    return "\n".join(lines)


def _host_lines(hosts: list[dict[str, Any]]) -> list[str]:
    """One line per --launcher host: what it ran and completed, and whether it was lost."""
    return [
        f"  host {h['name']}:   {h['launcher']}: {len(h['pids'])} processes, "
        f"{h['completed']:,} completions" + (" (killed by --kill-host-at)" if h["lost"] else "")
        for h in hosts
    ]


def _load_lines(report: StressReport) -> list[str]:
    enqueue = report.enqueue
    line = (
        f"  enqueue:   {enqueue.jobs:,} jobs in {_n(enqueue.seconds, ' s', 2)} = "
        f"{_n(enqueue.per_second, ' jobs/s')}"
    )
    if report.steady is None:
        return [line + " (enqueue_many, one transaction)"]
    s = report.steady
    return [
        line,
        f"  producer:  target {s['target_rate']:,.0f} jobs/s for {s['duration']:g} s, achieved "
        f"{_n(s['achieved_rate'], ' jobs/s')}, worst lag {_s(s['max_lag_seconds'])}, "
        f"{s['enqueue_errors']} enqueue errors",
    ]


def _cpu_lines(cpu: CpuStats, jobs: int) -> list[str]:
    per = _per_job(cpu, jobs)
    return [
        f"  cpu:       over {cpu.window_seconds:.2f} s on {cpu.cores} cores: workers "
        f"{cpu.workers:.2f} s ({_n(per['workers_us_per_job'], ' us/job')}), postgres "
        f"{_n(cpu.postgres, ' s', 2)} ({_n(per['postgres_us_per_job'], ' us/job')}), "
        f"driver {cpu.driver:.2f} s, others {_n(cpu.others, ' s', 2)}",
        f"             postgres CPU from {cpu.postgres_source}",
    ]


def _chaos_line(chaos: dict[str, Any]) -> str:
    parts = [
        f"{chaos['kills']} workers killed"
        + (f" (of {chaos['host_kills']} lost host(s))" if chaos.get("host_kills") else ""),
        f"{chaos['terminated_connections']} connections terminated "
        f"({chaos['terminate_rounds']} rounds)",
        f"{chaos['postgres_restarts']} Postgres restarts",
    ]
    if chaos["restart_skipped"]:
        parts.append(f"restart skipped: {chaos['restart_skipped']}")
    return "  chaos:     " + ", ".join(parts)


def _spread(entry: dict[str, Any], key: str) -> str | None:
    value = entry.get(key)
    if value is None:
        return None
    if value["median"] == value["max"]:
        return _s(value["max"])
    return f"median {_s(value['median'])} max {_s(value['max'])}"


def _fault_lines(chaos: dict[str, Any]) -> list[str]:
    """Recovery per kind of fault, then what each one-shot fault saw."""
    lines = []
    for kind, entry in chaos.get("recovery", {}).items():
        parts = [f"{kind} x{entry['count']}:"]
        if (held := _spread(entry, "held_recovered_s")) is not None:
            counts = ", ".join(str(n) for n in entry["held"][:5])
            parts.append(f"victim's running jobs ({counts}) all completed after {held};")
        if (released := _spread(entry, "held_released_s")) is not None:
            parts.append(f"released after {released};")
        first, caught = _spread(entry, "first_completion_s"), _spread(entry, "caught_up_s")
        parts.append(f"after it, next completion {first or 'n/a'}, caught up {caught or 'n/a'}")
        lines.append("  recovery:  " + " ".join(parts))
    windows = {f["kind"]: f for f in chaos.get("faults", []) if "completed_during" in f}
    if (starving := chaos.get("starvation")) is not None:
        lines.append(
            f"  starve:    {starving['hogs']} idle connections held every slot of "
            f"{starving['max_connections']} but {starving['leave']} for the workers for "
            f"{starving['seconds']:.1f} s; workers' connections: "
            f"{starving['worker_connections_cut']} cut, {starving['worker_connections_start']} "
            "at the start, "
            f"{starving['worker_connections_end']} at the end" + _during(windows.get("starvation"))
        )
    if (pin := chaos.get("xmin_pin")) is not None:
        lines.append(
            f"  xmin pin:  {pin['seconds']:.1f} s at xmin {pin['xmin']}: jobs table dead tuples "
            f"{_n(pin['dead_before'])} -> {_n(pin['dead_at_release'])} (live "
            f"{_n(pin['live_at_release'])}, {_n(pin['vacuums_during'])} vacuums), "
            f"{_n(pin['dead_after_vacuum'])} after a VACUUM at the end"
            + _during(windows.get("xmin pin"))
        )
    if (stop := chaos.get("graceful_stop")) is not None:
        exits = ", ".join(_s(x) for x in stop["exit_seconds"])
        lines.append(
            f"  sigterm:   {stop['workers']} workers holding {_n(stop['held_at_signal'])} running "
            f"jobs exited in {exits} (grace {stop['grace']:g} s), codes {stop['exit_codes']}, "
            f"{_n(stop['running_after'])} jobs left running, {stop['killed']} SIGKILLed"
        )
    return lines


def _during(fault: dict[str, Any] | None) -> str:
    if fault is None:
        return ""
    return (
        f"; meanwhile {fault['completed_during']:,} jobs completed ({fault['rate_during']:,.0f}"
        f"/s), pickup p95 {_s(fault['pickup_p95_during_s'])}"
    )


def _verify_lines(report: StressReport) -> list[str]:
    v = report.verification
    verdict = "PASSED" if v.passed else "FAILED"
    lines = [
        f"  verify:    {verdict}: enqueued {v.enqueued:,}, completed {v.completed:,}, "
        f"lost {v.lost}, duplicate completions {v.duplicate_completions}, dead {v.dead}, "
        f"left {v.left_total}, re-executed {v.reexecuted}",
    ]
    for reason, count in v.reexecuted_reasons.items():
        examples = ", ".join(str(i) for i in v.reexecuted_examples.get(reason, [])[:5])
        short = " ".join(reason.split())
        short = short if len(short) <= 90 else short[:87] + "..."
        lines.append(f"             re-executed {count} after {short!r} (e.g. jobs {examples})")
    lines += [f"             FAILED: {failure}" for failure in v.failures]
    lines += [f"             warning: {warning}" for warning in v.warnings]
    if report.timed_out:
        lines.append(f"             timed out after {report.options['timeout']:g} s")
    return lines
