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
