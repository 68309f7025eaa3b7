"""Retrying transient failures of any backend call.

botocore already retries throttling and 5xx inside the aws backend; this layer makes the
engine behave the same on every backend (the embedded one injects such faults on
purpose), and covers what botocore gives up on. Only transient errors are retried: a
failed condition, a missing queue or blob, or an unreachable service are answers, not
hiccups. A retried write may have been applied the first time (the response was lost):
the engine's conditional writes read back on ConditionFailed to tell "lost" from "won".
"""

from __future__ import annotations

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
from cmr.errors import BackendError, BlobMissing, ConditionFailed, QueueGone, Rejected, Unreachable

T = TypeVar("T")


def transient(exc: BaseException) -> bool:
    return isinstance(exc, BackendError) and not isinstance(
        exc, ConditionFailed | QueueGone | BlobMissing | Unreachable | Rejected
    )


def _policy(attempts: int, max_delay_s: float) -> AsyncRetrying:
    return AsyncRetrying(
        retry=retry_if_exception(transient),
        wait=wait_exponential_jitter(initial=0.05, max=2.0),
        stop=stop_after_attempt(attempts) | stop_after_delay(max_delay_s),
        reraise=True,
    )


@dataclass(frozen=True)
class Retry(Middleware):
    """Each call retried on transient errors with jittered backoff."""

    attempts: int = 8
    max_delay_s: float = 30.0

    async def around(self, call: Call, proceed: Proceed) -> Any:
        async for attempt in _policy(self.attempts, self.max_delay_s):
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
