"""The dashboard in-process (an ASGI call per request, real Postgres): pages, actions, the
CSRF and token guards, read-only mode, hostile input, mounting under a prefix, and no DSN
or password in anything it sends. The browser tests are ``tests/test_web_browser.py``."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from asgi import Reply, call
from clitool import trioq_cli
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from starlette.applications import Starlette
from starlette.routing import Mount

import trioq
import trioq.web
from trioq import Failure, JobSpec, Lease, Queue
from trioq._db.statements import statements
from trioq.web import _app, _queries
from trioq.web._limits import MAX_QUEUES

OWNER = "host-a:4242:abcd1234"
TOKEN = "s3cret-token-for-the-tests"


async def _jobs(dsn: str) -> dict[str, int]:
    """One job in every state; their ids by state."""
    q = Queue()
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        ids = [r.job_id for r in await q.enqueue_many(conn, [
            JobSpec(task="send", queue="email", args={"user_id": 42, "to": "ada@example.com"}),
            JobSpec(task="send", queue="email", args={"user_id": 7}),
            JobSpec(task="later", queue="email", delay=3600),
            JobSpec(task="run", queue="work"),
            JobSpec(task="boom", queue="work", args={"why": "<script>alert(1)</script>"}),
            JobSpec(task="keep", queue="work"),
        ])]  # fmt: skip
        claimed = await q.claim(conn, "work", owner=OWNER, limit=3, lease=dt.timedelta(60))
        by_task = {job.task: job for job in claimed}
        boom = by_task["boom"]
        await q.fail_many(conn, owner=OWNER, failures=[Failure(
            lease=Lease(boom.id, boom.attempt), error="RuntimeError: boom",
            traceback="Traceback (most recent call last):\n  ...\nRuntimeError: boom", fatal=True,
        )])  # fmt: skip
        keep = by_task["keep"]
        await q.complete_many(conn, owner=OWNER, leases=[Lease(keep.id, keep.attempt)],
                              results=[{"sent": True}])  # fmt: skip
        await q.cancel(conn, ids[1])
    return {"available": ids[0], "cancelled": ids[1], "scheduled": ids[2], "running": ids[3],
            "dead": ids[4], "done": ids[5]}  # fmt: skip


@asynccontextmanager
async def _dashboard(dsn: str, **options: Any) -> AsyncIterator[trioq.web.Dashboard]:
    """The dashboard app of ``dsn``, closed at the end."""
    app = trioq.web.app(dsn, **options)
    try:
        yield app
    finally:
        await app.aclose()


async def _csrf(app: Any, path: str = "/confirm/purge?all=1") -> tuple[dict[str, str], str]:
    """The cookies a browser gets from a page, and the CSRF token in its forms."""
    reply = await call(app, "GET", path)
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', reply.text)
    assert found, reply.text
    return reply.cookies(), found[1]


# -- pages ----------------------------------------------------------------------------------------


async def test_the_workers_table_shows_registered_workers_idle_ones_too(dsn: str) -> None:
    """Registered workers (liveness) with their queues' slots and last ping; an idle one is
    listed; one that stopped pinging is marked; a lease owner without a row still shows."""
    await _jobs(dsn)  # OWNER holds one running job's lease, and is not registered
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO trioq.workers (name, host, pid, queues, seen_at) VALUES"
            " ('hostA:111:aaaa', 'hostA', 111, '{\"email\": 10, \"work\": 4}', now()),"
            " ('hostB:222:bbbb', 'hostB', 222, '{\"email\": 2}', now() - interval '1 minute')"
        )
    async with _dashboard(dsn) as app:
        live = (await call(app, "GET", "/live/overview")).text
        idle = live[live.index('data-owner="hostA:111:aaaa"') :]
        idle = idle[: idle.index("</tr>")]
        assert "email</a> (0 / 10)" in idle and "work</a> (0 / 4)" in idle
        assert "gone?" not in idle
        gone = live[live.index('data-owner="hostB:222:bbbb"') :]
        assert 'class="bad"' in gone[: gone.index("</tr>")]
        assert f'data-owner="{OWNER}"' in live  # from its lease


async def test_every_page_renders_what_is_there(dsn: str) -> None:
    ids = await _jobs(dsn)
    async with _dashboard(dsn) as app:
        overview = await call(app, "GET", "/")
        assert overview.status == 200
        for queue in ("email", "work"):
            assert f'data-queue="{queue}"' in overview.text
        assert OWNER in overview.text and "4242" in overview.text  # the worker, by its lease
        live = await call(app, "GET", "/live/overview")
        assert live.status == 200 and "<html" not in live.text  # a fragment
        for state, job_id in ids.items():
            page = await call(app, "GET", f"/jobs?state={state}")
            assert page.status == 200 and f'data-job="{job_id}"' in page.text, state
            job = await call(app, "GET", f"/jobs/{job_id}")
            assert job.status == 200 and f'id="state">{state}<' in job.text, state
        dead = (await call(app, "GET", f"/jobs/{ids['dead']}")).text
        assert "RuntimeError: boom" in dead and 'id="traceback"' in dead
        assert "<script>alert" not in dead and "&lt;script&gt;" in dead  # args are escaped
        done = (await call(app, "GET", f"/jobs/{ids['done']}")).text
        assert "&#34;sent&#34;: true" in done  # escaped, as every value is
        assert (await call(app, "GET", "/cron")).status == 200
        history = await call(app, "GET", "/api/history?range=day")
        assert history.status == 200 and len(history.text) > 1000
        gone = await call(app, "GET", "/jobs/999999")
        assert gone.status == 404 and "finished jobs are deleted" in gone.text


async def test_a_large_result_is_not_read_to_show_its_page(dsn: str) -> None:
    """Before: the job page (which refreshes every 2 s) read a kept result whole, 50 MB
    each time. Now over 1 MiB stored it reads only its size."""
    ids = await _jobs(dsn)
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE trioq.jobs SET result = to_jsonb((SELECT string_agg(md5(i::text), '')"
            " FROM generate_series(1, 200000) i)) WHERE id = %s", (ids["done"],),
        )  # fmt: skip
        cur = await conn.execute("SELECT pg_column_size(result) FROM trioq.jobs WHERE id = %s",
                                 (ids["done"],))  # fmt: skip
        (stored,) = await cur.fetchone() or (0,)
    assert stored > _queries.LOAD_LIMIT
    async with _dashboard(dsn) as app:
        for path in (f"/jobs/{ids['done']}", f"/jobs/{ids['done']}/live"):
            page = await call(app, "GET", path)
            assert page.status == 200, path
            assert f"{stored:,} bytes stored: too large to" in page.text
            assert len(page.body) < 64 * 1024
        kept = await call(app, "GET", f"/jobs/{ids['available']}")
        assert kept.status == 200 and "too large" not in kept.text


async def test_the_cron_page_shows_the_databases_entries(dsn: str) -> None:
    """Read-only: the app's entries, the database's (broken and shadowed ones marked, their
    text escaped), and names only ticks are known of."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        q = trioq.Queue()
        await q.add_cron(conn, trioq.CronEntry(name="stored", schedule="*/5 * * * *",
                                               task="report", queue="reports"))  # fmt: skip
        await q.add_cron(conn, trioq.CronEntry(name="nightly", schedule="@daily", task="x"))
        await q.add_cron(conn, trioq.CronEntry(name="off", schedule="@daily", task="x"),
                         enabled=False)  # fmt: skip
        await conn.execute(
            "INSERT INTO trioq.cron_entries (name, schedule, task, timezone) VALUES"
            " ('odd', '0 0 * * *', 't', '<script>alert(1)</script>');"
            " INSERT INTO trioq.cron_ticks (name, tick) VALUES ('retired', now())"
        )
    app_entry = trioq.CronEntry(name="nightly", schedule="0 3 * * *", task="report")
    async with _dashboard(dsn, cron=[app_entry]) as app:
        page = (await call(app, "GET", "/cron")).text

    def row(name: str, source: str) -> str:
        found = page[page.index(f'data-entry="{name}" data-source="{source}"'):]
        return found[: found.index("</tr>")]

    stored = row("stored", "database")
    assert "*/5 * * * *" in stored and "reports" in stored and "UTC (in " in stored
    assert "not run: the app's entry of this name wins" in row("nightly", "database")
    assert "0 3 * * *" in row("nightly", "app")
    assert ">disabled<" in row("off", "database")
    odd = row("odd", "database")
    assert "broken: cron entry &#39;odd&#39;: timezone &#39;&lt;script&gt;" in odd
    assert "<script>" not in page
    assert "not in this app" in row("retired", "")


async def test_search_by_id_args_json_and_text(dsn: str) -> None:
    ids = await _jobs(dsn)
    async with _dashboard(dsn) as app:
        found = await call(app, "GET", f"/jobs?q={ids['dead']}")
        assert found.status == 303 and found.header("location") == f"/jobs/{ids['dead']}"
        by_json = await call(app, "GET", '/jobs?state=available&q={"user_id":%2042}')
        assert f'data-job="{ids["available"]}"' in by_json.text
        by_text = await call(app, "GET", "/jobs?state=available&q=ada@example")
        assert f'data-job="{ids["available"]}"' in by_text.text
        neither = await call(app, "GET", '/jobs?state=available&q={"user_id":%207}')
        assert "data-job=" not in neither.text and "No available jobs match" in neither.text
        by_task = await call(app, "GET", "/jobs?state=available&task=nope")
        assert "data-job=" not in by_task.text


async def test_every_response_carries_the_security_headers(dsn: str) -> None:
    await _jobs(dsn)
    async with _dashboard(dsn) as app:
        for path in ("/", "/jobs", "/static/trioq.js", "/nope", "/api/history"):
            reply = await call(app, "GET", path)
            csp = reply.header("content-security-policy") or ""
            assert "default-src 'self'" in csp and "script-src 'self'" in csp, path
            assert reply.header("x-frame-options") == "DENY", path
            assert reply.header("referrer-policy") == "same-origin", path


# -- actions --------------------------------------------------------------------------------------


async def test_retry_purge_and_cancel_through_confirmation(dsn: str) -> None:
    ids = await _jobs(dsn)
    async with _dashboard(dsn) as app:
        cookies, csrf = await _csrf(app, f"/confirm/retry?ids={ids['dead']}")
        confirm = await call(app, "GET", f"/confirm/retry?ids={ids['dead']}", cookies=cookies)
        assert 'id="count">1<' in confirm.text
        done = await call(app, "POST", "/actions/retry", cookies=cookies,
                          form={"csrf": csrf, "ids": ids["dead"]})  # fmt: skip
        assert done.status == 303
        assert done.header("location") == f"/jobs/{ids['dead']}?done=retry&n=1"
        page = await call(app, "GET", done.header("location") or "", cookies=cookies)
        assert 'id="state">available<' in page.text and "retried 1 dead jobs" in page.text
        cancel = await call(app, "POST", "/actions/cancel", cookies=cookies,
                            form={"csrf": csrf, "ids": ids["running"]})  # fmt: skip
        assert cancel.header("location") == f"/jobs/{ids['running']}?done=requested"
        page = await call(app, "GET", f"/jobs/{ids['running']}", cookies=cookies)
        assert 'id="cancel-requested"' in page.text
    async with await trioq.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT cancel_requested FROM trioq.jobs WHERE id = %s",
                                 (ids["running"],))  # fmt: skip
        assert await cur.fetchone() == (True,)


async def test_pause_and_resume_a_queue_through_confirmation(dsn: str) -> None:
    """The overview's Pause button leads to a confirmation; its POST pauses the queue for
    every worker (the `queues` row), the overview shows it paused with a Resume button, and
    resuming clears it. A paused queue with no jobs still shows, so it can be resumed."""
    await _jobs(dsn)
    async with _dashboard(dsn) as app:
        page = await call(app, "GET", "/")
        assert 'data-action="pause" href="/confirm/pause?queue=email"' in page.text
        cookies, csrf = await _csrf(app, "/confirm/pause?queue=email")
        confirm = await call(app, "GET", "/confirm/pause?queue=email", cookies=cookies)
        assert "Pause queue <code>email</code>?" in confirm.text
        done = await call(app, "POST", "/actions/pause", cookies=cookies,
                          form={"csrf": csrf, "queue": "email"})  # fmt: skip
        assert done.status == 303 and done.header("location") == "/?done=paused"
        page = await call(app, "GET", "/?done=paused", cookies=cookies)
        assert 'id="done">paused: no worker claims' in page.text
        row = re.search(r'<tr data-queue="email" class="paused">.*?</tr>', page.text, re.S)
        assert row and 'data-action="resume"' in row[0], page.text
        async with await trioq.connect(dsn, autocommit=True) as conn:
            assert [s.name for s in await Queue().queue_settings(conn) if s.paused] == ["email"]
            assert await Queue().claim(conn, "email", owner=OWNER, limit=5,
                                       lease=dt.timedelta(60)) == []  # fmt: skip
            await Queue().pause(conn, "idle")  # no job in it: listed, to be resumed
        live = await call(app, "GET", "/live/overview", cookies=cookies)
        assert '<tr data-queue="idle" class="paused">' in live.text
        done = await call(app, "POST", "/actions/resume", cookies=cookies,
                          form={"csrf": csrf, "queue": "email"})  # fmt: skip
        assert done.header("location") == "/?done=resumed"
        async with await trioq.connect(dsn, autocommit=True) as conn:
            assert [s.name for s in await Queue().queue_settings(conn) if s.paused] == ["idle"]
        forged = await call(app, "POST", "/actions/pause", cookies=cookies,
                            form={"csrf": "0" * 64, "queue": "email"})  # fmt: skip
        assert forged.status == 403
    async with await trioq.connect(dsn, autocommit=True) as conn:
        assert [s.name for s in await Queue().queue_settings(conn) if s.paused] == ["idle"]


async def test_a_timed_pause_is_shown_and_can_be_chosen(dsn: str) -> None:
    """The overview shows "paused until <time>"; the confirmation offers a length (only the
    listed ones: anything else is refused and writes nothing)."""
    await _jobs(dsn)
    async with _dashboard(dsn) as app:
        cookies, csrf = await _csrf(app, "/confirm/pause?queue=email")
        confirm = await call(app, "GET", "/confirm/pause?queue=email", cookies=cookies)
        assert '<option value="3600">1 hour</option>' in confirm.text
        for bad in ("60", "-3600", "3600.0", " 3600", "a\x00b", "9" * 400, "\xff"):
            refused = await call(app, "POST", "/actions/pause", cookies=cookies,
                                 form={"csrf": csrf, "queue": "email", "for": bad})  # fmt: skip
            assert refused.status == 400 and "for must be empty" in refused.text, bad
        async with await trioq.connect(dsn, autocommit=True) as conn:
            assert await Queue().queue_settings(conn) == []
        done = await call(app, "POST", "/actions/pause", cookies=cookies,
                          form={"csrf": csrf, "queue": "email", "for": "3600"})  # fmt: skip
        assert done.header("location") == "/?done=paused_until"
        async with await trioq.connect(dsn, autocommit=True) as conn:
            [s] = await Queue().queue_settings(conn)
            now = await Queue().clock(conn)
        assert s.paused and s.paused_until is not None
        assert dt.timedelta(minutes=59) < s.paused_until - now <= dt.timedelta(hours=1)
        shown = s.paused_until.strftime("%Y-%m-%d %H:%M:%S UTC")
        page = await call(app, "GET", "/?done=paused_until", cookies=cookies)
        assert "resumes by itself then" in page.text
        row = re.search(r'<tr data-queue="email" class="paused">.*?</tr>', page.text, re.S)
        assert row and "paused until <time datetime=" in row[0] and shown in row[0], page.text
        resume = await call(app, "GET", "/confirm/resume?queue=email", cookies=cookies)
        assert f"paused until {shown}, and would resume by itself then" in resume.text
        done = await call(app, "POST", "/actions/pause", cookies=cookies,
                          form={"csrf": csrf, "queue": "email", "for": ""})  # until resumed
        assert done.header("location") == "/?done=paused"
        async with await trioq.connect(dsn, autocommit=True) as conn:
            [s] = await Queue().queue_settings(conn)
        assert (s.paused, s.paused_until) == (True, None)


async def test_all_matching_walks_every_batch(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_app, "ACTION_BATCH", 2)
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await conn.execute(
            "INSERT INTO trioq.dead_jobs (id, queue, task, args, priority, attempt,"
            " max_attempts, reason, enqueued_at)"
            " SELECT g, CASE WHEN g <= 5 THEN 'a' ELSE 'b' END, 't', '{}', 0, 1, 1, 'x', now()"
            " FROM generate_series(1, 8) AS g"
        )
    async with _dashboard(dsn) as app:
        cookies, csrf = await _csrf(app)
        confirm = await call(app, "GET", "/confirm/purge?all=1&queue=a", cookies=cookies)
        assert 'id="count">5<' in confirm.text
        done = await call(app, "POST", "/actions/purge", cookies=cookies,
                          form={"csrf": csrf, "all": "1", "queue": "a"})  # fmt: skip
        assert done.header("location") == "/jobs?state=dead&done=purge&n=5"
        done = await call(app, "POST", "/actions/retry", cookies=cookies,
                          form={"csrf": csrf, "all": "1"})  # fmt: skip
        assert done.header("location") == "/jobs?state=dead&done=retry&n=3"
    async with await trioq.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM trioq.dead_jobs),"
            " (SELECT count(*) FROM trioq.jobs WHERE queue = 'b')"
        )
        assert await cur.fetchone() == (0, 3)


async def test_a_post_without_a_valid_csrf_token_is_refused(dsn: str) -> None:
    ids = await _jobs(dsn)
    async with _dashboard(dsn) as app:
        cookies, csrf = await _csrf(app)
        form = {"ids": ids["available"]}
        for attempt in (
            await call(app, "POST", "/actions/cancel", form=form),  # no cookie, no token
            await call(app, "POST", "/actions/cancel", form=form, cookies=cookies),
            await call(app, "POST", "/actions/cancel", form={**form, "csrf": "0" * 64},
                       cookies=cookies),
            await call(app, "POST", "/actions/cancel", form={**form, "csrf": csrf},
                       cookies={"trioq_csrf": "x" * 43}),  # another browser's token
            await call(app, "POST", "/actions/cancel", form={**form, "csrf": csrf},
                       cookies=cookies, headers={"origin": "http://evil.example"}),
        ):  # fmt: skip
            assert attempt.status == 403, attempt.text
            assert "CSRF" in attempt.text
        ok = await call(app, "POST", "/actions/cancel", form={**form, "csrf": csrf},
                        cookies=cookies, headers={"origin": "http://localhost"})  # fmt: skip
        assert ok.status == 303


async def test_read_only_hides_and_refuses_every_action(dsn: str) -> None:
    ids = await _jobs(dsn)
    async with _dashboard(dsn, read_only=True) as app:
        page = await call(app, "GET", f"/jobs/{ids['dead']}")
        assert 'id="read-only"' in page.text and 'id="retry"' not in page.text
        assert 'type="checkbox"' not in (await call(app, "GET", "/jobs?state=dead")).text
        assert (await call(app, "GET", f"/confirm/retry?ids={ids['dead']}")).status == 403
        assert 'data-action="pause"' not in (await call(app, "GET", "/")).text
        assert (await call(app, "GET", "/confirm/pause?queue=email")).status == 403
        for action in ("retry", "purge", "cancel", "pause", "resume"):
            refused = await call(app, "POST", f"/actions/{action}",
                                 form={"ids": ids["dead"], "queue": "email"})  # fmt: skip
            assert refused.status == 403 and "read-only" in refused.text
    async with await trioq.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM trioq.dead_jobs")
        assert await cur.fetchone() == (1,)
        assert not [s for s in await Queue().queue_settings(conn) if s.paused]


# -- the token ----------------------------------------------------------------------------------


async def test_the_token_guards_every_request(dsn: str) -> None:
    await _jobs(dsn)
    async with _dashboard(dsn, token=TOKEN) as app:
        for path in ("/", "/jobs", "/static/trioq.js", "/api/history"):
            refused = await call(app, "GET", path)
            assert refused.status == 401 and TOKEN not in refused.text, path
        assert (await call(app, "GET", "/?token=wrong-token-wrong-token")).status == 401
        entry = await call(app, "GET", f"/jobs?state=dead&token={TOKEN}")
        assert entry.status == 303 and entry.header("location") == "/jobs?state=dead"
        cookies = entry.cookies()
        assert cookies == {"trioq_token": TOKEN}
        assert "HttpOnly" in (entry.header("set-cookie") or "")
        assert (await call(app, "GET", "/jobs", cookies=cookies)).status == 200
        bearer = await call(app, "GET", "/", headers={"authorization": f"Bearer {TOKEN}"})
        assert bearer.status == 200


def _route_paths(app: trioq.web.Dashboard) -> list[str]:
    """Every route of the dashboard, from its route table, with sample values for its
    parameters."""
    paths = []
    for route in app.router.routes:
        path = getattr(route, "path", "")
        paths.append(re.sub(r"\{[^}]+\}", "1", path) or "/")
    assert len(paths) >= 10, paths  # the walk sees the table
    return paths


def _route_urls(app: trioq.web.Dashboard, ids: dict[str, int]) -> list[tuple[str, str]]:
    """(method, url) for every route of the app's route table and every method it takes, each
    parameter filled with every value that reaches a different page: each action, a job id of
    each state, a static file."""
    values: dict[str, list[str]] = {
        "job_id": [str(i) for i in ids.values()], "action": list(_app.ACTIONS),
        "path": ["trioq.js", "trioq.css"],
    }  # fmt: skip
    urls = []
    for route in app.router.routes:
        path = getattr(route, "path", "") or "/"
        methods = sorted(getattr(route, "methods", None) or {"GET"})
        names = re.findall(r"\{(\w+)(?::\w+)?\}", path)
        if isinstance(route, Mount):
            path, names = path + "/{path}", ["path"]
        filled = [path]
        for name in names:
            filled = [re.sub(r"\{" + name + r"(?::\w+)?\}", value, url, count=1)
                      for url in filled for value in values[name]]  # fmt: skip
        urls += [(method, url) for method in methods if method != "HEAD" for url in filled]
    assert len(urls) >= 25, urls  # the walk sees the table
    return urls


async def _snapshot(dsn: str) -> tuple[Any, ...]:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT (SELECT array_agg((id, state, attempt) ORDER BY id) FROM trioq.jobs),"
            " (SELECT array_agg(id ORDER BY id) FROM trioq.dead_jobs),"
            " (SELECT array_agg((name, paused) ORDER BY name) FROM trioq.queues)"
        )
        row = await cur.fetchone()
        assert row is not None
        return tuple(row)


async def test_every_route_with_and_without_the_token_and_read_only(dsn: str) -> None:
    """Every route of the route table, every method it takes, every parameter value: without
    the token 401 and nothing read; with it a page or a refusal, never a 5xx, and a POST
    without a CSRF token refused; read-only refuses every action and every confirmation.
    Nothing in the database changes, and no reply carries the token."""
    ids = await _jobs(dsn)
    before = await _snapshot(dsn)
    bearer = {"authorization": f"Bearer {TOKEN}"}
    async with _dashboard(dsn, token=TOKEN) as app:
        urls = _route_urls(app, ids)
        for method, url in urls:
            refused = await call(app, method, url, form={"all": "1"} if method == "POST" else None)
            assert refused.status == 401, (method, url, refused.status)
            assert TOKEN not in refused.text and "ada@example.com" not in refused.text
            reply = await call(app, method, url, headers=bearer,
                               form={"all": "1", "ids": str(ids["dead"]), "queue": "email"}
                               if method == "POST" else None)  # fmt: skip
            assert reply.status < 500 and reply.status != 401, (method, url, reply.status)
            assert TOKEN not in reply.text
            if method == "POST":
                assert reply.status == 403 and "CSRF" in reply.text, (url, reply.status)
    async with _dashboard(dsn, read_only=True) as app:
        cookies = (await call(app, "GET", "/")).cookies()  # read-only pages carry no form
        for method, url in _route_urls(app, ids):
            form = {"all": "1", "ids": str(ids["dead"]), "queue": "email", "csrf": "0" * 64}
            reply = await call(app, method, url, cookies=cookies,
                               form=form if method == "POST" else None)  # fmt: skip
            assert reply.status < 500, (method, url, reply.status)
            if method == "POST" or url.startswith("/confirm/"):
                assert reply.status == 403 and "read-only" in reply.text, (method, url)
            else:
                assert reply.status in (200, 404), (method, url, reply.status)
    assert await _snapshot(dsn) == before


FOREIGN_HOSTS = ["evil.example", "evil.example:8089", "localhost.evil.example",
                 "LOCALHOST.evil.example.", "", "bad host", "localhost:abc", "[::1"]  # fmt: skip


async def test_a_foreign_host_is_refused_before_any_page_or_action(dsn: str) -> None:
    """DNS rebinding: a page of evil.example whose name resolves to 127.0.0.1 sends
    ``Host: evil.example``. Before: every page answered it, and a CSRF token read from a
    confirmation page purged a dead job (its Origin matched that same Host)."""
    await _jobs(dsn)
    async with _dashboard(dsn, token=TOKEN) as app:
        paths = _route_paths(app)
        for host in FOREIGN_HOSTS:
            for path in paths:
                for method in ("GET", "POST"):
                    reply = await call(app, method, path, headers={
                        "host": host, "authorization": f"Bearer {TOKEN}",
                        "origin": f"http://{host}"})  # fmt: skip
                    assert reply.status == 421, (host, method, path, reply.status)
                    assert "dashboard" in reply.text and TOKEN not in reply.text
        bearer = {"authorization": f"Bearer {TOKEN}"}
        for host in ("localhost", "localhost:8089", "LocalHost.", "127.0.0.1:8089",
                     "[::1]:8089", "10.1.2.3"):  # fmt: skip
            reply = await call(app, "GET", "/", headers={"host": host, **bearer})
            assert reply.status == 200, host
    async with _dashboard(dsn) as app:
        cookies, csrf = await _csrf(app)
        rebound = {"host": "evil.example:8089", "origin": "http://evil.example:8089"}
        posted = await call(app, "POST", "/actions/purge", form={"all": "1", "csrf": csrf},
                            cookies=cookies, headers=rebound)  # fmt: skip
        assert posted.status == 421
        async with await trioq.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute("SELECT count(*) FROM trioq.dead_jobs")
            assert await cur.fetchone() == (1,)  # nothing purged


async def test_allowed_hosts_name_a_proxys_host(dsn: str) -> None:
    await _jobs(dsn)
    async with _dashboard(dsn, allowed_hosts=["jobs.example.com"]) as app:
        assert (await call(app, "GET", "/", headers={"host": "jobs.example.com"})).status == 200
        assert (await call(app, "GET", "/", headers={"host": "localhost"})).status == 421
        assert (await call(app, "GET", "/", headers={"host": "evil.example"})).status == 421
    async with _dashboard(dsn, allowed_hosts=["*"]) as app:
        assert (await call(app, "GET", "/", headers={"host": "anything.example"})).status == 200
    for bad, error in (("", ValueError), ("a b", ValueError), ("x/y", ValueError),
                       ("\x00", ValueError), (None, TypeError)):  # fmt: skip
        with pytest.raises(error, match="allowed_hosts"):
            trioq.web.app(dsn, allowed_hosts=[bad])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="allowed_hosts"):
        trioq.web.app(dsn, allowed_hosts="localhost")


async def test_the_token_redirect_stays_on_the_dashboard(dsn: str) -> None:
    """Before: ``GET //evil.example/?token=...`` redirected to ``//evil.example/``."""
    async with _dashboard(dsn, token=TOKEN) as app:
        for path, expected in (("//evil.example/", "/evil.example/"),
                               ("/\\evil.example/x", "/evil.example/x"),
                               ("///evil.example", "/evil.example")):  # fmt: skip
            entry = await call(app, "GET", f"http://localhost{path}?token={TOKEN}")
            assert entry.status == 303 and entry.header("location") == expected, path


def test_a_weak_token_is_refused(dsn: str) -> None:
    with pytest.raises(ValueError, match="at least 16 characters"):
        trioq.web.app(dsn, token="short")
    with pytest.raises(ValueError, match="only letters, digits"):
        trioq.web.app(dsn, token="a token; with spaces")


# -- hostile input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/jobs?state=bogus", 400, "state must be one of"),
        ("/jobs?queue=a%00b", 400, "queue contains a NUL"),
        ("/jobs?q=" + "x" * 201, 400, "q is longer than 200"),
        ("/jobs?q=" + "[" * 150, 200, ""),  # not JSON: searched as text
        ("/jobs?offset=-1", 400, "offset must be a whole number"),
        ("/jobs?offset=99999999999999999999", 400, "offset must be a whole number"),
        ("/jobs/99999999999999999999999", 404, "No job"),
        ("/jobs?q=99999999999999999999999", 200, ""),  # an id no job can have
        ("/confirm/retry?ids=99999999999999999999", 400, "ids must be a whole number"),
        ("/confirm/retry", 400, "say which jobs"),
        ("/confirm/explode?ids=1", 404, "no action"),
        ("/confirm/cancel?ids=1&ids=2", 400, "cancel takes one job"),
        ("/confirm/pause", 400, "say which queue"),
        ("/confirm/pause?queue=a%00b", 400, "queue contains a NUL"),
        ("/confirm/pause?queue=no%20spaces", 400, "queue"),
        ("/confirm/resume?queue=" + "q" * 201, 400, "queue is longer than 200"),
        ("/api/history?range=year", 400, "range must be one of"),
        ("/jobs?task=%ED%A0%80", 200, ""),  # undecodable bytes: replaced, found nothing
    ],
)
async def test_bad_input_gets_a_clear_answer(dsn: str, path: str, status: int, says: str) -> None:
    await _jobs(dsn)
    async with _dashboard(dsn) as app:
        reply = await call(app, "GET", path)
        assert reply.status == status, reply.text
        assert says in reply.text


async def test_too_many_ids_are_refused(dsn: str) -> None:
    await _jobs(dsn)
    async with _dashboard(dsn) as app:
        cookies, csrf = await _csrf(app)
        form = [("csrf", csrf), *(("ids", str(i)) for i in range(1, 1002))]
        reply = await call(app, "POST", "/actions/retry", form=form, cookies=cookies)
        assert reply.status == 400 and "at most 1000 jobs" in reply.text


# -- secrets and mounting -----------------------------------------------------------------------


def _with_password(dsn: str, password: str) -> str:
    return make_conninfo(dsn, password=password)


async def test_no_dsn_or_password_in_any_response(dsn: str, unused_port: int) -> None:
    ids = await _jobs(dsn)
    password = "Pa55-w0rd-n0t-sh0wn"  # the test cluster trusts local users: any works
    target = conninfo_to_dict(dsn)
    secrets = [password, str(target["host"]), str(target["dbname"])]
    unreachable = make_conninfo(dsn, host="127.0.0.1", port=unused_port, password=password)
    async with (
        _dashboard(_with_password(dsn, password)) as app,
        _dashboard(unreachable) as down,
    ):
        paths = ["/", "/live/overview", "/jobs", "/cron", "/api/history", "/nope",
                 *(f"/jobs/{i}" for i in ids.values()), "/jobs?state=bogus"]  # fmt: skip
        replies: list[Reply] = [await call(app, "GET", p) for p in paths]
        replies += [await call(down, "GET", p) for p in ("/", "/jobs", "/api/history")]
        assert [r.status for r in replies[-3:]] == [503, 503, 503]
        assert "cannot be reached" in replies[-1].text
        for reply in replies:
            everything = reply.text + repr(reply.headers)
            for secret in secrets:
                assert secret not in everything


async def test_mounted_under_a_prefix_links_stay_inside_it(dsn: str) -> None:
    ids = await _jobs(dsn)
    async with _dashboard(dsn) as dashboard:
        service = Starlette(routes=[Mount("/ops/trioq", app=dashboard)])
        page = await call(service, "GET", "/ops/trioq/")
        assert page.status == 200
        links = re.findall(r'(?:href|src|hx-get|data-history)="(/[^"]*)"', page.text)
        assert links and all(link.startswith("/ops/trioq/") for link in links), links
        job = await call(service, "GET", f"/ops/trioq/jobs/{ids['dead']}")
        assert f'href="/ops/trioq/confirm/retry?ids={ids["dead"]}"' in job.text
        assert (await call(service, "GET", "/ops/trioq/static/trioq.js")).status == 200


# -- the command line -----------------------------------------------------------------------------


def test_the_command_refuses_to_listen_beyond_loopback_without_a_token(dsn: str) -> None:
    done = trioq_cli("web", "--dsn", dsn, "--bind", "0.0.0.0:0")
    assert done.returncode == 1
    assert "reaches beyond this machine: give a token" in done.stderr
    done = trioq_cli("web", "--dsn", dsn, "--bind", "localhost:99999")
    assert done.returncode == 1 and "--bind must look like HOST:PORT" in done.stderr
    done = trioq_cli("web", "--dsn", dsn, "--token", "short")
    assert done.returncode == 1 and "at least 16 characters" in done.stderr


def test_the_command_says_when_the_schema_is_missing(dsn: str) -> None:
    done = trioq_cli("web", "--dsn", dsn, "--bind", "127.0.0.1:0")
    assert done.returncode == 1 and "run `trioq migrate`" in done.stderr, done.stderr


def test_under_asyncio_it_says_it_needs_trio(dsn: str) -> None:
    import asyncio

    app = trioq.web.app(dsn)
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}

    async def nothing(*_: Any) -> Any:
        return {"type": "http.disconnect"}

    with pytest.raises(RuntimeError, match=r"trioq\.web runs on trio: serve it with Hypercorn"):
        asyncio.run(app(scope, nothing, nothing))


async def test_the_overview_reads_the_paused_queues_only(dsn: str) -> None:
    """The overview lists paused queues (so they can be resumed). It read every queue's
    settings to find them: with 10,000 tenants' queues that cost the page more than all its
    counts. It reads the paused ones, the first MAX_QUEUES by name, each with the end of its
    timed pause; a timed pause that has ended is no pause."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        queue = Queue()
        for i in range(30):  # settings, not paused
            await queue.set_limits(conn, f"limited-{i:02d}", global_concurrency=3)
        await queue.pause(conn, "held")
        await queue.pause(conn, "timed", until=dt.timedelta(hours=1))
        await queue.pause(conn, "ended", until=dt.timedelta(hours=1))
        await conn.execute("UPDATE trioq.queues SET paused_until = now() - interval '1 s'"
                           " WHERE name = 'ended'")  # fmt: skip
        st = statements("trioq")
        paused = await _queries.paused_queues(conn, st)
        assert set(paused) == {"held", "timed"}
        assert paused["held"] is None
        until = paused["timed"]
        assert until is not None and until - await queue.clock(conn) > dt.timedelta(minutes=59)
        await conn.execute("INSERT INTO trioq.queues (name, paused) SELECT 'p-' || i, true"
                           " FROM generate_series(1, %s) i", (MAX_QUEUES + 5,))  # fmt: skip
        assert len(await _queries.paused_queues(conn, st)) == MAX_QUEUES
