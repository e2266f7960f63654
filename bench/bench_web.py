"""Page load times of ``trioq web`` against a big table (not a test).

Fills a scratch database ``trioq_bench_web`` with `tests/bigtable.py` (by default 1,000,000
available jobs in 20 queues, 300,000 finished rows kept in ``jobs``, 10,000 scheduled,
1,000 running under 8 lease owners, 300,000 dead jobs, a week of per-minute history for
10 queue/task pairs), starts a real ``trioq web`` process on it, and times each page:

- server: ``--requests`` sequential GETs per page over one keep-alive connection
  (``http.client``), from sending the request to the last byte of the body; median, p95
  and max in ms, and the body's size;
- browser (``--browser``): Debian's Chromium via Playwright opens the overview and waits
  until every chart has drawn its data (htmx, uPlot and both history ranges loaded).

The tables are not vacuumed after the fill, as on a busy queue: the visibility map is
empty, so index-only scans visit the heap (``--vacuum`` measures the other case).
``--screenshots DIR`` saves PNGs of the main pages (what docs/web.md shows).

Usage::

    python bench/bench_web.py                       # TRIOQ_DSN or the local test server
    python bench/bench_web.py --dsn postgresql://postgres@127.0.0.1:55432/postgres \\
        --browser --screenshots docs/images --json /tmp/web.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import trio
from _common import (
    Table,
    add_common_options,
    client_versions,
    create_bench_db,
    drop_bench_db,
    time_page,
    write_json,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from bigtable import Sizes, fill  # noqa: E402  (tests/ is on the path only now)

import trioq  # noqa: E402

DATABASE = "trioq_bench_web"
CHROMIUM = "/usr/bin/chromium"
#: Charts that have not drawn data from /api/history yet (trioq.js marks those that have).
#: A selector, not a script: the page's CSP forbids evaluating strings.
CHARTS_PENDING = "[data-chart]:not([data-loaded])"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def pages(first_dead: int) -> list[tuple[str, str]]:
    """(what, path) of every page and fragment the dashboard serves, with typical filters."""
    return [
        ("overview (full page)", "/"),
        ("overview, live fragment (every 2 s)", "/live/overview"),
        ("history, last hour (JSON)", "/api/history?range=hour"),
        ("history, last day (JSON)", "/api/history?range=day"),
        ("history, last day, one queue", "/api/history?range=day&queue=queue_3"),
        ("jobs: running", "/jobs?state=running"),
        ("jobs: available", "/jobs?state=available"),
        ("jobs: available, one queue", "/jobs?state=available&queue=queue_3"),
        ("jobs: available, task filter", "/jobs?state=available&task=task_5"),
        ("jobs: available, args JSON search", '/jobs?state=available&q={"user_id":4242}'),
        ("jobs: available, args text search", "/jobs?state=available&q=user4242@"),
        ("jobs: scheduled", "/jobs?state=scheduled"),
        ("jobs: done", "/jobs?state=done"),
        ("jobs: cancelled", "/jobs?state=cancelled"),
        ("jobs: dead", "/jobs?state=dead"),
        ("jobs: dead, one queue and task", "/jobs?state=dead&queue=queue_3&task=task_5"),
        ("job page (available)", "/jobs/42"),
        ("job page (dead, traceback)", f"/jobs/{first_dead + 42}"),
        ("confirm: retry all dead of a queue", "/confirm/retry?all=1&queue=queue_3"),
        ("cron", "/cron"),
    ]


def browser_run(url: str, first_dead: int, shots: Path | None) -> dict[str, float]:
    """Chromium: the overview until its charts are drawn; the screenshots if asked."""
    from playwright.sync_api import expect, sync_playwright

    out: dict[str, float] = {}
    drawn: list[float] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        for _ in range(3):
            start = time.perf_counter()
            page.goto(url + "/")
            expect(page.locator(CHARTS_PENDING)).to_have_count(0, timeout=60_000)
            drawn.append((time.perf_counter() - start) * 1000)
        out["overview_charts_drawn_ms"] = statistics.median(drawn)
        for path, key in (("/jobs?state=dead", "jobs_dead_loaded_ms"),
                          (f"/jobs/{first_dead + 42}", "job_page_loaded_ms")):  # fmt: skip
            start = time.perf_counter()
            page.goto(url + path, wait_until="load")
            out[key] = (time.perf_counter() - start) * 1000
        if shots is not None:
            screenshots(page, url, first_dead, shots)
        browser.close()
    return out


def screenshots(page: Any, url: str, first_dead: int, shots: Path) -> None:
    from playwright.sync_api import expect

    shots.mkdir(parents=True, exist_ok=True)
    for name, path, full in (
        ("web-overview.png", "/", True),
        ("web-jobs-dead.png", "/jobs?state=dead&queue=queue_3", False),
        ("web-job-dead.png", f"/jobs/{first_dead + 43}", False),
        ("web-confirm.png", "/confirm/retry?all=1&queue=queue_3", False),
        ("web-cron.png", "/cron", False),
    ):
        page.goto(url + path)
        if path == "/":
            expect(page.locator(CHARTS_PENDING)).to_have_count(0, timeout=60_000)
        page.screenshot(path=str(shots / name), full_page=full)
        print(f"wrote {shots / name}")


def start_web(dsn: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRIOQ_DSN", "DATABASE_URL")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trioq._cli", "web", "--dsn", dsn, "--bind", "127.0.0.1:0",
             "--app", "web_app:config"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT / "tests",
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("trioq web: serving "):
                return proc, line.split()[3].rstrip("/")
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"trioq web did not start: {log.read_text()}")


async def prepare(opts: argparse.Namespace, sizes: Sizes) -> tuple[str, dict[str, float]]:
    dsn = await create_bench_db(opts.dsn, DATABASE)
    timings = await fill(dsn, sizes)
    if opts.vacuum:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            await conn.execute("VACUUM ANALYZE trioq.jobs, trioq.dead_jobs, trioq.job_history")
    return dsn, timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(parser, creates=DATABASE, repeat=1, quiet_cores=0.5, quiet_wait=0,
                       pgbench=False)  # fmt: skip
    parser.add_argument("--available", type=int, default=1_000_000, help="%(default)s")
    parser.add_argument("--dead", type=int, default=300_000, help="%(default)s")
    parser.add_argument("--requests", type=int, default=20, help="per page (%(default)s)")
    parser.add_argument("--vacuum", action="store_true", help="VACUUM ANALYZE after the fill")
    parser.add_argument("--browser", action="store_true", help="also time pages in Chromium")
    parser.add_argument("--screenshots", type=Path, metavar="DIR", help="save PNGs here")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    opts = parser.parse_args()
    sizes = Sizes(available=opts.available, dead=opts.dead)
    print(f"filling {DATABASE}: {sizes}", flush=True)
    dsn, timings = trio.run(prepare, opts, sizes)
    print(f"filled in {timings['total']:.1f} s ({sizes.jobs:,} rows in jobs, "
          f"{sizes.dead:,} in dead_jobs){', vacuumed' if opts.vacuum else ''}")  # fmt: skip
    first_dead = sizes.jobs + 1
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_web(dsn, Path(tmp) / "web.log")
        try:
            parts = urlsplit(url)
            host, port = parts.hostname or "127.0.0.1", parts.port or 80
            results = []
            for what, path in pages(first_dead):
                result = time_page(host, port, path, opts.requests)
                results.append({"page": what, "path": path, **result})
                print(f"  {what:40} {result['median_ms']:8.1f} ms", flush=True)
            browser = browser_run(url, first_dead, opts.screenshots) if (
                opts.browser or opts.screenshots) else {}  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    table = Table([("page", 40, "<"), ("status", 6, ">"), ("median ms", 9, ">"),
                   ("p95 ms", 8, ">"), ("max ms", 8, ">"), ("KiB", 6, ">")])  # fmt: skip
    print()
    print(table.render(
        (r["page"], str(r["status"]), f"{r['median_ms']:.1f}", f"{r['p95_ms']:.1f}",
         f"{r['max_ms']:.1f}", f"{r['bytes'] / 1024:.1f}") for r in results
    ))  # fmt: skip
    for key, ms in browser.items():
        print(f"browser: {key} {ms:.0f}")
    if opts.json:
        write_json(opts.json, {"sizes": attrs.asdict(sizes), "fill": timings, "pages": results,
                               "browser": browser, "client": client_versions()})  # fmt: skip
    if not opts.keep:
        trio.run(drop_bench_db, opts.dsn, DATABASE)


if __name__ == "__main__":
    main()
