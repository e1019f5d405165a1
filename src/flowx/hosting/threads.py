"""The threads plain-``def`` capabilities run in: daemon threads, with stuck ones counted.

``concurrent.futures.ThreadPoolExecutor`` joins its threads when the interpreter exits, so one
capability hung in a system call keeps a drained worker alive for ever (issue 12 item 5). This
pool's threads are daemons: a thread still inside a capability never blocks the exit.

A thread cannot be killed. When a step gives up on a call (its timeout passed, or its run was
cancelled by a drain), the engine marks the call *abandoned*; the pool counts it as stuck until
it returns, exports the count (``flowx_capability_threads_stuck{node}``) and says so, loudly,
when every thread it may start is stuck — that node can no longer run a sync capability.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

from flowx.metrics import CAPABILITY_THREADS_STUCK

log = logging.getLogger("flowx.threads")

P = ParamSpec("P")
T = TypeVar("T")

_Work = tuple[Future[Any], Callable[[], Any]] | None


class CapabilityThreads(Executor):
    """A bounded pool of daemon threads, started on demand, that counts abandoned calls."""

    def __init__(self, max_workers: int, *, node: str, name: str = "flowx-capability") -> None:
        if max_workers < 1:
            raise ValueError("capability_threads must be at least 1")
        self.max_workers = max_workers
        self._node = node
        self._name = name
        self._queue: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # Notified whenever the stuck count changes (health checks, tests).
        self._changed = threading.Condition(self._lock)
        self._threads: set[threading.Thread] = set()
        self._idle = 0
        self._stuck: set[Future[Any]] = set()
        # The call each thread is in, so ``shutdown(wait=True)`` skips the stuck ones.
        self._current: dict[threading.Thread, Future[Any]] = {}
        self._shutdown = False
        self._numbers = itertools.count(1)
        CAPABILITY_THREADS_STUCK.set(node, 0)

    # -- Executor --------------------------------------------------------------------------

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("the capability threads are shut down")
            self._queue.put((future, lambda: fn(*args, **kwargs)))
            if self._idle > 0:
                self._idle -= 1  # an idle thread takes it
            elif len(self._threads) < self.max_workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{next(self._numbers)}", daemon=True
                )
                self._threads.add(thread)
                thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking work; idle threads end. ``wait`` waits only for calls not abandoned:
        a stuck one would never let it return."""
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    work = self._queue.get_nowait()
                except queue.Empty:
                    break
                if work is not None:
                    work[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for thread in threads:
                if not self._is_stuck(thread):
                    thread.join()

    # -- stuck calls -----------------------------------------------------------------------

    def abandon(self, future: Future[Any]) -> None:
        """Nobody waits for ``future`` any more: count its thread as stuck until it returns."""
        with self._lock:
            if future.done():
                return
            self._stuck.add(future)
            stuck = len(self._stuck)
        CAPABILITY_THREADS_STUCK.set(self._node, stuck)
        future.add_done_callback(self._returned)
        if stuck >= self.max_workers:
            log.error(
                "node %s: all %d capability threads are stuck in calls their steps gave up on; "
                "no sync capability can run here until one returns — restart this worker",
                self._node,
                stuck,
            )
        else:
            log.warning(
                "node %s: a capability thread is stuck in an abandoned call (%d of %d stuck)",
                self._node,
                stuck,
                self.max_workers,
            )

    @property
    def stuck(self) -> int:
        """Threads still inside a call their step abandoned."""
        with self._lock:
            return len(self._stuck)

    @property
    def all_stuck(self) -> bool:
        """Every thread this pool may run is stuck: sync capabilities cannot run here."""
        return self.stuck >= self.max_workers

    def wait_stuck_at_most(self, count: int, timeout: float | None = None) -> bool:
        """Block until at most ``count`` threads are stuck; ``False`` if ``timeout`` passed."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._stuck) <= count, timeout)

    def _returned(self, future: Future[Any]) -> None:
        with self._lock:
            self._stuck.discard(future)
            stuck = len(self._stuck)
            self._changed.notify_all()
        CAPABILITY_THREADS_STUCK.set(self._node, stuck)
        log.info("node %s: a stuck capability thread returned (%d still stuck)", self._node, stuck)

    def _is_stuck(self, thread: threading.Thread) -> bool:
        with self._lock:
            return self._current.get(thread) in self._stuck

    # -- the threads -----------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                break
            future, call = work
            me = threading.current_thread()
            if future.set_running_or_notify_cancel():
                with self._lock:
                    self._current[me] = future
                try:
                    result = call()
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
                with self._lock:
                    self._current.pop(me, None)
            del future, call, work
            with self._lock:
                if self._shutdown:
                    break
                self._idle += 1
        with self._lock, contextlib.suppress(KeyError):
            self._threads.remove(threading.current_thread())


class RunThreads(Executor):
    """One run's view of the node's capability threads: which of its calls still run.

    A run that stops on a journal error may go on here from what the journal holds (the
    same lease, re-read), but never while a call it gave up on is still inside a capability:
    that step would run twice at once."""

    def __init__(self, threads: CapabilityThreads) -> None:
        self._threads = threads
        self._running: set[Future[Any]] = set()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future = self._threads.submit(fn, *args, **kwargs)
        self._running.add(future)
        future.add_done_callback(self._running.discard)
        return future

    def abandon(self, future: Future[Any]) -> None:
        self._threads.abandon(future)

    @property
    def busy(self) -> bool:
        """A call of this run is still inside its capability."""
        return any(not f.done() for f in list(self._running))
