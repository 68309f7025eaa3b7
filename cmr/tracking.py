"""Each task attempt tracks itself in its row (:mod:`cmr.attempts` reads them).

The start row is written only while the job runs (a paused worker waking after cleanup must
not leave a row behind); the end is an update of a row that still exists, so it cannot
recreate one cleanup deleted. Two writes per attempt: small beside the attempt's shuffle.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

from cmr import clock
from cmr.attempts import MAX_ERROR, MAX_ID, Kind, row_sk
from cmr.backends.base import Backend, Present, Put, Update
from cmr.errors import ConditionFailed
from cmr.failures import headline
from cmr.lifecycle import write_while_running
from cmr.records import job_pk

HOST = socket.gethostname()[:MAX_ID]


class Tracked:
    """One attempt's row: written when it starts, ended once with its outcome."""

    def __init__(
        self, backend: Backend, job_id: str, kind: Kind, task: int, attempt: str, worker: str
    ) -> None:
        self.backend = backend
        self.job_id = job_id
        self.key = (job_pk(job_id), row_sk(kind, task, attempt))
        self.worker = worker
        self.written = False
        self.ended = False

    async def start(self, *, backup: bool = False) -> bool:
        """Write the row, only while the job runs: False if it has ended."""
        fields = {
            "worker": self.worker[:MAX_ID],
            "host": HOST,
            "started": clock.wall(),
            "outcome": "running",
            "backup": backup,
        }
        try:
            await write_while_running(self.backend, self.job_id, Put(*self.key, fields))
        except ConditionFailed:
            return False
        self.written = True
        return True

    async def end(self, outcome: str, error: str = "") -> None:
        """Say how it ended (once): an update of the row if it still exists, so a late end
        never recreates a row the job's cleanup deleted."""
        if not self.written or self.ended:
            return
        self.ended = True
        fields: dict[str, Any] = {"ended": clock.wall(), "outcome": outcome}
        if error.strip():
            fields["error"] = headline(error)[0][:MAX_ERROR]
        with contextlib.suppress(ConditionFailed):
            await self.backend.table.update(Update(*self.key, set_=fields, condition=Present("pk")))
