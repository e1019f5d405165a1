"""FlowX: a durable flow-execution runtime.

A flow is a plan of steps; each step calls a versioned capability. A Durable flow journals
every step boundary, under a fenced lease that makes one node its only writer; when a node
dies, another node's recovery scan finishes its instances from the last commit.

Everything a user needs is importable from here; ``__all__`` is the contract, and every name
in it is documented (``tests/test_public_api.py``). What a host or a store builds for itself
(``DurableLease``, ``TimerService``, ``RunResult``, the stores' ``FencedOut``,
``DuplicateStep``, ``LeaseLost``) is importable from its own module and not promised here.
"""

from flowx import metrics
from flowx.capability import Capability, CapabilityRegistry, capability
from flowx.clock import Clock, SystemClock
from flowx.engine import CompensationAlert, StepContext
from flowx.errors import (
    CapabilityNotFound,
    DurabilityNotConfigured,
    FlowFailed,
    FlowNotFound,
    FlowXError,
    IdempotencyConflict,
    IllegalState,
    InputInvalid,
    InstanceNotFound,
    JournalNotFound,
    NonDeterminismError,
    NonRetryableError,
    PlanError,
    RequestInvalid,
    SerialisationError,
    SettingsError,
    SignalPayloadInvalid,
    SignalUnknown,
)
from flowx.hosting import (
    AlertSink,
    Archiver,
    FlowHandle,
    FlowHost,
    HostSettings,
    JsonlArchiver,
    LoggingAlertSink,
    RecordingAlertSink,
    RecoveryScanResult,
    ReplayPlan,
    StopOutcome,
    SweepReport,
    from_url,
    memory,
    postgres,
    read_archive,
    redis_leases,
    sqlite,
    with_leases,
)
from flowx.outbox import (
    EventPublisher,
    FanOutPublisher,
    NatsJetStreamPublisher,
    OutboxPublisher,
    PublishFailure,
    PublishResult,
    RabbitMQPublisher,
    RecordingPublisher,
    RedisStreamsPublisher,
    RelayPolicy,
)
from flowx.plan import Durable, Ephemeral, Plan, Profile, Retry, event, flow
from flowx.sealing import Keyring, KeysError, Sensitive, generate_key
from flowx.stores.errors import (
    InstanceFinished,
    JournalUnavailable,
    LeaseUnavailable,
    NotAFlowXStore,
    SchemaTooNew,
    StoreError,
)
from flowx.stores.records import InstanceState, Outcome, SignalReceipt
from flowx.urls import BadURL

__version__ = "0.1.0"

__all__ = [
    "AlertSink",
    "Archiver",
    "BadURL",
    "Capability",
    "CapabilityNotFound",
    "CapabilityRegistry",
    "Clock",
    "CompensationAlert",
    "DurabilityNotConfigured",
    "Durable",
    "Ephemeral",
    "EventPublisher",
    "FanOutPublisher",
    "FlowFailed",
    "FlowHandle",
    "FlowHost",
    "FlowNotFound",
    "FlowXError",
    "HostSettings",
    "IdempotencyConflict",
    "IllegalState",
    "InputInvalid",
    "InstanceFinished",
    "InstanceNotFound",
    "InstanceState",
    "JournalNotFound",
    "JournalUnavailable",
    "JsonlArchiver",
    "Keyring",
    "KeysError",
    "LeaseUnavailable",
    "LoggingAlertSink",
    "NatsJetStreamPublisher",
    "NonDeterminismError",
    "NonRetryableError",
    "NotAFlowXStore",
    "OutboxPublisher",
    "Outcome",
    "Plan",
    "PlanError",
    "Profile",
    "PublishFailure",
    "PublishResult",
    "RabbitMQPublisher",
    "RecordingAlertSink",
    "RecordingPublisher",
    "RecoveryScanResult",
    "RedisStreamsPublisher",
    "RelayPolicy",
    "ReplayPlan",
    "RequestInvalid",
    "Retry",
    "SchemaTooNew",
    "Sensitive",
    "SerialisationError",
    "SettingsError",
    "SignalPayloadInvalid",
    "SignalReceipt",
    "SignalUnknown",
    "StepContext",
    "StopOutcome",
    "StoreError",
    "SweepReport",
    "SystemClock",
    "__version__",
    "capability",
    "event",
    "flow",
    "from_url",
    "generate_key",
    "memory",
    "metrics",
    "postgres",
    "read_archive",
    "redis_leases",
    "sqlite",
    "with_leases",
]
