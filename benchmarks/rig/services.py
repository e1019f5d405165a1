"""The rig's own servers: a throwaway PostgreSQL cluster and, for arms with Redis leases, a
throwaway ``redis-server`` (``tests.support.servers``), each on a free port.

Why its own: arms restart or stop these servers, and the machine's shared PostgreSQL and Redis
are used by other sessions at the same time — they are never touched. PostgreSQL is stopped in
``immediate`` mode (no checkpoint: a crash, as far as clients can tell) and Redis is killed
(it keeps nothing on disk), so every counter it held is gone when it comes back.

Escape hatch: ``FLOWX_CHAOS_PG`` / ``FLOWX_CHAOS_REDIS`` point the rig at existing servers
instead. The rig then cannot restart them, and an arm that needs to refuses to run.
"""

from __future__ import annotations

import os

from tests.support.servers import ThrowawayPostgres, ThrowawayRedis

from flowx.errors import FlowXError


class RigServers:
    """Started by :meth:`start`, gone after :meth:`close`; ``dsn`` and ``redis_url`` are what
    workers connect to."""

    def __init__(self, *, redis: bool) -> None:
        self._pg_env = os.environ.get("FLOWX_CHAOS_PG")
        self._redis_env = os.environ.get("FLOWX_CHAOS_REDIS")
        self.pg: ThrowawayPostgres | None = None
        self.redis: ThrowawayRedis | None = None
        self._want_redis = redis

    def start(self) -> None:
        if self._pg_env is None:
            # fsync on, as a real journal runs; a cluster of its own, so restarts are ours.
            self.pg = ThrowawayPostgres("flowx-chaos-pg-", {"max_connections": "300"})
            self.pg.start()
        if self._want_redis and self._redis_env is None:
            self.redis = ThrowawayRedis()
            self.redis.start()

    @property
    def dsn(self) -> str:
        if self.pg is not None:
            return self.pg.dsn
        assert self._pg_env is not None, "servers not started"
        return self._pg_env

    @property
    def redis_url(self) -> str:
        if self.redis is not None:
            return self.redis.url
        if self._redis_env is None:
            raise FlowXError("this arm has no Redis: RigConfig.redis_leases is off")
        return self._redis_env

    def _own_pg(self) -> ThrowawayPostgres:
        if self.pg is None:
            raise FlowXError("FLOWX_CHAOS_PG is set: the rig does not restart a shared server")
        return self.pg

    def _own_redis(self) -> ThrowawayRedis:
        if self.redis is None:
            raise FlowXError("FLOWX_CHAOS_REDIS is set: the rig does not stop a shared server")
        return self.redis

    def stop_postgres(self) -> None:
        self._own_pg().stop()

    def start_postgres(self) -> None:
        self._own_pg().start()

    def stop_redis(self) -> None:
        self._own_redis().stop()

    def start_redis(self) -> None:
        self._own_redis().start()

    def check_can_restart(self, arm: str) -> None:
        """Before anything runs: an arm that restarts a server needs one of the rig's own."""
        if arm == "postgres_restart":
            self._own_pg()
        if arm in ("redis_restart", "lease_store_outage"):
            self._own_redis()

    def close(self) -> None:
        if self.redis is not None:
            self.redis.stop()
        if self.pg is not None:
            self.pg.destroy()
