"""Host settings, validated when the host starts rather than on the first request (R3.6).

One settings model (pydantic-settings), for every setting the same precedence: arguments
(``FlowHost(settings=...)``, a ``flowx worker`` flag) > ``FLOWX_<NAME>`` environment
variables > ``[tool.flowx]`` in the ``pyproject.toml`` of the working directory > defaults.
None of these is a safety setting — what stops a paused node from corrupting an instance is
the fencing token, which no value here weakens — but bad values make recovery slow or noisy,
so they are refused early with the reason and where the value came from.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    PyprojectTomlConfigSettingsSource,
    SettingsConfigDict,
)

from flowx.durations import parse_duration
from flowx.errors import SettingsError
from flowx.sealing import Keyring, KeysError
from flowx.validation import problems

_DURATIONS = (
    "lease_ttl",
    "lease_renewal_interval",
    "recovery_scan_interval",
    "shutdown_drain_timeout",
    "timer_poll_interval",
    "max_clock_offset",
    "retention_sweep_interval",
    "metrics_interval",
)


class HostSettings(BaseSettings):
    """Every tunable of a node. Durations accept ``"30s"``, ``"1h30m"``, seconds, or a
    ``timedelta``."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        env_prefix="FLOWX_",
        env_ignore_empty=True,  # FLOWX_LEASE_TTL= (set but empty) means "not set"
        pyproject_toml_table_header=("tool", "flowx"),
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then ``FLOWX_*``, then ``[tool.flowx]`` in ``./pyproject.toml``; no
        dotenv or secrets directory (not asked for, so not read)."""
        return (init_settings, env_settings, PyprojectTomlConfigSettingsSource(settings_cls))

    lease_ttl: timedelta = timedelta(seconds=30)
    #: ``None`` means a third of the TTL (R3.2).
    lease_renewal_interval: timedelta | None = None
    recovery_scan_interval: timedelta = timedelta(seconds=10)
    #: The scan interval varies by ± this fraction, so a fleet started by one rollout does
    #: not sweep in lockstep for ever.
    recovery_scan_jitter: float = 0.25
    recovery_scan_batch_size: int = 100
    max_concurrent_recoveries: int = 32
    max_concurrent_flows: int = 1_000
    #: Queued instances a node claims beyond its free flow slots (R6.4): leased, history
    #: read, each starting the moment a slot frees rather than a claim's round trip later.
    #: They hold their leases meanwhile, so other workers pass them over. 0 (the default)
    #: claims only what can start at once: a node that prefetches claims more often, and
    #: under a slow disk a claim can outlast its deadline (its outcome then unknown, what it
    #: took waits a lease TTL for recovery).
    queue_prefetch: int = 0
    #: CPython's young-generation collection threshold while this node is open, if that
    #: raises it (``flowx.hosting.collector``): at CPython's 700, the bursts of objects a
    #: group commit's answer sets off make collections ~10 % of a busy node's step path.
    #: 0 leaves the process's garbage collector as it is.
    gc_threshold: int = Field(default=10_000, ge=0)
    #: Threads that run plain-``def`` capabilities (``async def`` ones need none).
    capability_threads: int = 64
    shutdown_drain_timeout: timedelta = timedelta(seconds=30)
    #: Takeovers in a row without a step commit before the frontier step is failed as poison.
    max_resumes_without_progress: int = 10
    #: How often the timer service asks for due instances when it knows of none sooner. A
    #: wait sealed on this node wakes on time regardless; this bounds how late a wait sealed
    #: on another node is noticed.
    timer_poll_interval: timedelta = timedelta(seconds=1)
    timer_batch_size: int = 100
    #: The furthest this node's clock may be from a store's before it refuses to start
    #: (R9.2); ``None`` means a third of the TTL, the skew the design tolerates (SPEC §8).
    max_clock_offset: timedelta | None = None
    #: Ephemeral results a node keeps for ``FlowHost.handle(id).result()``, the oldest
    #: dropped first: a long-lived worker runs any number of them. The handle ``start``
    #: returned holds its own result regardless.
    ephemeral_results_kept: int = 1_000
    #: This node's name in lease rows and log lines; ``None``: host:pid:random.
    node_id: str | None = None
    #: Whether this node sweeps for instances a dead node left (R3.3). A node that only
    #: starts flows (a web front end, a CLI command) may leave recovery to the workers.
    recovery: bool = True
    #: Whether this node wakes instances whose sleep or signal timeout is due.
    timers: bool = True
    #: Whether an idle worker is told at once when another process makes an instance
    #: runnable (a start, a signal, a child's end, a hand-back): PostgreSQL LISTEN/NOTIFY,
    #: SQLite ``data_version``. Off, such work waits for the next sweep. Turn it off behind a
    #: pooler that cannot LISTEN (PgBouncer in transaction mode).
    wakeups: bool = True
    #: Outbox events claimed per publish round when the host runs a publisher (R5.2).
    outbox_batch_size: int = 500
    #: Whether this node sweeps ended instances past their retention window (R2.13), one
    #: node at a time, every ``retention_sweep_interval``. A node that only starts flows
    #: (a web front end, a CLI command) may leave it to the workers.
    retention: bool = True
    retention_sweep_interval: timedelta = timedelta(hours=1)
    #: Instances a sweep reads (and archives, and deletes) per round trip.
    retention_page_size: int = 500
    #: Where the built-in archiver writes ``.jsonl.gz`` files before a sweep deletes;
    #: ``None``: instances are deleted without an archive (unless the host was given one).
    retention_archive_dir: str | None = None
    #: Serve Prometheus metrics on ``http://metrics_host:metrics_port/metrics`` while the
    #: node is open (needs ``flowx-runtime[prometheus]``); ``None``: not served. 0 binds any free
    #: port (the log line says which).
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    #: The address ``/metrics`` is bound to: loopback unless told otherwise.
    metrics_host: str = "127.0.0.1"
    #: How often the gauges that are read, not counted (in flight, leases, outbox backlog,
    #: journal up), are sampled while metrics are served.
    metrics_interval: timedelta = timedelta(seconds=10)
    #: The HTTP API's bearer token with every right (start, signal, cancel, terminate,
    #: replay, retry a dead letter); ``FLOWX_API_TOKEN``. With neither token set the API
    #: asks for none, and ``flowx serve`` refuses any address but loopback.
    api_token: SecretStr | None = None
    #: A bearer token that may only read (list, show, steps, result, outbox, health).
    api_read_token: SecretStr | None = None
    #: AES-256 keys that seal sensitive members at rest (R9.8), ``"id:base64,..."``: the
    #: first seals new writes, all open older ones (rotation); ``flowx keys generate``
    #: makes one. ``FLOWX_ENCRYPTION_KEYS``. A flow with sensitive members needs them.
    encryption_keys: SecretStr | None = None

    @field_validator(*_DURATIONS, mode="before")
    @classmethod
    def _duration(cls, value: Any, info: Any) -> Any:
        if value is None:
            return None
        try:
            return parse_duration(value, what=info.field_name)
        except ValueError as exc:
            raise ValueError(str(exc)) from exc

    @model_validator(mode="after")
    def _coherent(self) -> HostSettings:
        ttl = self.lease_ttl.total_seconds()
        if ttl < 1:
            raise ValueError("lease_ttl must be at least 1s")
        renew = self.renewal_interval.total_seconds()
        if not 0 < renew <= ttl / 2:
            raise ValueError(
                f"lease_renewal_interval ({renew}s) must be above 0 and at most half of "
                f"lease_ttl ({ttl}s), or a single late renewal loses the lease; the default "
                "is a third"
            )
        if self.recovery_scan_interval.total_seconds() <= 0:
            raise ValueError("recovery_scan_interval must be above 0")
        if self.timer_poll_interval.total_seconds() <= 0:
            raise ValueError("timer_poll_interval must be above 0")
        if self.metrics_interval.total_seconds() < 0.1:
            raise ValueError("metrics_interval must be at least 0.1s")
        if self.retention_sweep_interval.total_seconds() < 1:
            raise ValueError("retention_sweep_interval must be at least 1s")
        if not 0 <= self.recovery_scan_jitter < 1:
            raise ValueError("recovery_scan_jitter is a fraction in [0, 1)")
        if self.queue_prefetch < 0:
            raise ValueError("queue_prefetch must be at least 0")
        for name in (
            "recovery_scan_batch_size",
            "max_concurrent_recoveries",
            "max_concurrent_flows",
            "capability_threads",
            "max_resumes_without_progress",
            "timer_batch_size",
            "ephemeral_results_kept",
            "outbox_batch_size",
            "retention_page_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        tokens = [
            t.get_secret_value() for t in (self.api_token, self.api_read_token) if t is not None
        ]
        if any(len(t) < 16 for t in tokens):
            # The value itself is never echoed: it is a secret even when it is too short.
            raise ValueError(
                "api_token and api_read_token must be at least 16 characters; make one with "
                "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
            )
        if len(tokens) == 2 and tokens[0] == tokens[1]:
            raise ValueError("api_read_token must differ from api_token, or reading is admin")
        if self.encryption_keys is not None:
            self.keyring  # noqa: B018 - parsed now, so a bad key stops the node at start-up
        return self

    @functools.cached_property
    def keyring(self) -> Keyring | None:
        """The parsed ``encryption_keys`` (a malformed key names itself, never its value)."""
        if self.encryption_keys is None:
            return None
        try:
            return Keyring.parse(self.encryption_keys.get_secret_value())
        except KeysError as exc:
            raise ValueError(exc.message) from None

    @property
    def renewal_interval(self) -> timedelta:
        """How often leases are renewed: ``lease_renewal_interval``, or a third of the TTL."""
        return self.lease_renewal_interval or self.lease_ttl / 3

    @property
    def clock_offset_limit(self) -> timedelta:
        """How far this node's clock may be off the store's before it refuses durable work
        (R9.2): ``max_clock_offset``, or a third of the TTL."""
        return self.max_clock_offset if self.max_clock_offset is not None else self.lease_ttl / 3

    @property
    def round_trip_timeout(self) -> float:
        """No store round trip waits longer than half the TTL (R9.1). Not a third: under a
        slow disk a PostgreSQL commit waits for the flush under way and then for its own,
        so an fsync of TTL/5 makes every write take 0.4 TTL (measured), and a deadline of
        TTL/3 would cut every write of a healthy, merely slow journal."""
        return self.lease_ttl.total_seconds() / 2

    def replace(self, **changes: Any) -> HostSettings:
        """These settings with ``changes`` applied, validated again as a whole (unlike
        ``model_copy``, which would let an incoherent combination through)."""
        try:
            return type(self).model_validate({**self.model_dump(), **changes})
        except ValidationError as exc:
            found = problems(exc, root="settings", field_label=False)
        # Raised outside the ``except``: pydantic's own text quotes every input, an API token
        # among them, and a chained or context exception is printed with a traceback (R9.8).
        raise SettingsError(f"invalid FlowX host settings ({found})")

    @classmethod
    def load(cls, **overrides: Any) -> HostSettings:
        """Build from ``overrides`` (``None`` values ignored), then ``FLOWX_<NAME>``
        environment variables, then ``[tool.flowx]`` in ``pyproject.toml``, then defaults.

        Raises ``SettingsError`` naming each bad setting and where to fix it.
        """
        given = {k: v for k, v in overrides.items() if v is not None}
        try:
            return cls(**given)
        except ValidationError as exc:
            found = problems(exc, root="settings", field_label=False)
        # Not chained to pydantic's error: its text quotes the inputs, secrets included (R9.8).
        raise SettingsError(
            f"invalid FlowX host settings ({found}); fix the argument, the FLOWX_* "
            "environment variable or [tool.flowx] in pyproject.toml"
        )

    def resolved(self) -> dict[str, Any]:
        """Every setting with its value, durations as seconds: what ``flowx doctor`` prints."""
        out: dict[str, Any] = {}
        for name, value in self.model_dump().items():
            out[name] = value.total_seconds() if isinstance(value, timedelta) else value
        return out
