"""The dashboard and a job that waits for its dependencies: its page says ``waiting`` and
offers Cancel, and the cancel (through the confirmation) cancels it and its dependants."""

from __future__ import annotations

from asgi import call
from test_web import _csrf

import trioq
import trioq.web


async def test_a_waiting_job_can_be_cancelled_from_the_dashboard(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        first = await trioq.enqueue(conn, "first")
        waiting = await trioq.enqueue(conn, "second", after=[first.job_id])
        then = await trioq.enqueue(conn, "third", after=[waiting.job_id])
    app = trioq.web.app(dsn)
    try:
        page = await call(app, "GET", f"/jobs/{waiting.job_id}")
        assert 'id="state">waiting<' in page.text
        assert 'id="cancel"' in page.text
        cookies, csrf = await _csrf(app, f"/confirm/cancel?ids={waiting.job_id}")
        done = await call(app, "POST", "/actions/cancel", cookies=cookies,
                          form={"csrf": csrf, "ids": waiting.job_id})  # fmt: skip
        assert done.status == 303
    finally:
        await app.aclose()
    async with await trioq.connect(dsn, autocommit=True) as conn:
        assert (await trioq.job_status(conn, waiting.job_id)).state == "cancelled"
        status = await trioq.job_status(conn, then.job_id)
        assert status.state == "cancelled"
        assert status.last_error == f"dependency {waiting.job_id} (task 'second') was cancelled"
        assert (await trioq.job_status(conn, first.job_id)).state == "available"


async def test_waiting_jobs_have_their_own_list(dsn: str) -> None:
    """The jobs page lists the waiting jobs (a tab of their own, filterable by queue and
    task), and no other state's list shows them."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        first = await trioq.enqueue(conn, "first")
        mail = await trioq.enqueue(conn, "send", queue="mail", after=[first.job_id])
        report = await trioq.enqueue(conn, "build", queue="reports", after=[first.job_id])
    app = trioq.web.app(dsn)
    try:
        page = await call(app, "GET", "/jobs?state=waiting")
        assert page.status == 200 and 'data-state="waiting"' in page.text
        assert f"/jobs/{mail.job_id}\"" in page.text and f"/jobs/{report.job_id}\"" in page.text
        assert f"/jobs/{first.job_id}\"" not in page.text
        mail_only = await call(app, "GET", "/jobs?state=waiting&queue=mail")
        assert f"/jobs/{mail.job_id}\"" in mail_only.text
        assert f"/jobs/{report.job_id}\"" not in mail_only.text
        by_task = await call(app, "GET", "/jobs?state=waiting&task=build")
        assert f"/jobs/{report.job_id}\"" in by_task.text
        assert f"/jobs/{mail.job_id}\"" not in by_task.text
        available = await call(app, "GET", "/jobs?state=available")
        assert f"/jobs/{first.job_id}\"" in available.text
        assert f"/jobs/{mail.job_id}\"" not in available.text
    finally:
        await app.aclose()
