"""The dashboard as an ASGI app: Starlette routes, Jinja2 pages, a trioq.pg pool.

Every page is rendered on the server; the live parts are small fragments htmx fetches
again every few seconds, and the charts are uPlot fed from ``/api/history`` (both
vendored in ``static/vendor``: nothing is loaded from anywhere else). Every action is a
POST carrying a CSRF token, reached through a confirmation page (a GET that changes
nothing) which says what will happen to how many jobs. It runs on trio only (Hypercorn's
trio worker, or any trio ASGI server): the pool is `trioq.pg.Pool`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import jinja2
import psycopg
import sniffio
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from .._cron_store import StoredCronEntry
from .._db.statements import statements
from .._dead import DeadFilter, DeadJob
from .._durable import check_step_name
from .._exceptions import JobNotFoundError
from .._job import check_queue_name
from .._pg.pool import Pool
from .._pg.times import TOLERANT
from .._queue import Queue
from . import _queries as queries
from ._config import DashboardConfig
from ._limits import COUNT_CAP, WINDOW
from ._security import CSRF_COOKIE, Csrf, HostGuard, SecurityHeaders, TokenGuard

__all__ = ["ACTION_BATCH", "MAX_PER_ACTION", "Dashboard"]

logger = logging.getLogger("trioq.web")

#: Dead jobs retried or purged per statement by "all matching", and per click at most.
ACTION_BATCH = 1000
MAX_PER_ACTION = 50_000
#: Selected ids one action takes at most.
MAX_IDS = 1000
MAX_INT8 = 2**63 - 1
#: Longest filter or search text accepted.
MAX_TEXT = 200
#: Longest args or result shown on a job page (they may be up to 1 MiB).
MAX_SHOWN = 64 * 1024
RANGES = {"hour": 3600, "day": 86400}
ACTIONS = ("retry", "purge", "cancel", "pause", "resume", "signal")
#: A durable job's records shown on its page (``trioq jobs show --json`` has them all).
MAX_STEPS_SHOWN = 50
#: The largest signal payload a form may post (JSON text).
MAX_SIGNAL_PAYLOAD = 64 * 1024
#: The actions on a queue (``queue=NAME``) rather than on jobs.
QUEUE_ACTIONS = ("pause", "resume")

View = Callable[[Request], Awaitable[Response]]


class BadRequest(HTTPException):
    def __init__(self, detail: str) -> None:
        super().__init__(400, detail)


class Dashboard:
    """The ASGI app `trioq.web.app` returns; call `aclose` when done (or let it be:
    connections close with the process). Mountable: ``Mount("/jobs", app=dashboard)``."""

    def __init__(self, config: DashboardConfig) -> None:
        self.config = config
        self.statements = statements(config.schema)
        self.queue = Queue(schema=config.schema)
        self._pool: Pool | None = None
        self._csrf = Csrf(config.secret)
        self.templates = Jinja2Templates(env=_environment())
        self.router = Starlette(
            routes=self._routes(),
            exception_handlers={
                HTTPException: self._http_error,  # type: ignore[dict-item]
                psycopg.Error: self._database_error,  # type: ignore[dict-item]
            },
            lifespan=self._lifespan,
        )
        app: Any = SecurityHeaders(self.router)
        if config.token is not None:
            app = TokenGuard(app, config.token)
        self._app = HostGuard(app, config.allowed_hosts)  # first: before the token

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and sniffio.current_async_library() != "trio":
            raise RuntimeError(
                "trioq.web runs on trio: serve it with Hypercorn's trio worker "
                "(hypercorn --worker-class trio) or `trioq web`"
            )
        await self._app(scope, receive, send)

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
            self._pool = None

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.aclose()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Any]:
        if self._pool is None:
            # Never prepared: each statement is planned with its values (see _limits); times
            # Python cannot hold (a row written by hand) read as the ends of its range.
            kwargs = {"autocommit": True, "prepare_threshold": None, "context": TOLERANT}
            self._pool = Pool(self.config.dsn, max_size=self.config.pool_size,
                              connect_kwargs=kwargs)  # fmt: skip
        async with self._pool.connection() as conn:
            yield conn

    def _routes(self) -> list[Any]:
        static = StaticFiles(packages=[("trioq.web", "static")])
        return [
            Route("/", self._overview, name="overview"),
            Route("/live/overview", self._overview_live, name="overview_live"),
            Route("/api/history", self._history, name="history"),
            Route("/jobs", self._jobs, name="jobs"),
            Route("/jobs/{job_id:int}", self._job, name="job"),
            Route("/jobs/{job_id:int}/live", self._job_live, name="job_live"),
            Route("/confirm/{action}", self._confirm, name="confirm"),
            Route("/actions/{action}", self._act, methods=["POST"], name="act"),
            Route("/cron", self._cron, name="cron"),
            Mount("/static", app=static, name="static"),
        ]

    # -- rendering --------------------------------------------------------------------------

    def _link(self, request: Request) -> Callable[..., str]:
        root: str = request.scope.get("root_path", "")

        def link(name: str, **params: Any) -> str:
            return root + str(self.router.url_path_for(name, **params))

        return link

    def _render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> Response:
        browser = Csrf.browser_id(dict(request.cookies))
        fresh = browser is None
        browser = browser or Csrf.new_browser_id()
        context.update(
            link=self._link(request), read_only=self.config.read_only,
            csrf=self._csrf.token(browser), now=time.time(), cap=COUNT_CAP,
        )  # fmt: skip
        response = self.templates.TemplateResponse(request, template, context, status_code=status)
        if fresh and not self.config.read_only:
            response.set_cookie(
                CSRF_COOKIE, browser, httponly=True, samesite="strict",
                path=request.scope.get("root_path") or "/",
            )  # fmt: skip
        return response

    async def _http_error(self, request: Request, ex: HTTPException) -> Response:
        return self._render(request, "error.html", ex.status_code, message=ex.detail)

    async def _database_error(self, request: Request, ex: psycopg.Error) -> Response:
        """503 without the error's text: it may name the server; the log has it."""
        logger.warning("dashboard query failed: %s: %s", type(ex).__name__, ex)
        if isinstance(ex, psycopg.errors.UndefinedTable):
            message = "trioq's tables are missing or older than this trioq: run `trioq migrate`"
        elif isinstance(ex, psycopg.OperationalError):
            message = "the database cannot be reached right now; this page will work again "
            message += "once it can"
        else:
            message = f"a query failed ({type(ex).__name__}); the server log has the details"
        return self._render(request, "error.html", 503, message=message)

    # -- pages ------------------------------------------------------------------------------

    async def _overview(self, request: Request) -> Response:
        data = await self._overview_data()
        return self._render(request, "overview.html", overview=data, done=_done_message(request))

    async def _overview_live(self, request: Request) -> Response:
        return self._render(request, "_overview_live.html", overview=await self._overview_data())

    async def _overview_data(self) -> queries.Overview:
        async with self._connection() as conn:
            paused = await queries.paused_queues(conn, self.statements)
            return await queries.overview(conn, self.statements, now=time.time(), paused=paused)

    async def _history(self, request: Request) -> Response:
        seconds = RANGES.get(request.query_params.get("range", "hour"))
        if seconds is None:
            raise BadRequest(f"range must be one of {', '.join(RANGES)}")
        queue = _text(request, "queue")
        async with self._connection() as conn:
            now, points = await queries.history(
                conn, self.statements, since=int(time.time()) - seconds, queue=queue
            )
        return JSONResponse(_series(now, seconds, points))

    async def _jobs(self, request: Request) -> Response:
        where = _job_filter(request)
        if where.search and where.search.strip().isdigit():
            found = await self._find(int(where.search.strip()))
            if found is not None:
                return RedirectResponse(self._link(request)("job", job_id=found.id), 303)
        async with self._connection() as conn:
            jobs, more = await queries.job_page(conn, self.statements, where)
        return self._render(
            request, "jobs.html", where=where, jobs=jobs, more=more, states=queries.STATES,
            window=WINDOW, done=_done_message(request),
        )  # fmt: skip

    async def _find(self, job_id: int) -> queries.JobDetail | DeadJob | None:
        if job_id > MAX_INT8:
            return None
        async with self._connection() as conn:
            return await queries.find_job(conn, self.statements, job_id)

    async def _job(self, request: Request) -> Response:
        return await self._job_page(request, "job.html")

    async def _job_live(self, request: Request) -> Response:
        return await self._job_page(request, "_job_live.html")

    async def _job_page(self, request: Request, template: str) -> Response:
        job_id = int(request.path_params["job_id"])
        job: queries.JobDetail | DeadJob | None = None
        steps: list[Any] = []
        progress: queries.JobProgress | None = None
        if job_id <= MAX_INT8:  # one connection for the job and its records (every 2 s)
            async with self._connection() as conn:
                job = await queries.find_job(conn, self.statements, job_id)
                if job is not None:
                    steps = await self.queue.steps(conn, job_id)
                    progress = await queries.job_progress(conn, self.statements, job_id)
        status = 200 if job is not None else 404
        return self._render(
            request, template, status, job=job, job_id=job_id, done=_done_message(request),
            max_shown=MAX_SHOWN, state=_state(job), steps=steps[:MAX_STEPS_SHOWN],
            steps_total=len(steps), signalable=_state(job) in LIVE_STATES, progress=progress,
        )  # fmt: skip

    async def _cron(self, request: Request) -> Response:
        async with self._connection() as conn:
            ticks = await queries.cron_ticks(conn, self.statements)
            stored = await self.queue.cron_entries(conn)
            now = await self.queue.clock(conn)
        entries = _cron_rows(self.config, ticks, now, stored)
        return self._render(request, "cron.html", entries=entries,
                            have_app=bool(self.config.cron))  # fmt: skip

    # -- actions ----------------------------------------------------------------------------

    def _refuse_if_read_only(self) -> None:
        if self.config.read_only:
            raise HTTPException(403, "this dashboard is read-only: actions are turned off")

    async def _confirm(self, request: Request) -> Response:
        self._refuse_if_read_only()
        action = _action(request)
        if action in QUEUE_ACTIONS:
            name = _queue_name(request.query_params.get("queue"))
            async with self._connection() as conn:
                settings = await self.queue.queue_settings(conn, [name])
            return self._render(request, "confirm.html", action=action, queue=name,
                                paused=bool(settings and settings[0].paused),
                                paused_until=settings[0].paused_until if settings else None,
                                pause_lengths=PAUSE_LENGTHS,
                                target=(None, name, None), count=queries.Count(1))  # fmt: skip
        target = _target(request.query_params.getlist("ids"), request.query_params)
        ids, queue, task = target
        if action == "signal":
            if not ids or len(ids) != 1:
                raise BadRequest("a signal goes to one job: ids=<job id>")
            job = await self._find(ids[0])
            return self._render(request, "confirm.html", action=action, target=target, job=job,
                                count=queries.Count(1 if _state(job) in LIVE_STATES else 0),
                                state=_state(job))  # fmt: skip
        if action == "cancel":
            if not ids or len(ids) != 1:
                raise BadRequest("cancel takes one job: ids=<job id>")
            job = await self._find(ids[0])
            return self._render(request, "confirm.html", action=action, target=target, job=job,
                                count=queries.Count(1 if job else 0),
                                state=_state(job))  # fmt: skip
        async with self._connection() as conn:
            count = await queries.dead_count(conn, self.statements, queue=queue, task=task, ids=ids)
        return self._render(request, "confirm.html", action=action, target=target, job=None,
                            count=count, max_per_action=MAX_PER_ACTION)  # fmt: skip

    async def _act(self, request: Request) -> Response:
        self._refuse_if_read_only()
        action = _action(request)
        form = await request.form(max_files=0, max_fields=MAX_IDS + 10)
        self._check_csrf(request, form)
        link = self._link(request)
        if action in QUEUE_ACTIONS:
            name = _queue_name(form.get("queue"))
            until = _pause_length(form.get("for")) if action == "pause" else None
            async with self._connection() as conn:
                if action == "pause":
                    await self.queue.pause(conn, name, until=until)
                else:
                    await self.queue.resume(conn, name)
            said = "paused_until" if until is not None else f"{action}d"
            return RedirectResponse(f"{link('overview')}?done={said}", 303)
        ids, queue, task = _target(form.getlist("ids"), form)
        if action == "signal":
            if not ids or len(ids) != 1:
                raise BadRequest("a signal goes to one job: ids=<job id>")
            name, payload = _signal_form(form)
            async with self._connection() as conn:
                try:
                    sent = await self.queue.signal(conn, ids[0], name, payload)
                except JobNotFoundError:
                    raise HTTPException(404, "no live job to signal: it has ended, or never "
                                             "existed") from None  # fmt: skip
                except (TypeError, ValueError) as ex:  # NaN, a NUL, too large: not stored
                    raise BadRequest(str(ex)[:300]) from None
            return RedirectResponse(f"{link('job', job_id=ids[0])}?done=signal_{sent}", 303)
        if action == "cancel":
            if not ids or len(ids) != 1:
                raise BadRequest("cancel takes one job: ids=<job id>")
            async with self._connection() as conn:
                outcome = await self.queue.cancel(conn, ids[0])
            return RedirectResponse(f"{link('job', job_id=ids[0])}?done={outcome.status}", 303)
        done = await self._dead_action(action, ids, queue, task)
        if ids is not None and len(ids) == 1:
            return RedirectResponse(f"{link('job', job_id=ids[0])}?done={action}&n={done}", 303)
        return RedirectResponse(f"{link('jobs')}?state=dead&done={action}&n={done}", 303)

    def _check_csrf(self, request: Request, form: FormData) -> None:
        token = form.get("csrf")
        browser = Csrf.browser_id(dict(request.cookies))
        if not Csrf.same_origin(request.scope) or not self._csrf.valid(
            browser, token if isinstance(token, str) else None
        ):
            raise HTTPException(403, "the form's CSRF token is missing or stale: reload the page")

    async def _dead_action(
        self, action: str, ids: list[int] | None, queue: str | None, task: str | None
    ) -> int:
        """Retry or purge dead jobs: the ids given, or all matching queue and task (in
        batches of ACTION_BATCH, at most MAX_PER_ACTION a click)."""
        run = self.queue.dead_retry if action == "retry" else self.queue.dead_purge
        done = 0
        async with self._connection() as conn:
            if ids is not None:
                return len(await run(conn, DeadFilter(ids=ids)))
            after = 0
            while done < MAX_PER_ACTION:
                batch = await queries.dead_ids(conn, self.statements, queue=queue, task=task,
                                       after=after, batch=ACTION_BATCH)  # fmt: skip
                if not batch:
                    break
                done += len(await run(conn, DeadFilter(ids=batch)))
                after = batch[-1]
        return done


def _state(job: queries.JobDetail | DeadJob | None) -> str | None:
    """A job's state, "dead" for a row of dead_jobs."""
    if job is None:
        return None
    return job.state if isinstance(job, queries.JobDetail) else "dead"


# -- request parameters ---------------------------------------------------------------------------


def _clean(name: str, value: str, max_len: int = MAX_TEXT) -> str:
    if len(value) > max_len:
        raise BadRequest(f"{name} is longer than {max_len} characters")
    if "\x00" in value:
        raise BadRequest(f"{name} contains a NUL character, which no job can have")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"{name} is not valid text (a lone surrogate?)") from None
    return value


def _text(request: Request, name: str) -> str | None:
    value = request.query_params.get(name)
    return _clean(name, value) if value else None


def _int(name: str, value: str | None, default: int, high: int) -> int:
    if value is None or value == "":
        return default
    if not value.isdigit() or int(value) > high:
        raise BadRequest(f"{name} must be a whole number from 0 to {high}, got {value[:30]!r}")
    return int(value)


def _job_filter(request: Request) -> queries.JobFilter:
    state = request.query_params.get("state", "running")
    if state not in queries.STATES:
        raise BadRequest(f"state must be one of {', '.join(queries.STATES)}")
    search = _text(request, "q")
    contains, text = queries.search_terms(search.strip() if search else None)
    return queries.JobFilter(
        state=state, queue=_text(request, "queue"), task=_text(request, "task"),
        search=search, contains=contains, text=text,
        offset=_int("offset", request.query_params.get("offset"), 0, WINDOW),
    )  # fmt: skip


def _action(request: Request) -> str:
    action = str(request.path_params["action"])
    if action not in ACTIONS:
        raise HTTPException(404, f"no action {action[:30]!r}: there are {', '.join(ACTIONS)}")
    return action


#: What the dashboard's Pause offers besides "until resumed": a timed pause of this long,
#: from the database's clock (the form's ``for``, in seconds; any other value is refused).
PAUSE_LENGTHS = {"900": "15 minutes", "3600": "1 hour", "14400": "4 hours", "86400": "1 day"}


def _pause_length(value: object) -> dt.timedelta | None:
    """The ``for`` of a Pause form: empty (until resumed) or one of `PAUSE_LENGTHS`."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or value not in PAUSE_LENGTHS:
        raise BadRequest(f"for must be empty (until resumed) or one of {', '.join(PAUSE_LENGTHS)}"
                         " (seconds)")  # fmt: skip
    return dt.timedelta(seconds=int(value))


def _queue_name(value: Any) -> str:
    """The ``queue`` of a pause or resume: a queue name by the job field rules."""
    if not isinstance(value, str) or not value:
        raise BadRequest("say which queue: queue=<name>")
    try:
        return check_queue_name(_clean("queue", value))
    except (TypeError, ValueError) as ex:
        raise BadRequest(str(ex)) from None


def _target(raw_ids: list[Any], params: Any) -> tuple[list[int] | None, str | None, str | None]:
    """(ids, queue, task) of an action: selected ids, or all matching queue and task."""
    if len(raw_ids) > MAX_IDS:
        raise BadRequest(f"at most {MAX_IDS} jobs at a time, got {len(raw_ids)}")
    ids = [_int("ids", str(value), 0, MAX_INT8) for value in raw_ids if str(value)]
    queue, task = params.get("queue") or None, params.get("task") or None
    queue = _clean("queue", queue) if isinstance(queue, str) else None
    task = _clean("task", task) if isinstance(task, str) else None
    if not ids and params.get("all") != "1":
        raise BadRequest("say which jobs: select some (ids=...) or ask for all=1 matching")
    return (ids or None), queue, task


_DONE = {
    "retry": "retried {n} dead jobs",
    "purge": "purged {n} dead jobs",
    "cancelled": "cancelled",
    "requested": "cancel requested: its worker is told at once and stops the handler",
    "paused": "paused: no worker claims from this queue until it is resumed (running jobs "
    "finish)",
    "resumed": "resumed: workers claim from this queue again",
    "paused_until": "paused: no worker claims from this queue until the time shown (running "
    "jobs finish); it resumes by itself then",
    "not_found": "nothing to cancel: the job is no longer waiting or running",
    "signal_woke": "signal sent: the job waited for it, and runs now",
    "signal_stored": "signal sent: kept for the job's wait for it",
    "signal_duplicate": "not sent: a signal of that name was sent to this job before",
}

#: The states of a job that can still read a signal.
LIVE_STATES = ("waiting", "scheduled", "available", "running")


def _signal_form(form: FormData) -> tuple[str, Any]:
    """The name and the JSON payload of a signal form (an empty payload: null)."""
    name = form.get("name")
    text = form.get("payload") or ""
    if not isinstance(name, str) or not isinstance(text, str):
        raise BadRequest("a signal needs a name (and a JSON payload, or none)")
    if len(text) > MAX_SIGNAL_PAYLOAD:
        raise BadRequest(f"the payload is over {MAX_SIGNAL_PAYLOAD:,} characters")
    _clean("payload", text, MAX_SIGNAL_PAYLOAD)
    try:
        payload = json.loads(text) if text.strip() else None
    except (ValueError, RecursionError) as ex:
        raise BadRequest(f"the payload is not JSON: {str(ex)[:100]}") from None
    try:
        check_step_name(_clean("name", name), "signal name")
    except (TypeError, ValueError) as ex:
        raise BadRequest(str(ex)) from None
    return name, payload


def _done_message(request: Request) -> str | None:
    """What the action just done did (a fixed text per code: nothing from the URL is shown
    but a number)."""
    code = request.query_params.get("done")
    if code not in _DONE:
        return None
    n = request.query_params.get("n", "0")
    return _DONE[code].format(n=int(n) if n.isdigit() and len(n) < 10 else 0)


# -- shaping ------------------------------------------------------------------------------------


def _series(now: float, seconds: int, points: list[Any]) -> dict[str, Any]:
    """Arrays for uPlot: one slot per minute of the range (missing minutes are 0 / null)."""
    last = int(now) // 60 * 60
    minutes = list(range(last - seconds + 60, last + 60, 60))
    by_minute = {p.minute: p for p in points}
    fields = ("completed", "retried", "dead", "cancelled")
    timings = ("wait_p50_ms", "wait_p95_ms", "wait_max_ms", "exec_p50_ms", "exec_p95_ms",
               "exec_max_ms")  # fmt: skip
    out: dict[str, Any] = {"now": now, "minutes": minutes}
    for name in fields:
        out[name] = [getattr(by_minute[m], name) if m in by_minute else 0 for m in minutes]
        out[f"total_{name}"] = sum(out[name])
    for name in timings:
        out[name] = [_ms(getattr(by_minute[m], name)) if m in by_minute else None for m in minutes]
    return out


def _ms(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 3)


def _cron_rows(
    config: DashboardConfig, ticks: dict[str, tuple[dt.datetime, int | None, dt.datetime]],
    now: dt.datetime, stored: Sequence[StoredCronEntry] = (),
) -> list[queries.CronRow]:  # fmt: skip
    """The app's entries, the database's (read-only: ``trioq cron`` changes them), and the
    names only ticks are known of, by name."""
    rows = []

    def last(name: str) -> dict[str, Any]:
        tick, job_id, fired = ticks.get(name, (None, None, None))
        return {"last_tick": tick, "last_job_id": job_id, "last_fired_at": fired}

    for entry in config.cron:
        rows.append(queries.CronRow(
            name=entry.name, schedule=entry.schedule, timezone=entry.timezone,
            queue=entry.queue, task=entry.task, next_tick=entry.next_tick(now),
            **last(entry.name),
        ))  # fmt: skip
    in_app = {entry.name for entry in config.cron}
    for item in stored:
        e = item.entry
        status = ("broken" if e is None else "shadowed" if item.name in in_app
                  else "ok" if item.enabled else "disabled")  # fmt: skip
        rows.append(queries.CronRow(
            name=item.name, schedule=None if e is None else e.schedule,
            timezone=None if e is None else e.timezone, queue=None if e is None else e.queue,
            task=None if e is None else e.task,
            next_tick=e.next_tick(now) if e is not None and status == "ok" else None,
            source="database", status=status, error=item.error, **last(item.name),
        ))  # fmt: skip
    known = in_app | {item.name for item in stored}
    for name in sorted(set(ticks) - known):
        rows.append(queries.CronRow(name=name, schedule=None, timezone=None, queue=None,
                                    task=None, next_tick=None, source=None, **last(name)))
    rows.sort(key=lambda r: (r.name, r.source != "app"))
    return rows


# -- templates ------------------------------------------------------------------------------------


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("trioq.web", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(when=_when, ago=_ago, seconds=_seconds_text, pretty=_pretty)
    return env


def _when(value: dt.datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(value: dt.datetime | None, now: float) -> str:
    if value is None:
        return ""
    return _seconds_text(now - value.timestamp(), relative=True)


def _seconds_text(seconds: float | None, *, relative: bool = False) -> str:
    if seconds is None:
        return "-"
    future = seconds < 0
    s = abs(seconds)
    if s < 1:
        text = f"{s * 1000:.0f} ms"
    elif s < 90:
        text = f"{s:.1f} s"
    elif s < 5400:
        text = f"{s / 60:.0f} min"
    elif s < 172800:
        text = f"{s / 3600:.1f} h"
    else:
        text = f"{s / 86400:.1f} d"
    if not relative:
        return f"-{text}" if future else text
    return f"in {text}" if future else f"{text} ago"


def _pretty(value: Any, limit: int = MAX_SHOWN) -> str:
    """JSON (text, or a decoded value) indented for reading (cut at ``limit`` characters)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False)
    text: str = value
    if len(text) <= limit:
        with contextlib.suppress(ValueError, RecursionError):
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    if len(text) > limit:
        return text[:limit] + f"\n... ({len(text) - limit:,} more characters not shown)"
    return text
