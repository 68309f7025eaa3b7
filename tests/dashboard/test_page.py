"""The dashboard's page in a real browser (Debian's Chromium, driven by Playwright) against a
real `cmr dashboard` on the local AWS stack: it shows a job running, its tasks' attempts as
they run, then its end; it keeps polling; and every string from the table stays text."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from cmr.api import open_backend
from cmr.records import JOBS_PK
from cmr.settings import AwsSettings
from tests.dashboard import hostile_job
from tests.dashboard.live import (
    SLOW,
    Stack,
    chromium,
    dashboard,
    done,
    get,
    lines_file,
    stack_store,
    until,
)

pytestmark = pytest.mark.usefixtures("aws_stack")
HOSTILE = str(Path(hostile_job.__file__))
# Where test_the_page_follows_a_job saves its screenshot, when set (docs/dashboard.png).
SCREENSHOT = "CMR_DASHBOARD_SCREENSHOT"


def _watch(page: Any) -> list[str]:
    """The page's errors as they come: script errors, failed loads, CSP refusals."""
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    return problems


def _bars(page: Any, outcome: str) -> int:
    """How many bars of ``outcome`` the first step's timeline chart draws."""
    return int(
        page.evaluate(
            """outcome => {
                const chart = Chart.getChart(document.querySelector(".timeline canvas"));
                if (!chart) return 0;
                const set = chart.data.datasets.find(d => d.label === outcome);
                return set ? set.data.length : 0;
            }""",
            outcome,
        )
    )


def _polls(page: Any) -> int:
    return int(page.get_attribute("body", "data-polls") or 0)


def test_the_page_follows_a_job(tmp_path: Path) -> None:
    with stack_store() as s:
        job = s.submit(SLOW, lines_file(tmp_path, 40), "--param", "sleep=0.15")
        with dashboard(s.url) as url, chromium() as browser:
            _follow(s, url, browser, job)


def _follow(s: Stack, url: str, browser: Any, job: str) -> None:
    page = browser.new_page()
    problems = _watch(page)
    page.goto(f"{url}#job={job}")
    row = page.locator(f'#jobs tr[data-job="{job}"]')
    row.and_(page.locator('[data-state="running"]')).wait_for(timeout=30_000)
    assert page.locator("#detail-job").inner_text() == job
    assert row.locator("td").nth(1).inner_text() == "running"

    worker = s.worker()
    try:
        page.locator("table.attempts td.outcome-running").first.wait_for(timeout=60_000)
        until("a running attempt on the timeline", lambda: _bars(page, "running"))
        polls = _polls(page)
        until("two more polls", lambda: _polls(page) >= polls + 2, timeout=30)
        page.locator(f'#jobs tr[data-job="{job}"][data-state="succeeded"]').wait_for(
            timeout=120_000
        )
        # Once cleaned up, the attempts are the timeline's: the map and the 4 reduces,
        # each committed, none running.
        until("the committed timeline", lambda: _bars(page, "committed") >= 5)
        assert _bars(page, "running") == 0
    finally:
        done(worker)
    assert page.locator("#fields").inner_text().count("succeeded") == 1
    assert "seen / lines\t40" in page.locator("#counters").inner_text()
    # The cost so far, priced: a total in dollars and the worker-seconds.
    until("the cost shown", lambda: "worker-seconds" in page.locator("#cost").inner_text())
    assert "total\t$" in page.locator("#cost").inner_text()
    _, seen = get(url + "api/workers")
    for w in seen["workers"]:
        page.locator("#workers td.id", has_text=w["worker"]).first.wait_for(timeout=10_000)
    if os.environ.get(SCREENSHOT):
        page.screenshot(path=os.environ[SCREENSHOT], full_page=True)
    assert problems == []


def _put_row(s: Stack, job_id: str) -> None:
    """A row in the job list that no cmr wrote (a stranger with access to the table)."""

    async def put() -> None:
        settings = AwsSettings(bucket=s.bucket, table=s.table, queue_prefix=s.prefix)
        async with open_backend("aws", settings) as be:
            await be.table.put(JOBS_PK, job_id, {"state": "running", "created": 1.0})

    asyncio.run(put())


def test_strings_from_the_table_stay_text(tmp_path: Path) -> None:
    with stack_store() as s:
        src = lines_file(tmp_path, 3)
        counted = s.submit(HOSTILE, src)
        failed = s.submit(HOSTILE, src, "--param", "mode=fail", "--max-task-attempts", "1")
        stranger = '<img src=x onerror="window.pwned = 4">'
        _put_row(s, stranger)
        worker = s.worker()
        with dashboard(s.url) as url:
            try:

                def both_ended() -> bool:
                    states = {j["job"]: j["state"] for j in get(url + "api/jobs")[1]["jobs"]}
                    return states.get(counted) == "succeeded" and states.get(failed) == "failed"

                until("both jobs ended", both_ended)
            finally:
                done(worker)
            with chromium() as browser:
                page = browser.new_page()
                problems = _watch(page)
                page.goto(f"{url}#job={counted}")
                page.locator(f'#jobs tr[data-job="{failed}"]').wait_for(timeout=30_000)
                page.locator("#counters td").first.wait_for(timeout=30_000)
                until("the counters", lambda: "<script>" in page.locator("#counters").inner_text())

                counters = page.locator("#counters").inner_text()
                assert f"{hostile_job.GROUP} / {hostile_job.NAME}\t3" in counters
                error = page.locator(f'#jobs tr[data-job="{failed}"] td.msg').inner_text()
                assert hostile_job.ERROR in error
                assert page.locator("#jobs td.id", has_text=stranger).count() == 1
                # Shown, never run: no element the strings name exists, no handler fired.
                assert page.locator("#jobs img, #detail img, #jobs b, #detail b").count() == 0
                assert page.locator("body script").count() == 0
                assert page.evaluate("() => window.pwned") is None
                assert page.title() == "cmr dashboard"
                assert problems == []
        # The stranger's row is not cmr's to clean up; the jobs' records are.
        _drop_row(s, stranger)


def _drop_row(s: Stack, job_id: str) -> None:
    async def drop() -> None:
        settings = AwsSettings(bucket=s.bucket, table=s.table, queue_prefix=s.prefix)
        async with open_backend("aws", settings) as be:
            await be.table.delete(JOBS_PK, job_id)

    asyncio.run(drop())
