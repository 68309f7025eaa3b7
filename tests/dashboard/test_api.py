"""`cmr dashboard`'s JSON API on the local AWS stack: a real job submitted and left alone, a
real worker taking it, the API following it from submitted to running to cleaned up, agreeing
with `cmr status --json`; and the requests it refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard.live import SLOW, cmr, dashboard, done, get, lines_file, stack_store, until

pytestmark = pytest.mark.usefixtures("aws_stack")
LINES = 40


def test_the_api_follows_a_job_to_its_end(tmp_path: Path) -> None:
    with stack_store() as s:
        job = s.submit(SLOW, lines_file(tmp_path, LINES), "--param", "sleep=0.1")
        with dashboard(s.url) as url:
            code, listed = get(url + "api/jobs")
            assert code == 200 and listed["store"] == s.url
            (row,) = listed["jobs"]
            assert row["job"] == job and row["state"] == "running"
            assert row["progress"]["maps_done"] == 0 and row["ended"] is None
            _, doc = get(f"{url}api/jobs/{job}")
            assert doc["steps"][0]["attempts"] == []  # no worker yet

            worker = s.worker()
            try:

                def running() -> dict[str, Any] | None:
                    _, d = get(f"{url}api/jobs/{job}")
                    tries = d["steps"][0]["attempts"]
                    return (
                        d if any(a["kind"] == "map" and a["ended"] is None for a in tries) else None
                    )

                doc = until("the map attempt running", running)
                (busy,) = [a["worker"] for a in doc["steps"][0]["attempts"] if a["kind"] == "map"]
                _, seen = get(url + "api/workers")
                assert busy in [w["worker"] for w in seen["workers"]]

                def ended() -> dict[str, Any] | None:
                    _, d = get(f"{url}api/jobs/{job}")
                    return d if d["state"] == "succeeded" and d.get("cleaned") else None

                doc = until("the job ended and cleaned up", ended)
            finally:
                done(worker)
            (step,) = doc["steps"]
            outcomes = {(a["kind"], a["task"], a["outcome"]) for a in step["attempts"]}
            assert ("map", 0, "committed") in outcomes
            assert {("reduce", p, "committed") for p in range(4)} <= outcomes
            assert all(a["worker"] == busy for a in step["attempts"])
            assert doc["counters"] == {"seen": {"lines": LINES}}
            assert doc["records_in"] == LINES and doc["throughput_mb_s"] > 0

            mine = json.loads(done(cmr("status", job, "--json", "--store", s.url)))
            for key in ("state", "started", "ended", "duration_s", "progress", "records_out"):
                assert doc[key] == mine[key], key
            _, listed = get(url + "api/jobs")
            (row,) = listed["jobs"]
            assert row["state"] == "succeeded" and row["ended"] == mine["ended"]
            _, seen = get(url + "api/workers")
            (w,) = [w for w in seen["workers"] if w["worker"] == busy]
            assert w["tasks_done"] >= 1 + 4 and w["stopped"] is not None
            # The cost so far, as `cmr status` prices the same usage rows (the worker stopped:
            # its rows are final).
            _, final = get(f"{url}api/jobs/{job}")
            assert final["cost"]["total_usd"] > 0 and final["cost"]["worker_seconds"] > 0
            assert final["cost"] == mine["cost"]


def test_what_the_api_refuses(tmp_path: Path) -> None:
    with stack_store() as s:
        job = s.submit(SLOW, lines_file(tmp_path, 3))
        with dashboard(s.url) as url:
            # A page elsewhere whose name resolves to 127.0.0.1 (DNS rebinding) gets nothing.
            assert get(url + "api/jobs", host="attacker.example")[0] == 421
            assert get(url + "api/jobs", host="localhost")[0] == 200
            code, doc = get(url + "api/jobs?limit=0")
            assert code == 400 and "limit" in doc["error"]
            assert get(url + "api/jobs?offset=-1")[0] == 400
            assert get(url + "api/jobs?state=bogus")[0] == 400
            assert get(url + "api/jobs/not%20a%20job")[0] == 404
            code, doc = get(url + "api/jobs/20260101-000000-0000000000000000")
            assert code == 404 and "no job" in doc["error"]
            assert get(url + "api/jobs?state=running")[1]["jobs"][0]["job"] == job
        # Told to listen beyond loopback: it does, says so, and answers any name.
        said: list[str] = []
        with dashboard(s.url, "--host", "0.0.0.0", "--allow-remote", stderr=said) as url:
            assert get(url + "api/jobs", host="dashboard.example")[0] == 200
        assert "warning: listening on 0.0.0.0, not a loopback address" in said[0]
        # Nobody served it: cancelled and cleaned up here, so nothing is left.
        done(cmr("cancel", job, "--store", s.url))
        done(cmr("cleanup", job, "--store", s.url))
