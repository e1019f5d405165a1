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

Expiry is decided by Redis's clock (``TIME``, R9.2) or a ``now`` the caller pins (tests),
never by Redis key expiry. A
released or expired hash is kept for ``retain`` (default seven days) and then left to Redis to
evict: its counter is only an optimisation over the journal's fence from then on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from urllib.parse import urlsplit

from redis import asyncio as aioredis
from redis import exceptions as redis_errors

from flowx.redaction import guard_logs, redact
from flowx.stores.errors import LeaseUnavailable, StorePermissionDenied
from flowx.stores.records import Lease
from flowx.stores.renewal import renew_one
from flowx.urls import BadURL

# Time is Redis's own (TIME) unless the caller pins it (R9.2): a node whose clock runs ahead
# must not see a live lease as expired, nor a node behind it be starved. Scripts may call TIME:
# Redis 5+ replicates a script's effects, not the script.
_NOW: Final = """
local function now_ms(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""
# KEYS[1] lease hash. ARGV: owner, now_ms ('' = Redis's clock), ttl_ms, floor, keep_ms.
# Returns {token, expires_ms}, or false when a live lease is held (by anyone, this owner too).
_ACQUIRE: Final = (
    _NOW
    + """
local now = now_ms(ARGV[2])
local v = redis.call('HMGET', KEYS[1], 'token', 'expires')
local token = tonumber(v[1]) or 0
if v[1] and tonumber(v[2]) > now then
  return false
end
local floor = tonumber(ARGV[4])
if floor > token then token = floor end
token = token + 1
local expires = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'token', token, 'owner', ARGV[1], 'expires', expires)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {token, expires}
"""
)
# KEYS: one lease hash per lease. ARGV: now_ms, ttl_ms, keep_ms, then token and owner for each
# key. Returns the new expiry for each key, or 0 when stale, expired or released. A hash that
# is not there at all (Redis restarted and forgot it) is written back under the renewer's
# token: nobody has acquired since, or the hash would exist, and the journal's fence still
# refuses the token if a newer one was ever used there. One script, one round trip, however
# many leases the node holds (R9.1).
_RENEW_MANY: Final = (
    _NOW
    + """
local now = now_ms(ARGV[1])
local expires = now + tonumber(ARGV[2])
local out = {}
for i, key in ipairs(KEYS) do
  local token, owner = ARGV[2 + 2 * i], ARGV[3 + 2 * i]
  local v = redis.call('HMGET', key, 'token', 'expires')
  if not v[1] then
    redis.call('HSET', key, 'token', token, 'owner', owner, 'expires', expires)
    redis.call('PEXPIRE', key, ARGV[3])
    out[i] = expires
  elseif v[1] ~= token or tonumber(v[2]) <= now then
    out[i] = 0
  else
    redis.call('HSET', key, 'expires', expires)
    redis.call('PEXPIRE', key, ARGV[3])
    out[i] = expires
  end
end
return out
"""
)
# ARGV: token, now_ms. Ends the lease now if the token is current and live; never deletes.
_RELEASE: Final = (
    _NOW
    + """
local now = now_ms(ARGV[2])
local v = redis.call('HMGET', KEYS[1], 'token', 'expires')
if v[1] == ARGV[1] and tonumber(v[2]) > now then
  redis.call('HSET', KEYS[1], 'expires', now)
  return 1
end
return 0
"""
)

_CONNECTION_ERRORS = (redis_errors.ConnectionError, redis_errors.TimeoutError)
#: What Redis says when an ACL refuses a command or key: NOPERM for one sent directly, and
#: this for one a script calls (R9.8).
_SCRIPT_REFUSED: Final = "The user executing the script can't"
#: The commands and keys the lease store needs, for the message of a refusal (README,
#: Security: Database roles, has the whole ``ACL SETUSER`` line).
ACL_COMMANDS: Final = "+ping +time +hmget +hset +pexpire +evalsha +script|load +select"
#: What ``ssl`` says when verification, not the network, failed.
_TLS_REFUSED = re.compile(
    r"CERTIFICATE_VERIFY_FAILED|certificate verify failed|alert unknown ca|"
    r"alert (?:bad|unsupported) certificate|alert certificate (?:expired|revoked|required)|"
    r"PEM lib"
)
_ATTEMPTS = 3


def _ms(moment: datetime | None) -> int | str:
    """A pinned time in milliseconds, or '' for Redis's own clock."""
    return "" if moment is None else int(moment.timestamp() * 1000)


def _ttl_ms(ttl: timedelta) -> int:
    return int(ttl.total_seconds() * 1000)


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
        self._renew_many: Any = None
        self._release: Any = None
        #: Whether the server has answered once: a login refused before that is a wrong URL
        #: (said at once); after it, a password changed under a running node is an outage.
        self._answered = False

    @property
    def _where(self) -> str:
        """The server, without credentials, for messages."""
        return redact(self._url.split("@")[-1])

    def _keep_ms_for(self, ttl: timedelta) -> int:
        return self._keep_ms + int(ttl.total_seconds() * 1000)

    def describe(self) -> str:
        return f"redis leases at {self._where} (prefix {self._prefix!r})"

    def _key(self, instance_id: str) -> str:
        return f"{self._prefix}:lease:{instance_id}"

    async def open(self) -> None:
        guard_logs("redis", "flowx")  # R9.8: a driver's line never shows the URL's secrets
        if self._client is None:
            self._client = aioredis.Redis.from_url(
                self._url,
                socket_timeout=self._socket_timeout,
                socket_connect_timeout=self._socket_timeout,
                decode_responses=True,
            )
        # register_script falls back from EVALSHA to EVAL when a restarted Redis forgot it.
        self._acquire = self._client.register_script(_ACQUIRE)
        self._renew_many = self._client.register_script(_RENEW_MANY)
        self._release = self._client.register_script(_RELEASE)
        try:
            await self._call(self._client.ping)
            self._answered = True
        except LeaseUnavailable as exc:
            # TLS the URL's files cannot set up (a server certificate from another CA, a
            # file that is not there) is not an outage: no retry mends it. Over TCP, "no such
            # file" can only be one of the certificate files.
            cause = str(exc.__cause__)
            missing = self._url.startswith("rediss://") and "No such file or directory" in cause
            if not (missing or _TLS_REFUSED.search(cause)):
                raise
            raise BadURL(
                f"Redis lease store {redact(self._url)!r}: TLS could not be set up "
                f"({exc.__cause__}); check ssl_ca_certs, ssl_certfile and ssl_keyfile",
                url=redact(self._url),
            ) from exc
        except redis_errors.ResponseError as exc:
            raise self._refused(exc) from exc

    def _refused(self, exc: redis_errors.RedisError) -> BadURL:
        """Not a fault a retry mends: a wrong password, a database index the server does not
        have. Said once, with the URL's secrets redacted."""
        return BadURL(
            f"Redis lease store {redact(self._url)!r} refused the connection: "
            f"{redact(str(exc), secrets_of=(self._url,), limit=None)}; "
            "fix the URL (database index, credentials)",
            url=redact(self._url),
        )

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
            except redis_errors.ResponseError as exc:
                if isinstance(exc, redis_errors.NoPermissionError) or _SCRIPT_REFUSED in str(exc):
                    raise self._denied(exc) from exc
                raise
            except _CONNECTION_ERRORS as exc:
                if isinstance(exc, redis_errors.AuthenticationError) and not self._answered:
                    # redis-py makes a refused login a ConnectionError; no retry mends it,
                    # and a node opening that took it for an outage would wait for ever.
                    raise self._refused(exc) from exc
                if attempt + 1 < _ATTEMPTS:
                    await asyncio.sleep(0.02 * 2**attempt)
                    continue
                failure = exc
        error = LeaseUnavailable(
            f"Redis at {self._where} is unavailable "
            f"({type(failure).__name__}: "
            f"{redact(str(failure), secrets_of=(self._url,), limit=None)}); retry when it is back"
        )
        raise error from failure

    def _denied(self, exc: redis_errors.ResponseError) -> StorePermissionDenied:
        """An ACL refusal as a FlowX error naming the user and the ACL it needs (R9.8)."""
        login = urlsplit(self._url).username or "default"
        refused = " ".join(str(exc).split())
        return StorePermissionDenied(
            f"Redis user {login!r} at {self._where} was refused: {refused}. The lease store "
            f"needs: ACL SETUSER {login} ~{self._prefix}:lease:* resetchannels -@all "
            f"{ACL_COMMANDS} (README, Security: Database roles)",
            login=login,
            refused=refused,
        )

    async def acquire(
        self,
        instance_id: str,
        *,
        owner: str,
        ttl: timedelta,
        now: datetime | None,
        floor: int = 0,
    ) -> Lease | None:
        keep = self._keep_ms_for(ttl)
        granted = await self._call(
            self._acquire,
            keys=[self._key(instance_id)],
            args=[owner, _ms(now), _ttl_ms(ttl), int(floor), keep],
        )
        if granted is None:
            return None
        token, expires = granted
        return Lease(
            instance_id=instance_id, owner=owner, token=int(token), expires_at=_at(int(expires))
        )

    async def renew(self, lease: Lease, *, ttl: timedelta, now: datetime | None) -> Lease:
        return await renew_one(
            self,
            lease,
            ttl=ttl,
            now=now,
            lost="it expired, was released or a newer lease was issued",
        )

    async def renew_many(
        self, leases: Sequence[Lease], *, ttl: timedelta, now: datetime | None
    ) -> Sequence[Lease | None]:
        if not leases:
            return []
        args: list[Any] = [_ms(now), _ttl_ms(ttl), self._keep_ms_for(ttl)]
        for lease in leases:
            args.extend((str(lease.token), lease.owner))
        expiries = await self._call(
            self._renew_many, keys=[self._key(lease.instance_id) for lease in leases], args=args
        )
        return [
            dataclasses.replace(lease, expires_at=_at(int(ms))) if int(ms) else None
            for lease, ms in zip(leases, expiries, strict=True)
        ]

    async def release(self, lease: Lease, *, now: datetime | None) -> None:
        await self._call(
            self._release, keys=[self._key(lease.instance_id)], args=[str(lease.token), _ms(now)]
        )

    def bound_round_trips(self, seconds: float) -> None:
        """``RoundTripBound``: every command's reply is awaited ``seconds`` at most (R9.1)."""
        self._socket_timeout = min(self._socket_timeout, seconds)

    async def store_clock(self) -> list[tuple[str, datetime]]:
        """``StoreClock``: lease expiry is decided by this server's ``TIME``."""
        client = self._client
        if client is None:
            raise LeaseUnavailable("the Redis lease store is not open; call open() first")
        seconds, micros = await self._call(client.time)
        return [(f"Redis at {self._where}", _at(int(seconds) * 1000 + int(micros) // 1000))]

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
