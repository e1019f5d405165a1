"""The Redis the tests use (``FLOWX_TEST_REDIS``), and cleanup of a test's keys."""

from __future__ import annotations

import os

REDIS_URL = os.environ.get("FLOWX_TEST_REDIS", "redis://127.0.0.1:6379/0")


async def drop_redis_prefix(prefix: str) -> None:
    from redis import asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=500)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()
