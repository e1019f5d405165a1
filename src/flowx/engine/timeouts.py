"""One attempt of a capability, bounded by its step timeout and the flow's deadline.

A step's ``timeout`` and the time left to its flow's deadline are two bounds on the same
attempt; the attempt gets the smaller (issue 12 item 4, SPEC §8). Past its own timeout the
attempt fails with ``step.timed_out`` and is retried under the step's policy like any other
failure; past the flow deadline the flow times out and compensates, the running step included.

An ``async`` capability is cancelled. A plain ``def`` runs in a thread, and a thread cannot be
killed: the attempt stops *waiting* for it (the step fails the same way) and the thread is
handed to the executor as abandoned, so the host counts it as stuck until it returns. Its late
result is dropped: the attempt already failed, and a retry or the compensation decides what
happens next.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from concurrent.futures import Executor, Future
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from flowx.capability import Capability
from flowx.clock import Clock
from flowx.engine.stops import StopReached, StopWatch
from flowx.errors import FlowXError
from flowx.tracing import quiet, span

#: The error code of an attempt that ran past its step timeout.
STEP_TIMED_OUT = "step.timed_out"


class StepTimedOut(FlowXError):
    """An attempt ran past its step's ``timeout``; retryable, under the step's policy."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=STEP_TIMED_OUT)


class DeadlineReached(Exception):
    """The flow's deadline passed while the attempt ran; the runner times the flow out."""


@runtime_checkable
class AbandonsThreads(Protocol):
    """An executor that keeps count of the calls nobody waits for any more (stuck threads)."""

    def abandon(self, future: Future[Any]) -> None: ...


def attempt_limit(
    timeout: timedelta | None, deadline_at: datetime | None, clock: Clock
) -> tuple[float | None, bool]:
    """Seconds this attempt may run, and whether the flow deadline (not the step timeout) is
    the nearer bound. ``(None, False)``: unbounded."""
    own = timeout.total_seconds() if timeout is not None else None
    if deadline_at is None:
        return own, False
    left = max((deadline_at - clock.now()).total_seconds(), 0.0)
    if own is None or left < own:
        return left, True
    return own, False


async def invoke_bounded(
    cap: Capability,
    ctx: Any,
    argument: Any,
    executor: Executor | None,
    *,
    limit: float | None,
    by_deadline: bool,
    what: str,
    stop: StopCut | None = None,
) -> Any:
    """Run one attempt of ``cap`` for at most ``limit`` seconds (``None``: no bound).

    Raises ``StepTimedOut`` past the step's own timeout, ``DeadlineReached`` past the flow's
    deadline, ``StopReached`` when an operator's stop that applies to it arrives (``stop``:
    the run's watch, and whether a cancel cuts this attempt or only a terminate does). A sync
    capability's thread is abandoned (never waited for again) when the attempt ends without
    it: on a timeout, a stop, or when the run itself is cancelled (a drain cut short).

    Every attempt — a step's or a compensation's — passes here, so here it is traced: one
    span per attempt (``flowx.step`` / ``flowx.compensate``), a child of the run's.
    """
    with attempt_span(cap, ctx):
        if stop is None:
            return await _attempt(cap, ctx, argument, executor, limit, by_deadline, what)
        watch, by_cancel = stop
        armed = watch.arm(by_cancel=by_cancel)
        try:
            return await _attempt(cap, ctx, argument, executor, limit, by_deadline, what)
        except asyncio.CancelledError:
            request = watch.cut(armed)
            if request is None:
                raise
            raise StopReached(request) from None
        finally:
            watch.disarm(armed)


#: Shared: a ``nullcontext`` holds no state and can be entered any number of times at once.
_NO_SPAN: AbstractContextManager[None] = contextlib.nullcontext()


def attempt_span(cap: Capability, ctx: Any) -> AbstractContextManager[Any]:
    """The span of one attempt, with where it ran as attributes (``flowx.tracing``); none
    for a call with no step context (a bare capability call)."""
    if ctx is None or quiet():
        return _NO_SPAN
    return span(
        "flowx.compensate" if ctx.compensating else "flowx.step",
        {
            "flow": ctx.flow_id,
            "version": ctx.flow_version,
            "instance": ctx.instance_id,
            "step": ctx.step_name,
            "scope": ctx.scope or None,
            "attempt": ctx.attempt,
            "capability": cap.ref,
        },
    )


#: What ``invoke_bounded`` needs to let a stop cut an attempt: the run's watch, and whether
#: a cancel cuts this attempt (a step) or only a terminate does (a compensation).
StopCut = tuple[StopWatch, bool]


def _attempt(
    cap: Capability,
    ctx: Any,
    argument: Any,
    executor: Executor | None,
    limit: float | None,
    by_deadline: bool,
    what: str,
) -> Awaitable[Any]:
    """What one attempt awaits: the capability's own coroutine for the common attempt (an
    ``async def``, no bound), awaited by ``invoke_bounded`` itself (a coroutine less to
    create and pass through on every step); ``_bounded`` for any other."""
    if limit is None and cap.is_async:
        return cap.fn(ctx, argument) if cap.takes_argument else cap.fn(ctx)  # type: ignore[no-any-return]
    return _bounded(cap, ctx, argument, executor, limit, by_deadline, what)


async def _bounded(
    cap: Capability,
    ctx: Any,
    argument: Any,
    executor: Executor | None,
    limit: float | None,
    by_deadline: bool,
    what: str,
) -> Any:
    """``invoke_bounded`` without the stop."""
    # A ``TimeoutError`` the capability raised itself (a socket's, a client library's) is
    # its own failure, not this bound's: each branch tells them apart before naming it late.
    if cap.is_async:
        assert limit is not None  # nosec B101  # invariant: ``_attempt`` awaits it unbounded
        window = asyncio.timeout(limit)
        try:
            async with window:
                return await cap.invoke(ctx, argument, executor)
        except TimeoutError:
            if not window.expired():
                raise
            raise _late(limit, by_deadline, what) from None
    call = cap.prepared(ctx, argument)
    if executor is None:
        # No executor of ours to count stuck threads in: the loop's default one, unbounded
        # waits only (an Ephemeral run with no host, a test).
        running = asyncio.get_running_loop().run_in_executor(None, call)
        if limit is None:
            return await running
        try:
            return await asyncio.wait_for(running, limit)
        except TimeoutError:
            _raise_own(running)
            raise _late(limit, by_deadline, what) from None
    future: Future[Any] = executor.submit(call)
    waiting = asyncio.wrap_future(future)
    try:
        return await asyncio.wait_for(asyncio.shield(waiting), limit)
    except TimeoutError:
        _raise_own(waiting)
        _abandon(executor, future, waiting)
        raise _late(limit or 0.0, by_deadline, what) from None
    except asyncio.CancelledError:
        _abandon(executor, future, waiting)
        raise


def _raise_own(call: asyncio.Future[Any]) -> None:
    """The ``TimeoutError`` the call itself raised, if that is what ended it: its own
    failure, not the bound's. Anything else (a result or another error arriving as the bound
    ran out) is left to the bound, as before."""
    if call.done() and not call.cancelled():
        own = call.exception()
        if isinstance(own, TimeoutError):
            raise own


def _abandon(executor: Executor, future: Future[Any], waiting: asyncio.Future[Any]) -> None:
    # Cancelled, the loop's side of the call no longer expects a result: a thread returning
    # after the loop closed does not try to deliver one to it.
    waiting.cancel()
    if future.cancel():  # never started (the pool was full): nothing is stuck
        return
    if isinstance(executor, AbandonsThreads):
        executor.abandon(future)
    # The call's outcome is nobody's business any more; retrieve it so it is never logged as
    # "exception was never retrieved" when the thread finally returns.
    future.add_done_callback(_swallow)


def _swallow(future: Future[Any]) -> None:
    with contextlib.suppress(BaseException):
        future.exception()


def _late(limit: float, by_deadline: bool, what: str) -> Exception:
    if by_deadline:
        return DeadlineReached(f"{what}: the flow deadline passed while it ran")
    return StepTimedOut(f"{what} ran longer than its timeout ({limit:g}s) and was abandoned")
