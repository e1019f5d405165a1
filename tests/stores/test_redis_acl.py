"""The Redis lease store as a least-privilege ACL user (R9.8), on the real Redis.

Each test makes a user of its own (unique name, deleted at the end) allowed only the lease
store's commands on its own key prefix — the ``ACL SETUSER`` line the README gives — and runs
the lease store's conformance suite as that user; a user lacking a command gets a FlowX
error naming it, not a driver traceback.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

import pytest
from redis import asyncio as aioredis

from flowx.stores.errors import LeaseUnavailable, StorePermissionDenied
from flowx.stores.paired import with_leases
from flowx.stores.postgres import PostgresStores
from flowx.stores.protocols import Stores
from flowx.stores.redis import RedisLeaseStore
from flowx.stores.redis.leases import ACL_COMMANDS
from flowx.testing.conformance.leases import LeaseStoreConformance
from tests.postgres_support import PG_DSN
from tests.redis_support import REDIS_URL, drop_redis_prefix

TTL = timedelta(seconds=30)


async def _admin(*command: str) -> object:
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        return await client.execute_command(*command)
    finally:
        await client.aclose()


async def _user(prefix: str, commands: str) -> tuple[str, str]:
    """A new ACL user for ``prefix``'s lease keys with ``commands``: (name, its URL)."""
    name, password = f"flowx_leases_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    await _admin(
        "ACL", "SETUSER", name, "reset", "on", f">{password}", f"~{prefix}:lease:*",
        "resetchannels", "-@all", *commands.split(),
    )  # fmt: skip
    return name, REDIS_URL.replace("redis://", f"redis://{name}:{password}@")


class TestLeaseStoreAsAclUser(LeaseStoreConformance):
    """R9.8: the whole lease conformance suite passes as a user holding only the documented
    commands on ``<prefix>:lease:*`` (scripts flushed first, so SCRIPT LOAD is exercised)."""

    @pytest.fixture
    async def stores(self, pg_schema: Callable[[], str]) -> AsyncIterator[Stores]:
        prefix = f"flowx-acl-{uuid.uuid4().hex[:12]}"
        name, url = await _user(prefix, ACL_COMMANDS)
        await _admin("SCRIPT", "FLUSH")
        backend = with_leases(
            PostgresStores(PG_DSN, schema=pg_schema()), RedisLeaseStore(url, prefix=prefix)
        )
        try:
            await backend.open()
            try:
                yield backend
            finally:
                await backend.close()
        finally:
            await _admin("ACL", "DELUSER", name)
            await drop_redis_prefix(prefix)


@pytest.mark.parametrize(
    ("missing", "said"),
    [("+hset", "can't run this command"), ("+evalsha", "evalsha")],
)
async def test_a_user_lacking_a_command_gets_a_clear_error(missing: str, said: str) -> None:
    """R9.8: a command the ACL refuses — sent directly or called by a script — is a
    ``StorePermissionDenied`` naming the user and the ACL line, never a redis-py error."""
    prefix = f"flowx-acl-{uuid.uuid4().hex[:12]}"
    name, url = await _user(prefix, ACL_COMMANDS.replace(missing, ""))
    store = RedisLeaseStore(url, prefix=prefix)
    try:
        await store.open()
        with pytest.raises(StorePermissionDenied) as refused:
            await store.acquire(str(uuid.uuid4()), owner="n1", ttl=TTL, now=None)
        message = str(refused.value)
        assert refused.value.login == name
        assert f"Redis user {name!r}" in message and said in message.lower()
        assert f"ACL SETUSER {name} ~{prefix}:lease:*" in message
        assert url.split(":")[2].split("@")[0] not in message  # the password is never shown
    finally:
        await store.close()
        await _admin("ACL", "DELUSER", name)
        await drop_redis_prefix(prefix)


async def test_a_key_outside_the_prefix_is_refused() -> None:
    """R9.8: the user's key pattern confines it to its own prefix's leases."""
    prefix = f"flowx-acl-{uuid.uuid4().hex[:12]}"
    name, url = await _user(prefix, ACL_COMMANDS)
    store = RedisLeaseStore(url, prefix=f"{prefix}-other")
    try:
        await store.open()
        with pytest.raises(StorePermissionDenied, match="no permissions to access"):
            await store.current(str(uuid.uuid4()))
    finally:
        await store.close()
        await _admin("ACL", "DELUSER", name)


async def test_a_password_changed_under_an_open_store_is_an_outage_not_a_wrong_url() -> None:
    """A login refused before the server ever answered is a wrong URL, said at once (a node
    must not wait for ever on it). Once it has answered, a refused login — the password
    changed under a running node — is treated as the store being unavailable: the node keeps
    running and stops writing, as for any outage, instead of failing as misconfigured."""
    prefix = f"flowx-acl-{uuid.uuid4().hex[:12]}"
    name, url = await _user(prefix, ACL_COMMANDS)
    store = RedisLeaseStore(url, prefix=prefix)
    try:
        await store.open()
        assert await store.current(str(uuid.uuid4())) is None  # it answers as this user
        await _admin("ACL", "SETUSER", name, "resetpass", f">{uuid.uuid4().hex}")
        await _admin("CLIENT", "KILL", "USER", name)  # its connections log in again
        with pytest.raises(LeaseUnavailable, match="unavailable") as refused:
            await store.current(str(uuid.uuid4()))
        assert url.split(":")[2].split("@")[0] not in str(refused.value)
    finally:
        await store.close()
        await _admin("ACL", "DELUSER", name)
        await drop_redis_prefix(prefix)
