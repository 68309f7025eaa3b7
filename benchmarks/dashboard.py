"""The dashboard's goals (issue 30): the page shows a running job within 2 s of opening, it
updates at least every 2 s, and it stays correct and fast with 1,000 finished jobs in the
store; measured first with none (the baseline), then with ``--jobs`` finished jobs.

    .venv/bin/python benchmarks/dashboard.py [--jobs 1000] [--opens 5] [--json F]

Everything runs in this process but the browser: the embedded backend, real word-count jobs
run on it (in-process workers), and the dashboard's server (cmr.dashboard.server.Dashboard,
what `cmr dashboard` serves) on that backend, in one event loop in a thread. Debian's
Chromium, driven by Playwright, opens the page. For each phase:

* open: a fresh browser context (no cache) opens the page; seconds until the running job's
  row says "running", ``--opens`` times;
* polls: one page left open on the running job's detail for POLL_WATCH_S; the intervals
  between its polls (the page counts them in ``body[data-polls]``), sampled every 20 ms;
* end: the wall-clock time from the job record's ``finished`` to the page showing
  "succeeded";
* API: the server's answer time for the first page of the list, the last page, and one
  finished job's detail, each asked after the job list's freshness lapsed (as a page's poll
  is), and the table requests one poll of the list costs;
* correct: every job paged through the API, compared with the ids the jobs returned.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from cmr.api import open_backend, run_on  # noqa: E402
from cmr.dashboard.board import FRESH_S  # noqa: E402
from cmr.dashboard.server import Dashboard, listen  # noqa: E402
from cmr.settings import AwsSettings  # noqa: E402
from tests.dashboard.live import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

SLOW = str(REPO / "tests" / "dashboard" / "slow_count.py")
POLL_WATCH_S = 8.0
T = TypeVar("T")


class Loop:
    """An event loop in a thread: the backend, its jobs and the server live there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self, coro: Coroutine[Any, Any, T]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def timed_get(url: str) -> tuple[float, Any]:
    t = time.perf_counter()
    doc = get(url)
    return time.perf_counter() - t, doc


def quantiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "median": round(statistics.median(xs), 4),
        "p95": round(xs[min(len(xs) - 1, int(0.95 * len(xs)))], 4),
        "max": round(xs[-1], 4),
        "n": len(xs),
    }


class Bench:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.loop = Loop()
        self.src = work / "in.txt"
        self.src.write_text("".join(f"alpha beta gamma {i % 7}\n" for i in range(50)))
        self.slow_src = work / "slow.txt"
        self.slow_src.write_text("".join(f"delta {i}\n" for i in range(40)))
        self.jobs: list[str] = []
        self.runs = 0
        self.be: Any = None
        self.loop.run(self._open())

    async def _open(self) -> None:
        self.opened = open_backend("embedded", AwsSettings())
        self.be = await self.opened.__aenter__()
        self.dash = Dashboard(self.be, listen("127.0.0.1", 0), store="embedded")
        self.url = self.dash.url
        self.serving = asyncio.ensure_future(self.dash.serve())

    async def _one(self) -> str:
        self.runs += 1
        out = self.work / f"out{self.runs}"
        result = await run_on(self.be, SLOW, str(self.src), str(out), workers=1, reducers=1)
        return result.job_id

    def finish_jobs(self, n: int, at_once: int = 4) -> float:
        async def many() -> list[str]:
            gate = asyncio.Semaphore(at_once)

            async def one() -> str:
                async with gate:
                    return await self._one()

            return list(await asyncio.gather(*(one() for _ in range(n))))

        t = time.perf_counter()
        self.jobs += self.loop.run(many())
        return time.perf_counter() - t

    def start_slow(self) -> tuple[str, Any]:
        """A job whose map takes ~24 s (past the opens and the polls watched): its id once
        listed as running, and its future."""
        ids: list[str] = []
        self.runs += 1

        async def slow() -> str:
            result = await run_on(
                self.be,
                SLOW,
                str(self.slow_src),
                str(self.work / f"slow{self.runs}"),
                workers=1,
                reducers=2,
                params={"sleep": "0.6"},
                on_submit=ids.append,
            )
            return result.job_id

        future = self.loop.start(slow())
        while not ids:
            time.sleep(0.02)
        return ids[0], future

    async def close(self) -> None:
        self.dash.stop()
        await self.serving
        await self.opened.__aexit__(None, None, None)

    def requests_per_poll(self, path: str) -> dict[str, int]:
        time.sleep(FRESH_S + 0.1)
        before = Counter(self.be.table.calls)
        get(self.url + path)
        return dict(Counter(self.be.table.calls) - before)


def phase(bench: Bench, browser: Any, opens: int) -> dict[str, Any]:
    job, future = bench.start_slow()
    row = f'#jobs tr[data-job="{job}"][data-state="running"]'
    open_s = []
    for _ in range(opens):
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        t = time.perf_counter()
        page.goto(bench.url)
        page.locator(row).wait_for(timeout=30_000)
        open_s.append(time.perf_counter() - t)
        context.close()

    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.goto(f"{bench.url}#job={job}")
    page.locator(row).wait_for(timeout=30_000)
    changes, last, t_end = [], None, time.perf_counter() + POLL_WATCH_S
    while time.perf_counter() < t_end:
        polls = page.get_attribute("body", "data-polls")
        if polls != last:
            changes.append(time.perf_counter())
            last = polls
        time.sleep(0.02)
    # The first sample is where the count stood, not a change.
    intervals = [b - a for a, b in itertools.pairwise(changes[1:])]

    future.result(timeout=300)
    page.locator(f'#jobs tr[data-job="{job}"][data-state="succeeded"]').wait_for(timeout=30_000)
    shown = time.time()
    detail = get(f"{bench.url}api/jobs/{job}")
    end_lag = shown - detail["ended"]
    context.close()
    bench.jobs.append(job)

    total = len(bench.jobs)
    last_page = max(0, (total - 1) // 50 * 50)
    api: dict[str, Any] = {}
    # A page of the list no poll has read yet: its finished jobs are read (and kept) now.
    middle = total // 2 // 50 * 50
    time.sleep(FRESH_S + 0.1)
    before = Counter(bench.be.table.calls)
    cold_s, _ = timed_get(f"{bench.url}api/jobs?offset={middle}")
    cold_requests = dict(Counter(bench.be.table.calls) - before)
    for name, path in (
        ("list, first page", "api/jobs"),
        ("list, last page", f"api/jobs?offset={last_page}"),
        ("one finished job", f"api/jobs/{bench.jobs[0]}"),
        ("workers", "api/workers"),
    ):
        times = []
        for _ in range(8):
            time.sleep(FRESH_S + 0.1)  # as a page's poll: after the job list's freshness
            times.append(timed_get(bench.url + path)[0])
        api[name] = quantiles(times)

    seen: list[str] = []
    offset = 0
    while True:
        doc = get(f"{bench.url}api/jobs?offset={offset}&limit=200")
        seen += [j["job"] for j in doc["jobs"]]
        assert all(j["state"] == "succeeded" for j in doc["jobs"]), "a job not succeeded"
        offset += 200
        if offset >= doc["total"]:
            break
    correct = sorted(seen) == sorted(bench.jobs) and len(set(seen)) == len(seen)
    return {
        "finished_jobs": total - 1,
        "open_to_running_s": quantiles(open_s),
        "poll_interval_s": quantiles(intervals),
        "end_to_shown_s": round(end_lag, 3),
        "api_s": api,
        "list_page_first_read_s": round(cold_s, 4),
        "table_requests_list_page_first_read": cold_requests,
        "table_requests_per_list_poll": bench.requests_per_poll("api/jobs"),
        "table_requests_per_detail_poll": bench.requests_per_poll(f"api/jobs/{bench.jobs[0]}"),
        "listed_correctly": correct,
        "listed": len(seen),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--opens", type=int, default=5)
    parser.add_argument("--json", type=Path, default=HERE / "results-dashboard.json")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as work, sync_playwright() as p:
        bench = Bench(Path(work))
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        results: dict[str, Any] = {
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": platform.platform(),
            "phases": [],
        }
        print("baseline: no finished jobs", flush=True)
        results["phases"].append(phase(bench, browser, args.opens))
        print(f"running {args.jobs} jobs", flush=True)
        results["made_s"] = round(bench.finish_jobs(args.jobs), 1)
        print(f"with {len(bench.jobs)} finished jobs", flush=True)
        results["phases"].append(phase(bench, browser, args.opens))
        print(json.dumps(results, indent=2))
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        browser.close()
        bench.loop.run(bench.close())


if __name__ == "__main__":
    main()
