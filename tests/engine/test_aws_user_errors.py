"""User-code mistakes on the AWS backend (the local stack, real `cmr worker` processes): a
deterministic error fails the job in seconds, not a visibility timeout per attempt, and is
said in terms of the user's code."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.errors import JobCodeError, JobFailed
from cmr.settings import AwsSettings

pytestmark = pytest.mark.usefixtures("aws_stack")

HEADER = "import cmr\nclass J(cmr.Job):\n    def map(self, k, line):\n"


@pytest.mark.timeout(50)  # three attempts a 60 s lease apart would take minutes
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "        yield line, 1\n"
            "    def reduce(self, k, vs):\n        raise ValueError('boom')\n",
            "J.reduce raised ValueError: boom",
        ),
        (
            "        yield 'ab'\n    def reduce(self, k, vs):\n        yield k, 1\n",
            "J.map yielded 'ab' (a str)",
        ),
    ],
    ids=["reduce raises", "map yields a str"],
)
@pytest.mark.slow
async def test_a_deterministic_user_error_fails_the_job_in_seconds(
    aws: tuple[Backend, AwsSettings], tmp_path: Path, body: str, expected: str
) -> None:
    be, settings = aws
    job = tmp_path / "j.py"
    job.write_text(HEADER + body)
    src = tmp_path / "in.txt"
    src.write_text("a\nb\nc\n")
    with pytest.raises(JobFailed) as info:
        await run_on(
            be,
            str(job),
            str(src),
            str(tmp_path / "out"),
            reducers=2,
            workers=1,
            visibility_timeout=60,
            aws=settings,
        )
    assert expected in info.value.reason
    assert "/cmr/" not in info.value.reason


async def test_a_job_without_reduce_is_refused_before_anything_is_made(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = aws
    job = tmp_path / "j.py"
    job.write_text(HEADER + "        yield line, 1\n")
    src = tmp_path / "in.txt"
    src.write_text("a\n")
    with pytest.raises(JobCodeError, match=r"J defines no reduce\(\)"):
        await run_on(be, str(job), str(src), str(tmp_path / "out"), workers=1, aws=settings)
    assert await be.queues.list(settings.queue_prefix) == []
