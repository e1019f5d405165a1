"""A lease store on Redis (redis-py asyncio, Lua scripts), paired with a SQL journal."""

from flowx.stores.redis.leases import RedisLeaseStore

__all__ = ["RedisLeaseStore"]
