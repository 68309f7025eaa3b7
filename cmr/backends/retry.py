"""Retrying transient failures of any backend call.

botocore already retries throttling and 5xx inside the aws backend; this layer makes the
engine behave the same on every backend (the embedded one injects such faults on
purpose), and covers what botocore gives up on. Only transient errors are retried: a
failed condition, a missing queue, blob, bucket or table, or an unreachable service are
answers, not hiccups (a mistyped bucket took 8 attempts and ~7.5 s to be reported). A
retried write may have been applied the first time (the response was lost): the engine's
conditional writes read back on ConditionFailed to tell "lost" from "won".
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from cmr.backends.base import Backend
from cmr.backends.middleware import Call, Middleware, Proceed, wrap
from cmr.errors import (
    BackendError,
    BlobMissing,
    BucketOrTableMissing,
    ConditionFailed,
    QueueGone,
    Rejected,
    Unreachable,
)

T = TypeVar("T")


def transient(exc: BaseException) -> bool:
    return isinstance(exc, BackendError) and not isinstance(
        exc,
        ConditionFailed | QueueGone | BlobMissing | BucketOrTableMissing | Unreachable | Rejected,
    )


FIRST_WAIT_S = 0.05  # backoff: doubling from this, plus up to JITTER_S, at most MAX_WAIT_S
JITTER_S = 1.0
MAX_WAIT_S = 2.0


def _policy(attempts: int, max_delay_s: float) -> AsyncRetrying:
    return AsyncRetrying(
        retry=retry_if_exception(transient),
        wait=wait_exponential_jitter(initial=FIRST_WAIT_S, max=MAX_WAIT_S, jitter=JITTER_S),
        stop=stop_after_attempt(attempts) | stop_after_delay(max_delay_s),
        reraise=True,
    )


@dataclass(frozen=True)
class Retry(Middleware):
    """Each call retried on transient errors with jittered backoff."""

    attempts: int = 8
    max_delay_s: float = 30.0

    async def around(self, call: Call, proceed: Proceed) -> Any:
        # Nearly every call succeeds at once: its first attempt skips tenacity's machinery
        # (tens of µs a call, which a job's 20,000 small-file reads add up to). A transient
        # failure waits the policy's first backoff and goes on under the policy, for the
        # attempts left (its time bound counts from there).
        try:
            return await proceed(call)
        except Exception as exc:
            # A stream, once read, cannot be sent again: its caller's task is retried.
            if not transient(exc) or self.attempts <= 1 or call.method == "upload_stream":
                raise
        await asyncio.sleep(min(FIRST_WAIT_S + random.uniform(0, JITTER_S), MAX_WAIT_S))
        async for attempt in _policy(self.attempts - 1, self.max_delay_s):
            with attempt:
                return await proceed(call)
        raise AssertionError("unreachable: tenacity re-raises the last error")


def with_retries(backend: Backend, attempts: int = 8, max_delay_s: float = 30.0) -> Backend:
    """The same backend, each call retried on transient errors with jittered backoff."""
    return wrap(backend, Retry(attempts, max_delay_s))


async def retried(fn: Callable[[], Awaitable[T]], attempts: int = 8) -> T:
    """Run one coroutine factory under the same policy (for multi-call steps)."""
    async for attempt in _policy(attempts, 30.0):
        with attempt:
            return await fn()
    raise AssertionError("unreachable: tenacity re-raises the last error")
