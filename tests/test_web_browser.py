"""The dashboard in a real browser: Debian's Chromium driven by Playwright, against real
``trioq serve`` and ``trioq web`` processes and real Postgres.

Playwright's sync API runs here (its async API needs asyncio); the tests are plain sync
tests, the servers are subprocesses. Chromium is ``/usr/bin/chromium`` (``.ci/run``
installs it); Playwright never downloads a browser. Without Chromium these tests fail,
saying so, unless ``TRIOQ_SKIP_BROWSER_TESTS=1`` (for a developer's machine).

Every page a test opens may load only from the dashboard's own address, and may log no
error to the console.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from clitool import TESTS, cli_env
from helpers import assert_missing_fails, installed
from pgcluster import create_database, drop_database
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

pytestmark = pytest.mark.slow

CHROMIUM = pathlib.Path("/usr/bin/chromium")
SKIP_VAR = "TRIOQ_SKIP_BROWSER_TESTS"
#: As the probe of this machine found: no first-run work, no calls home (refused here).
#: The attacker's name of the DNS-rebinding test resolves to the dashboard's address.
REBOUND = "rebound.test"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"]  # fmt: skip
TOKEN = "browser-test-token-0123456789"
LIVE = 20_000  # ms a live update may take (polls every 2 s, charts every 5 s)


def _chromium() -> str:
    return installed(CHROMIUM, skip_var=SKIP_VAR, needs="the dashboard's browser tests need "
                     "Chromium (apt-get install -y chromium; .ci/run does this)")  # fmt: skip


def test_without_chromium_the_tests_fail_and_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing browser is a failure (a skipped test is not a passing one), unless asked."""
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", pathlib.Path("/nonexistent/chromium"))
    assert_missing_fails(monkeypatch, _chromium, skip_var=SKIP_VAR,
                         match=r"apt-get install -y chromium")  # fmt: skip


# -- processes ------------------------------------------------------------------------------------


def _first_line(proc: subprocess.Popen[str], log: pathlib.Path, prefix: str,
                timeout: float = 60) -> str:  # fmt: skip
    """The first line of the process's output that starts with ``prefix`` (polled, bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        text = log.read_text(errors="replace")
        for line in text.splitlines():
            if line.startswith(prefix):
                return line
        assert proc.poll() is None, f"exited before {prefix!r}: {text}"
        assert time.monotonic() < deadline, f"no {prefix!r} line: {text}"
        time.sleep(0.05)


class Stack:
    """The database, and the trioq processes the tests start (all stopped at the end)."""

    def __init__(self, dsn: str, logs: pathlib.Path) -> None:
        self.dsn = dsn
        self.logs = logs
        self.procs: list[subprocess.Popen[str]] = []
        self.worker: subprocess.Popen[str] | None = None

    def _popen(self, *args: str, env: dict[str, str] | None = None
               ) -> tuple[subprocess.Popen[str], pathlib.Path]:  # fmt: skip
        """A trioq command, its output in a file (a pipe nobody reads could fill up)."""
        log = self.logs / f"{len(self.procs)}-{args[0]}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "trioq._cli", *args, "--dsn", self.dsn],
                cwd=TESTS, env=env or cli_env(apps=True), text=True, stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.procs.append(proc)
        return proc, log

    def web(self, *flags: str, env: dict[str, str] | None = None) -> str:
        """Start ``trioq web`` on a free port; its address."""
        proc, log = self._popen("web", "--bind", "127.0.0.1:0", "--app", "web_app:config",
                                *flags, env=env)  # fmt: skip
        line = _first_line(proc, log, "trioq web: serving ")
        return line.split()[3].rstrip("/")

    def start_worker(self) -> None:
        if self.worker is None:
            self.worker, _ = self._popen("serve", "--app", "web_app:config")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate(timeout=30)

    # the database, from the test's side

    def sql(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def enqueue(self, queue: str, task: str, args: str, n: int = 1, max_attempts: int = 25
                ) -> list[int]:  # fmt: skip
        rows = self.sql(
            "INSERT INTO trioq.jobs (queue, task, args, max_attempts)"
            " SELECT %s, %s, %s::jsonb, %s FROM generate_series(1, %s) RETURNING id",
            queue,
            task,
            args,
            max_attempts,
            n,
        )
        self.sql("SELECT pg_notify('trioq_trioq', %s)", queue)
        return [r[0] for r in rows]

    def wait_for(self, statement: str, expected: Any, *params: Any, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while (got := self.sql(statement, *params)) != expected:
            assert time.monotonic() < deadline, f"{statement!r}: {got!r}, wanted {expected!r}"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def stack(pg_admin_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    name = f"trioq_web_browser_{os.getpid()}"
    dsn = create_database(pg_admin_dsn, name)
    subprocess.run([sys.executable, "-m", "trioq._cli", "migrate", "--dsn", dsn], check=True,
                   capture_output=True, env=cli_env(apps=True), timeout=60)  # fmt: skip
    stack = Stack(dsn, tmp_path_factory.mktemp("web-browser-logs"))
    stack.sql("CREATE TABLE web_switch (name text PRIMARY KEY, fail bool NOT NULL)")
    try:
        yield stack
    finally:
        stack.stop()
        drop_database(pg_admin_dsn, name)


@pytest.fixture(scope="module")
def web(stack: Stack) -> str:
    return stack.web()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = _chromium()
    playwright: Playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


class Watched:
    """A page, with every URL it requested and every console error it logged."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.requests: list[str] = []
        self.errors: list[str] = []
        page.on("request", lambda r: self.requests.append(r.url))
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))

    def assert_clean(self, origin: str) -> None:
        foreign = [url for url in self.requests if not url.startswith(origin + "/")]
        assert not foreign, f"loaded from elsewhere: {foreign}"
        assert not self.errors, self.errors


@pytest.fixture
def watched(browser: Browser) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    try:
        yield Watched(context.new_page())
    finally:
        context.close()


# -- the tests ------------------------------------------------------------------------------------


def test_counts_change_as_jobs_run(stack: Stack, web: str, watched: Watched) -> None:
    page = watched.page
    stack.enqueue("web", "quick", '{"seconds": 0.1}', n=40)
    page.goto(web + "/")
    available = page.locator('tr[data-queue="web"] td[data-state="available"]')
    expect(available).to_have_text("40")
    stack.start_worker()
    expect(available).to_have_text("0", timeout=LIVE)  # no reload: the overview polls
    expect(page.locator("#total-completed")).to_have_text("40", timeout=LIVE)  # the history
    expect(page.locator('.chart[data-range="hour"] canvas').first).to_be_visible()
    watched.assert_clean(web)


def test_a_dead_jobs_traceback_then_retry_it_and_watch_it_complete(
    stack: Stack, web: str, watched: Watched
) -> None:
    page = watched.page
    stack.start_worker()
    stack.sql("INSERT INTO web_switch VALUES ('a', true)")
    (job_id,) = stack.enqueue("web", "flaky", '{"name": "a"}', max_attempts=1)
    stack.wait_for("SELECT count(*) FROM trioq.dead_jobs WHERE id = %s", [(1,)], job_id)
    page.goto(web + "/jobs?state=dead")
    page.locator(f'tr[data-job="{job_id}"] a').first.click()
    traceback = page.locator("#traceback")
    expect(traceback).to_contain_text("RuntimeError: switch 'a' is on: failing on purpose")
    expect(traceback).to_contain_text("web_app.py")
    stack.sql("UPDATE web_switch SET fail = false WHERE name = 'a'")
    page.locator("#retry").click()
    expect(page.locator("#count")).to_have_text("1")
    page.locator("#confirm").click()
    expect(page.locator("#done")).to_have_text("retried 1 dead jobs")
    expect(page.locator("#state")).to_have_text("done", timeout=LIVE)  # the page polls
    expect(page.locator("#result")).to_contain_text('"ok": "a"')
    watched.assert_clean(web)


def test_cancel_a_running_job(stack: Stack, web: str, watched: Watched) -> None:
    page = watched.page
    stack.start_worker()
    (job_id,) = stack.enqueue("slow", "sleeper", '{"seconds": 600}')
    stack.wait_for("SELECT state FROM trioq.jobs WHERE id = %s", [("running",)], job_id)
    page.goto(f"{web}/jobs/{job_id}")
    expect(page.locator("#state")).to_have_text("running")
    expect(page.locator("#lease-owner")).not_to_have_text("-")
    page.locator("#cancel").click()
    expect(page.locator("#what")).to_contain_text(f"Cancel running job {job_id}")
    page.locator("#confirm").click()
    expect(page.locator("#done")).to_contain_text("cancel requested")
    expect(page.locator("#state")).to_have_text("cancelled", timeout=LIVE)
    watched.assert_clean(web)


def test_a_running_jobs_progress_updates_live(stack: Stack, web: str, watched: Watched) -> None:
    """``job.progress()`` on the job's page, and its bar, move with no reload."""
    page = watched.page
    stack.start_worker()
    (job_id,) = stack.enqueue("slow", "stepper", '{"name": "p", "steps": 4}')
    stack.wait_for("SELECT progress FROM trioq.jobs WHERE id = %s",
                   [({"done": 1, "of": 4},)], job_id)  # fmt: skip
    page.goto(f"{web}/jobs/{job_id}")
    expect(page.locator("#progress-value")).to_contain_text('"done": 1')
    expect(page.locator("#progress-bar")).to_have_attribute("value", "0.25")
    stack.sql("INSERT INTO web_switch VALUES ('p-1', false), ('p-2', false)")
    expect(page.locator("#progress-value")).to_contain_text('"done": 3', timeout=LIVE)
    expect(page.locator("#progress-bar")).to_have_attribute("value", "0.75")
    stack.sql("INSERT INTO web_switch VALUES ('p-3', false), ('p-4', false)")
    expect(page.locator("#state")).to_have_text("done", timeout=LIVE)
    expect(page.locator("#progress-value")).to_contain_text('"done": 4')  # kept with the result
    expect(page.locator("#progress-bar")).to_have_attribute("value", "1.0")
    watched.assert_clean(web)


def test_pause_a_queue_and_see_claims_stop(stack: Stack, web: str, watched: Watched) -> None:
    """Paused from the overview, the queue's new jobs stay available while the same worker
    runs another queue's job (so it is alive and claiming); resumed, they run."""
    page = watched.page
    stack.start_worker()
    page.goto(web + "/")
    row = page.locator('tr[data-queue="web"]')
    row.locator('[data-action="pause"]').click()
    expect(page.locator("#what")).to_contain_text("Pause queue web?")
    page.locator("#confirm").click()
    expect(page.locator("#done")).to_contain_text("paused: no worker claims")
    expect(row.locator('[data-paused="1"]')).to_have_text("paused")
    stack.wait_for("SELECT paused FROM trioq.queues WHERE name = 'web'", [(True,)])
    paused = stack.enqueue("web", "quick", '{"seconds": 0.01}', n=5)
    (other,) = stack.enqueue("slow", "sleeper", '{"seconds": 0.01}')
    stack.wait_for("SELECT count(*) FROM trioq.jobs WHERE id = %s", [(0,)], other)  # it ran
    expect(row.locator('td[data-state="available"]')).to_have_text("5", timeout=LIVE)
    never_claimed = "SELECT count(*) FROM trioq.jobs WHERE id = ANY(%s) AND attempt = 0"
    assert stack.sql(never_claimed, paused) == [(5,)]
    row.locator('[data-action="resume"]').click()
    expect(page.locator("#what")).to_contain_text("Resume queue web?")
    page.locator("#confirm").click()
    expect(page.locator("#done")).to_contain_text("resumed")
    expect(row.locator('td[data-state="available"]')).to_have_text("0", timeout=LIVE)
    stack.wait_for("SELECT count(*) FROM trioq.jobs WHERE id = ANY(%s)", [(0,)], paused)
    watched.assert_clean(web)


def test_the_cron_page_shows_schedule_last_and_next_tick(
    stack: Stack, web: str, watched: Watched
) -> None:
    page = watched.page
    stack.start_worker()  # its scheduler records the entry's latest tick when it first sees it
    tick = "SELECT max(tick) FROM trioq.cron_ticks WHERE name = 'new-year'"
    stack.wait_for(f"SELECT ({tick}) IS NOT NULL", [(True,)])
    ((last,),) = stack.sql(
        f"SELECT to_char(({tick}) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC'"
    )
    page.goto(web + "/cron")
    row = page.locator('tr[data-entry="new-year"]')
    expect(row).to_contain_text("0 0 1 1 *")
    expect(row.locator(".last")).to_contain_text(last)
    expect(row.locator(".next")).to_contain_text("-01-01 00:00:00 UTC")
    watched.assert_clean(web)


def test_read_only_mode_hides_and_refuses_actions(stack: Stack, watched: Watched) -> None:
    page = watched.page
    stack.start_worker()
    stack.sql("INSERT INTO web_switch VALUES ('ro', true)")
    (job_id,) = stack.enqueue("web", "flaky", '{"name": "ro"}', max_attempts=1)
    stack.wait_for("SELECT count(*) FROM trioq.dead_jobs WHERE id = %s", [(1,)], job_id)
    read_only = stack.web("--read-only")
    page.goto(f"{read_only}/jobs/{job_id}")
    expect(page.locator("#read-only")).to_be_visible()
    expect(page.locator("#traceback")).to_be_visible()
    expect(page.locator("#retry")).to_have_count(0)
    refused = page.request.post(f"{read_only}/actions/retry", form={"ids": str(job_id)})
    assert refused.status == 403 and "read-only" in refused.text()
    assert page.goto(f"{read_only}/confirm/retry?ids={job_id}").status == 403  # type: ignore[union-attr]
    stack.wait_for("SELECT count(*) FROM trioq.dead_jobs WHERE id = %s", [(1,)], job_id)


def test_a_page_without_the_token_is_refused(stack: Stack, browser: Browser) -> None:
    guarded = stack.web(env=cli_env({"TRIOQ_WEB_TOKEN": TOKEN}, apps=True))
    context = browser.new_context()
    try:
        page = context.new_page()
        refused = page.goto(guarded + "/jobs")
        assert refused is not None and refused.status == 401
        expect(page.locator("h1")).to_have_text("This dashboard needs its access token")
        assert TOKEN not in page.content()
        entered = page.goto(f"{guarded}/?token={TOKEN}")
        assert entered is not None and entered.status == 200
        assert "token=" not in page.url  # redirected to the page without it
        expect(page.locator("#queues")).to_be_visible()
        assert page.goto(guarded + "/jobs").status == 200  # type: ignore[union-attr]
    finally:
        context.close()
    stranger = browser.new_context()
    try:
        assert stranger.new_page().goto(guarded + "/jobs").status == 401  # type: ignore[union-attr]
    finally:
        stranger.close()


def test_a_rebound_name_can_neither_read_a_page_nor_post(
    stack: Stack, web: str, browser: Browser
) -> None:
    """DNS rebinding in Chromium: the attacker's name resolves to the dashboard's address
    (``--host-resolver-rules``), so its page is same-origin with what it loads from there.
    Before: it read every page, took a CSRF token from a confirmation page and purged a
    dead job. Now every request for that name gets 421, the page and its fetches alike."""
    stack.start_worker()
    stack.sql("INSERT INTO web_switch VALUES ('rebound', true)")
    (job_id,) = stack.enqueue("web", "flaky", '{"name": "rebound"}', max_attempts=1)
    stack.wait_for("SELECT count(*) FROM trioq.dead_jobs WHERE id = %s", [(1,)], job_id)
    port = web.rsplit(":", 1)[1]
    attacker = browser.new_context(bypass_csp=True)
    try:
        page = attacker.new_page()
        origin = f"http://{REBOUND}:{port}"
        landed = page.goto(f"{origin}/confirm/purge?ids={job_id}")
        assert landed is not None and landed.status == 421
        assert 'name="csrf"' not in page.content()
        expect(page.locator("h1")).to_have_text("This dashboard is not served under this name")
        statuses = page.evaluate("""async (id) => [
            (await fetch('/jobs?state=dead')).status,
            (await fetch('/actions/purge', {method: 'POST', body: new URLSearchParams(
                {ids: String(id), csrf: 'x'})})).status]""", job_id)  # fmt: skip
        assert statuses == [421, 421]
    finally:
        attacker.close()
    stack.wait_for("SELECT count(*) FROM trioq.dead_jobs WHERE id = %s", [(1,)], job_id)
