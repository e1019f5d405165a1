"""Routing and fan-out over shards: the arithmetic the sharded roles share.

Two kinds of fan-out, on purpose. An operator's read (list, count, show by key) asks every
shard and fails if one cannot answer: a partial list would lie. A service's sweep (recovery,
due timers, queued claims, the outbox) asks every shard and goes on with those that answered:
one shard down must not stop the others' work (its instances wait for it; nothing is lost,
since the sweep runs again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable, Sequence
from typing import TypeVar

from flowx.stores.errors import JournalUnavailable
from flowx.stores.placement import shard_of

T = TypeVar("T")
log = logging.getLogger("flowx.stores.sharded")


class Router:
    """Which shard an id lives on: the shard its id names, or shard 0 for an id that was never
    placed (``flowx.stores.placement``)."""

    def __init__(self, count: int) -> None:
        self.count = count

    def shard(self, instance_id: str) -> int:
        index = shard_of(instance_id)
        if index is None:
            return 0
        if index >= self.count:
            raise JournalUnavailable(
                f"instance {instance_id} was placed on shard {index}, but this store has "
                f"{self.count} shards; name every shard, in the same order, on every node"
            )
        return index

    def group(self, instance_ids: Sequence[str]) -> dict[int, list[str]]:
        """The ids by shard, each group in the order given."""
        groups: dict[int, list[str]] = {}
        for iid in instance_ids:
            groups.setdefault(self.shard(iid), []).append(iid)
        return groups


async def every(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Each shard's answer, in shard order; the first failure fails the whole."""
    return list(await asyncio.gather(*calls))


async def answering(calls: Iterable[Awaitable[T]]) -> list[T]:
    """The answers of the shards that could answer; an unreachable shard is logged and left
    out. Raises only when no shard answered."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    answers: list[T] = []
    failures: list[BaseException] = []
    for index, result in enumerate(results):
        if isinstance(result, JournalUnavailable):
            log.warning("shard %d did not answer a sweep; the others go on: %s", index, result)
            failures.append(result)
        elif isinstance(result, BaseException):
            raise result
        else:
            answers.append(result)
    if failures and not answers:
        raise failures[0]
    return answers


async def any_true(calls: Iterable[Awaitable[bool]], timeout: float) -> bool:
    """``True`` as soon as any call says so; ``False`` once every call has said no (or
    failed) or ``timeout`` has passed. For the wake-ups: wake when ANY shard wakes."""
    tasks = {asyncio.ensure_future(call) for call in calls}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while tasks:
            left = deadline - loop.time()
            if left <= 0:
                return False
            done, tasks = await asyncio.wait(
                tasks, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                if not task.cancelled() and task.exception() is None and task.result():
                    return True
        # Every shard said no early (one unreachable fails at once): wait out the rest, as a
        # store that cannot tell would, so the caller does not spin.
        left = deadline - loop.time()
        if left > 0:
            await asyncio.sleep(left)
        return False
    finally:
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def shares(limit: int, count: int, start: int) -> list[int]:
    """``limit`` split over ``count`` shards, the remainder going first to ``start`` and the
    shards after it (a caller rotates ``start``, so no shard is always last)."""
    base, extra = divmod(limit, count)
    return [base + (1 if (i - start) % count < extra else 0) for i in range(count)]
