"""Prometheus metrics of real ``trioq serve`` processes (issue #11): scraped over HTTP and
checked against the jobs they ran; JSON logs of the same runs; the start-up banner."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from clitool import ServeProcess, cli_env
from prometheus_client.parser import text_string_to_metric_families

import trioq

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Worker(ServeProcess):
    """``trioq serve --app obs_app:config ARGS`` (tests/obs_app.py)."""

    def __init__(self, dsn: str, *args: str) -> None:
        super().__init__(["--app", "obs_app:config", *args], env=cli_env(dsn=dsn, apps=True))


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.communicate(timeout=30)


def _migrate(dsn: str) -> None:
    subprocess.run([sys.executable, "-m", "trioq._cli", "migrate", "--dsn", dsn], check=True,
                   timeout=60, capture_output=True)  # fmt: skip


def _enqueue(
    dsn: str, task: str, n: int, *, queue: str = "default", args: str = "{}", attempts: int = 3
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO trioq.jobs (task, queue, args, max_attempts)"
            " SELECT %s, %s, %s::jsonb, %s FROM generate_series(1, %s)",
            (task, queue, args, attempts, n),
        )  # fmt: skip
        conn.execute("SELECT pg_notify('trioq_trioq', %s)", (queue,))


def _scrape(url: str) -> Series:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            series[s.name, tuple(sorted(s.labels.items()))] = s.value
    return series


def _value(series: Series, name: str, **labels: str) -> float | None:
    return series.get((name, tuple(sorted(labels.items()))))


def _scrape_until(
    url: str, name: str, expected: float, timeout: float = 20, **labels: str
) -> Series:
    """Scrape until ``name{labels}`` is ``expected`` (outcomes reach the counters just after
    the database), bounded."""
    deadline = time.monotonic() + timeout
    while True:
        series = _scrape(url)
        got = _value(series, name, **labels)
        if got == expected:
            return series
        assert time.monotonic() < deadline, f"{name}{labels} is {got}, wanted {expected}"
        time.sleep(0.1)


def _depth(series: Series, queue: str) -> dict[str, float | None]:
    return {state: _value(series, "trioq_queue_depth", queue=queue, state=state)
            for state in ("available", "dead")}  # fmt: skip


def _banner(worker: Worker) -> dict[str, Any]:
    line = json.loads(worker.read_until('"schema_version"'))
    assert line["logger"] == "trioq.runtime" and line["level"] == "INFO"
    return line  # type: ignore[no-any-return]


def test_a_running_serve_counts_what_it_ran(dsn: str, workers: list[Worker]) -> None:
    _migrate(dsn)
    worker = Worker(dsn, "--metrics", "127.0.0.1:0", "--log-format", "json")
    workers.append(worker)
    banner = _banner(worker)
    url = banner["metrics"]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    assert banner["queues"] == {"default": 10, "slow": 2} and banner["schema"] == "trioq"
    assert "password" not in banner["database"] and banner["worker_id"]

    _enqueue(dsn, "ok", 30)
    _enqueue(dsn, "flaky", 10)
    _enqueue(dsn, "doomed", 5, attempts=1)
    series = _scrape_until(url, "trioq_jobs_completed_total", 10, queue="default", task="flaky")
    series = _scrape_until(url, "trioq_jobs_dead_total", 5, queue="default", task="doomed")

    def v(name: str, **labels: str) -> float | None:
        return _value(series, name, **labels)

    d = {"queue": "default"}
    assert v("trioq_jobs_completed_total", **d, task="ok") == 30
    assert v("trioq_jobs_retried_total", **d, task="flaky") == 10
    assert v("trioq_jobs_retried_total", **d, task="ok") == 0
    assert v("trioq_jobs_claimed_total", **d, task="ok") == 30
    assert v("trioq_jobs_claimed_total", **d, task="flaky") == 20  # two attempts each
    assert v("trioq_jobs_claimed_total", **d, task="doomed") == 5
    assert v("trioq_job_execution_seconds_count", **d, task="ok") == 30
    assert v("trioq_job_execution_seconds_bucket", **d, task="ok", le="+Inf") == 30
    assert v("trioq_job_queue_wait_seconds_count", **d, task="flaky") == 20
    assert v("trioq_outcomes_written_total") == 55
    assert v("trioq_claim_batch_size_sum", queue="default") == 55
    assert v("trioq_slots", queue="default") == 10 and v("trioq_slots", queue="slow") == 2
    assert v("trioq_claim_errors_total", queue="default") == 0
    assert v("trioq_outcome_write_errors_total") == 0
    assert v("trioq_listener_reconnects_total") == 0
    assert v("trioq_pool_waits_total", pool="runtime") is not None
    assert v("trioq_worker_info", schema="trioq", version=trioq.__version__,
             worker_id=banner["worker_id"]) == 1  # fmt: skip
    # The depth sample is cached (metrics_depth_interval): one taken while the flaky jobs'
    # retries were still waiting shows the dead ones and 5 available; wait for the final one.
    deadline = time.monotonic() + 20
    while (depth := _depth(_scrape(url), "default")) != {"available": 0, "dead": 5}:
        assert time.monotonic() < deadline, depth
        time.sleep(0.1)

    # two jobs hold the slow queue's slots; three more wait behind them
    _enqueue(dsn, "sleeper", 5, queue="slow", args='{"seconds": 60}')
    series = _scrape_until(url, "trioq_slots_busy", 2, queue="slow")
    series = _scrape_until(url, "trioq_queue_depth", 3, queue="slow", state="available")
    assert _value(series, "trioq_queue_depth", queue="slow", state="running") == 2
    held = _value(series, "trioq_leases_held")
    assert held is not None and held >= 2
    wait = _value(series, "trioq_queue_oldest_wait_seconds", queue="slow")
    assert wait is not None and 0 <= wait < 60

    logs = worker.stop()
    assert worker.proc.returncode == 0
    records = [json.loads(line) for line in logs.splitlines()]  # every line is one object
    retries = [r for r in records if "retrying in" in r["message"]]
    assert len(retries) == 10
    assert {(r["task"], r["queue"], r["attempt"], r["delay"]) for r in retries} == {
        ("flaky", "default", 1, 0.0)
    }
    deaths = [r for r in records if "died after attempt" in r["message"]]
    assert len(deaths) == 5 and {r["reason"] for r in deaths} == {"attempts exhausted"}
    assert all(isinstance(r["job_id"], int) for r in retries + deaths)


def _free_ports(n: int) -> int:
    """The first of ``n`` consecutive ports that nothing listens on now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        if first + n > 65535:
            continue
        socks = []
        try:
            for port in range(first, first + n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return int(first)
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise AssertionError("no free consecutive ports")


def test_each_process_of_serve_processes_gets_its_own_port(
    dsn: str, workers: list[Worker]
) -> None:
    _migrate(dsn)
    first = _free_ports(2)
    worker = Worker(dsn, "--processes", "2", "--metrics", f"127.0.0.1:{first}")
    workers.append(worker)
    for port in (first, first + 1):
        worker.read_until(f"metrics http://127.0.0.1:{port}/metrics")
    _enqueue(dsn, "ok", 200)
    deadline = time.monotonic() + 30
    while True:
        done = [_value(_scrape(f"http://127.0.0.1:{port}/metrics"), "trioq_jobs_completed_total",
                       queue="default", task="ok") or 0 for port in (first, first + 1)]  # fmt: skip
        if sum(done) == 200:
            break
        assert time.monotonic() < deadline, done
        time.sleep(0.1)
    worker.stop()
    assert worker.proc.returncode == 0


def _serve_once(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trioq._cli", "serve", "--app", "obs_app:config", *args],
        env=cli_env(dsn=dsn, apps=True), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_metrics_address_errors_are_one_line(dsn: str) -> None:
    _migrate(dsn)
    for address, expected in (
        ("nonsense", "--metrics must look like HOST:PORT"),
        ("127.0.0.1:70000", "--metrics must look like HOST:PORT"),
    ):
        run = _serve_once(dsn, "--metrics", address)
        assert run.returncode == 1, run.stderr
        assert run.stderr.strip().splitlines() == [f"trioq: error: {expected} (e.g. 127.0.0.1:"
                                                   "9100, [::1]:9100, 0.0.0.0:9100) or HOST:"
                                                   f"FIRST-LAST (a range of ports), got "
                                                   f"{address!r}"]  # fmt: skip
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = _serve_once(dsn, "--metrics", f"127.0.0.1:{port}")
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        f"trioq: error: metrics: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


def test_the_banner_says_where_and_warns_about_queues(dsn: str, workers: list[Worker]) -> None:
    _migrate(dsn)
    worker = Worker(dsn, "--queues", "default,emial")
    workers.append(worker)
    banner = worker.read_until("trioq.runtime INFO trioq worker ")
    assert "schema trioq (version" in banner and "metrics off" in banner
    assert "queues default (10 slots), emial (10 slots), 4 tasks" in banner
    assert "database postgresql://" in banner
    misspelt = worker.read_until("trioq.runtime WARNING queue 'emial' is served")
    assert "no registered task uses it (tasks use default, slow): is it misspelt?" in misspelt
    unserved = worker.read_until("trioq.runtime WARNING task sleeper use")
    assert "queue 'slow', which this worker does not serve" in unserved
    worker.stop()
    quiet = Worker(dsn, "--log-level", "warning", "--log-format", "json")
    workers.append(quiet)
    _enqueue(dsn, "flaky", 1)
    _enqueue(dsn, "doomed", 1, attempts=1)
    quiet.read_until("died after attempt 1 of 1")
    logs = quiet.stop()
    levels = {json.loads(line)["level"] for line in logs.splitlines()}
    assert levels == {"WARNING"}  # no banner, no retry: they are INFO


def test_the_banner_names_the_session_database_and_unprepared_statements() -> None:
    from trioq._worker.banner import banner

    common: dict[str, Any] = dict(
        schema="trioq", version=9, worker_id="w", queues={}, registry=trioq.Registry(),
        metrics_url=None,
    )  # fmt: skip
    pooled = banner(dsn="postgresql://app:secret@bouncer:6432/app", prepared=False,
                    session_dsn="postgresql://app:secret@db:5432/app", **common)[0]  # fmt: skip
    assert ("database postgresql://app@bouncer:6432/app (session database "
            "postgresql://app@db:5432/app: listener, liveness lock), statements not "
            "prepared, schema trioq") in pooled.message  # fmt: skip
    assert pooled.extra["session_database"] == "postgresql://app@db:5432/app"
    assert pooled.extra["prepared_statements"] is False and "secret" not in pooled.message
    same = "postgresql://db:5432/app"
    direct = banner(dsn=same, session_dsn=same, **common)[0]
    assert "started: database postgresql://db:5432/app, schema trioq" in direct.message
    assert direct.extra["session_database"] is None


@pytest.mark.parametrize(
    "address",
    ["", ":9100", "host", "host:", "host:-1", "host:65536", "host:9100-9000", "host:0-5",
     "ho st:9100", "host\x00:9100", "host\n:9100", "host:9 100", "host:٣", 9100],
)  # fmt: skip
def test_bad_metrics_addresses_are_refused_at_construction(address: Any) -> None:
    with pytest.raises((ValueError, TypeError), match="metrics must"):
        trioq.Config(registry=trioq.Registry(), metrics=address)


def test_good_metrics_addresses() -> None:
    from trioq._config import parse_address

    assert parse_address("0.0.0.0:9100") == ("0.0.0.0", 9100, 9100)
    assert parse_address("[::1]:0") == ("::1", 0, 0)
    assert parse_address("localhost:9100-9103") == ("localhost", 9100, 9103)


async def test_task_names_no_task_has_are_folded_beyond_the_cap(dsn: str) -> None:
    """Rows can name any task: past the first MAX_TASK_LABELS names no registered task has,
    the rest share one label value (counted), and a registered task keeps its own."""
    import trio
    from helpers import serving

    from trioq._obs.metrics import MAX_TASK_LABELS, OTHER_TASK

    names = MAX_TASK_LABELS + 100
    tasks = trioq.Registry()

    @tasks.task
    async def ok(job: trioq.JobContext) -> None:
        pass

    async with serving(dsn, tasks, metrics="127.0.0.1:0", unknown_task_timeout=60) as (
        conn, runtime,
    ):  # fmt: skip
        # the even ones have been unknown for 2 minutes: they die at once (history's
        # trioq_jobs_dead_total); the odd ones are given back (trioq_jobs_unknown_task_total)
        await conn.execute(
            "INSERT INTO trioq.jobs (task, queue, args, unknown_since)"
            " SELECT 'ghost_' || i, 'default', '{}',"
            "        CASE WHEN i %% 2 = 0 THEN now() - interval '2 minutes' END"
            "   FROM generate_series(1, %s) AS i", (names,),
        )  # fmt: skip
        for _ in range(5):  # after the ghosts (ids, run_at): claimed once the cap is full
            await ok.enqueue(conn)
        await conn.execute("SELECT pg_notify('trioq_trioq', 'default')")
        with trio.fail_after(30):
            while runtime.statistics().outcomes_written < names + 5:  # noqa: ASYNC110
                await trio.sleep(0.02)  # each ghost given back or dead, each ok completed
        assert runtime.metrics_url is not None
        series = await trio.to_thread.run_sync(_scrape, runtime.metrics_url)

    def total(name: str, task: str | None = None) -> float:
        return sum(v for (n, labels), v in series.items()
                   if n == name and (task is None or ("task", task) in labels))  # fmt: skip

    tasks_seen = {v for (_, labels) in series for k, v in labels if k == "task"}
    ghosts = {f"ghost_{i}" for i in range(1, MAX_TASK_LABELS + 1)}  # the first ones claimed
    assert tasks_seen == {"ok", OTHER_TASK} | ghosts
    assert _value(series, "trioq_task_label_cap") == MAX_TASK_LABELS
    assert _value(series, "trioq_task_labels_folded") == 100
    # nothing is lost: the counts of the folded names are under OTHER_TASK
    assert total("trioq_jobs_claimed_total") == names + 5
    assert total("trioq_jobs_claimed_total", OTHER_TASK) == 100
    assert total("trioq_jobs_unknown_task_total") == names / 2
    assert total("trioq_jobs_unknown_task_total", OTHER_TASK) == 50
    assert total("trioq_jobs_dead_total") == names / 2
    assert total("trioq_jobs_dead_total", OTHER_TASK) == 50
    assert _value(series, "trioq_jobs_claimed_total", queue="default", task="ghost_500") == 1
    assert _value(series, "trioq_jobs_completed_total", queue="default", task="ok") == 5
