"""``LeaseStore`` on Redis: one hash per instance, every transition one Lua script.

Why Lua: acquire has to read the current holder, compare its expiry and bump the counter as one
step, and a script is the one thing Redis runs atomically without a round trip per field.

The fencing counter lives in the hash, next to the holder. Redis here may keep nothing on disk,
so after a restart every counter is gone. Two things keep the fence safe anyway:

* ``acquire`` takes ``floor`` — the journal's fence as the host last read it — and issues
  ``max(counter, floor) + 1``, so a fresh Redis still issues a token above the journal's;
* the journal raises its fence to the token when the instance is opened or created, and
  refuses a token below it (R2.4). A token issued from a stale floor is refused there and the
  host treats it as a lost race, so a forgotten counter costs a retry, never a write past a fence.

Expiry is decided by the caller's ``now`` (as in every store), never by Redis key expiry. A
released or expired hash is kept for ``retain`` (default seven days) and then left to Redis to
evict: its counter is only an optimisation over the journal's fence from then on.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from redis import asyncio as aioredis
from redis import exceptions as redis_errors

from flowx.stores.errors import LeaseLost, LeaseUnavailable
from flowx.stores.records import Lease

# KEYS[1] lease hash. ARGV: owner, now_ms, expires_ms, floor, keep_ms.
# Returns the new token, or false when a live lease is held (by anyone, this owner included).
_ACQUIRE: Final = """
local v = redis.call('HMGET', KEYS[1], 'token', 'expires')
local token = tonumber(v[1]) or 0
if v[1] and tonumber(v[2]) > tonumber(ARGV[2]) then
  return false
end
local floor = tonumber(ARGV[4])
if floor > token then token = floor end
token = token + 1
redis.call('HSET', KEYS[1], 'token', token, 'owner', ARGV[1], 'expires', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return token
"""
# ARGV: token, now_ms, expires_ms, keep_ms, owner. Returns 1, or 0 when stale, expired or
# released. A hash that is not there at all (Redis restarted and forgot it) is written back
# under the renewer's token: nobody has acquired since, or the hash would exist, and the
# journal's fence still refuses the token if a newer one was ever used there.
_RENEW: Final = """
local v = redis.call('HMGET', KEYS[1], 'token', 'expires')
if not v[1] then
  redis.call('HSET', KEYS[1], 'token', ARGV[1], 'owner', ARGV[5], 'expires', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return 1
end
if v[1] ~= ARGV[1] or tonumber(v[2]) <= tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[1], 'expires', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""
# ARGV: token, now_ms. Ends the lease now if the token is current and live; never deletes.
_RELEASE: Final = """
local v = redis.call('HMGET', KEYS[1], 'token', 'expires')
if v[1] == ARGV[1] and tonumber(v[2]) > tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'expires', ARGV[2])
  return 1
end
return 0
"""

_CONNECTION_ERRORS = (redis_errors.ConnectionError, redis_errors.TimeoutError)
_ATTEMPTS = 3


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


class RedisLeaseStore:
    """Leases with fencing tokens in Redis. Pair it with a journal (``with_leases``): the
    journal is where the fence is enforced."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "flowx",
        retain: timedelta = timedelta(days=7),
        socket_timeout: float = 5.0,
        client: aioredis.Redis | None = None,
    ) -> None:
        self._url = url
        self._prefix = prefix
        self._keep_ms = int(retain.total_seconds() * 1000)
        self._socket_timeout = socket_timeout
        self._client = client
        self._owns_client = client is None
        self._acquire: Any = None
        self._renew: Any = None
        self._release: Any = None

    @property
    def _where(self) -> str:
        """The server, without credentials, for messages."""
        return self._url.split("@")[-1]

    def _keep_ms_for(self, ttl: timedelta) -> int:
        return self._keep_ms + int(ttl.total_seconds() * 1000)

    def describe(self) -> str:
        return f"redis leases at {self._where} (prefix {self._prefix!r})"

    def _key(self, instance_id: str) -> str:
        return f"{self._prefix}:lease:{instance_id}"

    async def open(self) -> None:
        if self._client is None:
            self._client = aioredis.Redis.from_url(
                self._url,
                socket_timeout=self._socket_timeout,
                socket_connect_timeout=self._socket_timeout,
                decode_responses=True,
            )
        # register_script falls back from EVALSHA to EVAL when a restarted Redis forgot it.
        self._acquire = self._client.register_script(_ACQUIRE)
        self._renew = self._client.register_script(_RENEW)
        self._release = self._client.register_script(_RELEASE)
        await self._call(self._client.ping)

    async def close(self) -> None:
        if self._client is not None and self._owns_client:
            await self._client.aclose()
            self._client = None

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if fn is None:
            raise LeaseUnavailable("the Redis lease store is not open; call open() first")
        # A pooled connection is found dead only when used: after a Redis restart, the first
        # command on each fails and the connection reconnects on the next. Retrying is safe
        # for every script here: renew and release are idempotent, and an acquire whose reply
        # was lost finds its own live lease and says "held" — the instance waits one TTL,
        # it never gets two owners.
        for attempt in range(_ATTEMPTS):
            try:
                return await fn(*args, **kwargs)
            except _CONNECTION_ERRORS as exc:
                if attempt + 1 < _ATTEMPTS:
                    await asyncio.sleep(0.02 * 2**attempt)
                    continue
                failure = exc
        error = LeaseUnavailable(
            f"Redis at {self._where} is unavailable "
            f"({type(failure).__name__}: {failure}); retry when it is back"
        )
        raise error from failure

    async def acquire(
        self, instance_id: str, *, owner: str, ttl: timedelta, now: datetime, floor: int = 0
    ) -> Lease | None:
        expires = now + ttl
        keep = self._keep_ms_for(ttl)
        token = await self._call(
            self._acquire,
            keys=[self._key(instance_id)],
            args=[owner, _ms(now), _ms(expires), int(floor), keep],
        )
        if token is None:
            return None
        return Lease(instance_id=instance_id, owner=owner, token=int(token), expires_at=expires)

    async def renew(self, lease: Lease, *, ttl: timedelta, now: datetime) -> Lease:
        expires = now + ttl
        keep = self._keep_ms_for(ttl)
        ok = await self._call(
            self._renew,
            keys=[self._key(lease.instance_id)],
            args=[str(lease.token), _ms(now), _ms(expires), keep, lease.owner],
        )
        if not int(ok):
            raise LeaseLost(
                lease.instance_id,
                lease.token,
                "it expired, was released or a newer lease was issued",
            )
        return Lease(
            instance_id=lease.instance_id, owner=lease.owner, token=lease.token, expires_at=expires
        )

    async def release(self, lease: Lease, *, now: datetime) -> None:
        await self._call(
            self._release, keys=[self._key(lease.instance_id)], args=[str(lease.token), _ms(now)]
        )

    async def current(self, instance_id: str) -> Lease | None:
        client = self._client
        if client is None:
            raise LeaseUnavailable("the Redis lease store is not open; call open() first")
        row = await self._call(client.hmget, self._key(instance_id), ["token", "owner", "expires"])
        if row[0] is None:
            return None
        return Lease(
            instance_id=instance_id, owner=row[1], token=int(row[0]), expires_at=_at(int(row[2]))
        )
