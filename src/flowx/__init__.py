"""FlowX: a durable flow-execution runtime.

A flow is a plan of steps; each step calls a versioned capability. A Durable flow journals
every step boundary, under a fenced lease that makes one node its only writer; when a node
dies, another node's recovery scan finishes its instances from the last commit.

Everything a user needs is importable from here; ``__all__`` is the contract.
"""

from flowx.capability import Capability, CapabilityRegistry, capability
from flowx.clock import Clock, SystemClock
from flowx.engine import RunResult, StepContext
from flowx.errors import (
    CapabilityNotFound,
    DurabilityNotConfigured,
    FlowFailed,
    FlowNotFound,
    FlowXError,
    IdempotencyConflict,
    InputInvalid,
    InstanceNotFound,
    NonDeterminismError,
    NonRetryableError,
    PlanError,
    SerialisationError,
    SettingsError,
)
from flowx.hosting import (
    DurableLease,
    FlowHandle,
    FlowHost,
    HostSettings,
    RecoveryScanResult,
    from_url,
    memory,
    postgres,
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
)
from flowx.plan import Durable, Ephemeral, Plan, Profile, Retry, event, flow
from flowx.stores.errors import (
    DuplicateStep,
    FencedOut,
    JournalUnavailable,
    LeaseLost,
    LeaseUnavailable,
    NotAFlowXStore,
    SchemaTooNew,
    StoreError,
)
from flowx.stores.records import InstanceState, Outcome

__version__ = "0.1.0"

__all__ = [
    "Capability",
    "CapabilityNotFound",
    "CapabilityRegistry",
    "Clock",
    "DuplicateStep",
    "DurabilityNotConfigured",
    "Durable",
    "DurableLease",
    "Ephemeral",
    "EventPublisher",
    "FanOutPublisher",
    "FencedOut",
    "FlowFailed",
    "FlowHandle",
    "FlowHost",
    "FlowNotFound",
    "FlowXError",
    "HostSettings",
    "IdempotencyConflict",
    "InputInvalid",
    "InstanceNotFound",
    "InstanceState",
    "JournalUnavailable",
    "LeaseLost",
    "LeaseUnavailable",
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
    "RecordingPublisher",
    "RecoveryScanResult",
    "RedisStreamsPublisher",
    "Retry",
    "RunResult",
    "SchemaTooNew",
    "SerialisationError",
    "SettingsError",
    "StepContext",
    "StoreError",
    "SystemClock",
    "__version__",
    "capability",
    "event",
    "flow",
    "from_url",
    "memory",
    "postgres",
    "redis_leases",
    "sqlite",
    "with_leases",
]
